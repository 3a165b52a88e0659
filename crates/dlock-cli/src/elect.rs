//! `dlock elect`: a command that runs only while this process leads an election, or the
//! leaders of an election as they change.

use std::ffi::OsString;
use std::io::Write;

use clap::Args;
use dlock::LockOptions;
use tokio::signal::unix::{SignalKind, signal};

use crate::run::{HoldOpts, RunOpts, run_as};
use crate::{exit, fail};

/// Options of `dlock elect`.
#[derive(Debug, Args)]
pub struct ElectOpts {
    #[command(flatten)]
    hold: HoldOpts,

    /// Print the leader of the election and then each change (a new leader, or its new
    /// proposal), one line each: the term and the proposal (escaped as a Rust string's
    /// content, so a newline in it prints as `\n`), or `none` when nobody leads; as `etcdctl
    /// elect -l`. Runs until interrupted; campaigns for nothing.
    #[arg(
        long,
        short = 'l',
        conflicts_with_all = [
            "proposal", "command", "wait", "no_wait", "lease", "signal", "kill_after",
            "lock_delay", "conflict_exit_code",
        ]
    )]
    observe: bool,

    /// The election's name.
    name: String,

    /// What this campaigner tells the others while it leads (default: the host name and
    /// dlock's pid, `host:pid`).
    proposal: Option<String>,

    /// The command and its arguments, after `--`: it runs while this process leads (in the
    /// environment of `dlock run`: the term in DLOCK_FENCING_TOKEN), and is stopped as `dlock
    /// run` stops it when the leadership ends, before anyone else can lead.
    #[arg(
        last = true,
        value_name = "COMMAND",
        required_unless_present = "observe"
    )]
    command: Vec<OsString>,
}

/// How long `--observe` waits before it asks again after a failure a retry may fix.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) async fn elect(opts: ElectOpts) -> u8 {
    if opts.observe {
        return observe(&opts).await;
    }
    let proposal = opts.proposal.unwrap_or_else(|| {
        let host = nix::unistd::gethostname().map_or_else(
            |_| "localhost".to_owned(),
            |h| h.to_string_lossy().into_owned(),
        );
        format!("{host}:{}", std::process::id())
    });
    let run = RunOpts::campaign(opts.hold, opts.name, opts.command);
    run_as(run, Some(proposal.into_bytes())).await
}

/// `dlock elect --observe`: one line per leader, until a signal.
async fn observe(opts: &ElectOpts) -> u8 {
    let url = match opts.hold.store().url_or_status() {
        Ok(u) => u,
        Err(code) => return code,
    };
    let locks = match dlock::connect(&url).await {
        Ok(l) => l,
        Err(e) => return fail(&format!("cannot use {}", dlock::redact(&url)), &e),
    };
    let election = match locks.election_with(&opts.name, LockOptions::default()) {
        Ok(e) => e,
        Err(e) => return fail(&format!("cannot observe {:?}", opts.name), &e),
    };
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("dlock: cannot install signal handlers");
        return exit::SOFTWARE;
    };
    let mut observer = election.observe();
    loop {
        let next = tokio::select! {
            next = observer.next() => next,
            _ = interrupt.recv() => return 128 + 2,
            _ = terminate.recv() => return 128 + 15,
        };
        let line = match next {
            Ok(Some(leader)) => format!(
                "{} {}",
                leader.term,
                String::from_utf8_lossy(&leader.proposal).escape_debug()
            ),
            Ok(None) => "none".to_owned(),
            Err(e) if e.is_retryable() => {
                eprintln!("dlock: observing {:?}: {e}; asking again", opts.name);
                tokio::select! {
                    () = tokio::time::sleep(RETRY_AFTER) => {}
                    _ = interrupt.recv() => return 128 + 2,
                    _ = terminate.recv() => return 128 + 15,
                }
                continue;
            }
            Err(e) => return fail(&format!("cannot observe {:?}", opts.name), &e),
        };
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            // Nobody reads any more (a closed pipe): done.
            return 0;
        }
    }
}
