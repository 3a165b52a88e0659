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

    /// The lock's name.
    name: String,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    name: &'a str,
    held: bool,
    owner: Option<String>,
    remaining_ms: Option<u64>,
    last_token: Option<u64>,
}

pub(crate) async fn status(opts: StatusOpts) -> u8 {
    let url = opts.store.url();
    let described = describe(&url, &opts.name).await;
    let status = match described {
        Ok(s) => s,
        Err(e) => return fail(&format!("cannot inspect {:?}", opts.name), &e),
    };
    let report = Report {
        name: &opts.name,
        held: status.held,
        owner: status.owner.clone(),
        remaining_ms: status
            .remaining
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        last_token: status.last_token,
    };
    if opts.json {
        match serde_json::to_string(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("dlock: {e}");
                return exit::SOFTWARE;
            }
        }
        return 0;
    }
    let mut line = format!("{:?}: ", opts.name);
    if status.held {
        line.push_str("held");
        if let Some(owner) = &status.owner {
            line.push_str(&format!(" by {owner}"));
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
    println!("{line}");
    0
}

/// Asks the backend the URL names, with the backend's own inspection call.
async fn describe(url: &str, name: &str) -> dlock::Result<LockStatus> {
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme {
        #[cfg(any(feature = "mysql", feature = "sqlite"))]
        "mysql" | "mariadb" | "sqlite" => {
            dlock_sql::SqlProvider::connect(url)
                .await?
                .describe(name)
                .await
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => {
            dlock_redis::RedisProvider::connect(url)
                .await?
                .describe(name)
                .await
        }
        #[cfg(feature = "zookeeper")]
        "zk" => {
            dlock_zookeeper::ZkProvider::connect(url)
                .await?
                .describe(name)
                .await
        }
        _ => {
            let _ = name;
            // Validates the URL (and gives the usual message for unknown schemes).
            dlock::connect(url).await?;
            Err(dlock::Error::unsupported(
                "memory",
                "inspection (a memory:// store lives inside one process)",
            ))
        }
    }
}
