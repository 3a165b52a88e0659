//! `dlock status`: what the store records about a lock.

use clap::Args;
use dlock::LockStatus;
use serde::Serialize;

use crate::{StoreOpts, exit, fail};

/// Options of `dlock status`.
#[derive(Debug, Args)]
pub struct StatusOpts {
    #[command(flatten)]
    store: StoreOpts,

    /// Print JSON instead of a sentence.
    #[arg(long)]
    json: bool,

    /// Exit 0 if the lock is held and 1 if it is free (as `test`), so a script need not parse
    /// the output; without it, 0 either way.
    #[arg(long)]
    check: bool,

    /// The lock's name.
    name: String,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    name: &'a str,
    held: bool,
    kind: Option<String>,
    holders: &'a [String],
    remaining_ms: Option<u64>,
    last_token: Option<u64>,
}

pub(crate) async fn status(opts: StatusOpts) -> u8 {
    let url = match opts.store.url_or_status() {
        Ok(u) => u,
        Err(code) => return code,
    };
    let described = describe(&url, &opts.name).await;
    let status = match described {
        Ok(s) => s,
        Err(e) => return fail(&format!("cannot inspect {:?}", opts.name), &e),
    };
    let report = Report {
        name: &opts.name,
        held: status.is_held(),
        kind: status.kind.map(|k| k.to_string()),
        holders: &status.holders,
        remaining_ms: status
            .remaining
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        last_token: status.last_token,
    };
    let code = if opts.check && !report.held { 1 } else { 0 };
    if opts.json {
        match serde_json::to_string(&report) {
            Ok(text) => say!("{text}"),
            Err(e) => {
                eprintln!("dlock: {e}");
                return exit::SOFTWARE;
            }
        }
        return code;
    }
    let mut line = format!("{:?}: ", opts.name);
    if let Some(kind) = status.kind {
        line.push_str(&format!("held ({kind})"));
        if !status.holders.is_empty() {
            line.push_str(&format!(" by {}", status.holders.join(", ")));
        }
        if let Some(left) = status.remaining {
            line.push_str(&format!(", {:.1} s left", left.as_secs_f64()));
        }
    } else {
        line.push_str("free");
    }
    match status.last_token {
        Some(t) => line.push_str(&format!(", last fencing token {t}")),
        None => line.push_str(", no fencing token recorded"),
    }
    say!("{line}");
    code
}

/// Asks the store the URL names, through the facade.
async fn describe(url: &str, name: &str) -> dlock::Result<LockStatus> {
    dlock::connect(url).await?.describe(name).await
}
