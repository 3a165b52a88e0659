//! `dlock run`: a command under a lock.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use clap::Args;
use dlock::{Lease, LockOptions};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::{StoreOpts, exit, fail, parse_duration};

/// Options of `dlock run`.
#[derive(Debug, Args)]
pub struct RunOpts {
    #[command(flatten)]
    store: StoreOpts,

    /// Wait at most this long for the lock (default: as long as it takes).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,

    /// Do not wait: give up at once if the lock is held.
    #[arg(long, short = 'n')]
    no_wait: bool,

    /// The lease, renewed while the command runs (a dlock that dies frees the lock this long
    /// after its last renewal).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    lease: Duration,

    /// Wait in line: waiters get the lock in the order they asked (backends that can).
    #[arg(long)]
    fair: bool,

    /// After the lock is lost, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    kill_after: Duration,

    /// Exit status when the lock is not had in time.
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "CODE", default_value_t = exit::NOT_ACQUIRED)]
    conflict_exit_code: u8,

    /// The lock's name.
    name: String,

    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

pub(crate) async fn run(opts: RunOpts) -> u8 {
    let url = opts.store.url();
    let locks = match dlock::connect(&url).await {
        Ok(l) => l,
        Err(e) => return fail(&format!("cannot use {}", dlock::redact(&url)), &e),
    };
    let options = LockOptions::new()
        .with_lease(Lease::watchdog(opts.lease))
        .with_fair(opts.fair);
    let lock = match locks.lock_with(&opts.name, options) {
        Ok(l) => l,
        Err(e) => return fail(&format!("cannot lock {:?}", opts.name), &e),
    };
    let (mut interrupt, mut terminate) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        _ => {
            eprintln!("dlock: cannot install signal handlers");
            return exit::SOFTWARE;
        }
    };
    let wait = if opts.no_wait {
        Some(Duration::ZERO)
    } else {
        opts.wait
    };
    let acquiring = async {
        match wait {
            Some(w) => lock.try_acquire(w).await,
            None => lock.acquire().await.map(Some),
        }
    };
    let guard = tokio::select! {
        r = acquiring => match r {
            Ok(Some(g)) => g,
            Ok(None) => {
                eprintln!("dlock: {:?} is held by someone else{}", opts.name, match wait {
                    Some(w) if !w.is_zero() => format!(" (waited {})", humantime::format_duration(w)),
                    _ => String::new(),
                });
                return opts.conflict_exit_code;
            }
            Err(e) => return fail(&format!("cannot acquire {:?}", opts.name), &e),
        },
        _ = interrupt.recv() => return 128 + 2,
        _ = terminate.recv() => return 128 + 15,
    };
    let token = guard.fencing_token();
    let Some((program, args)) = opts.command.split_first() else {
        return exit::CONFIG;
    };
    let mut child = match tokio::process::Command::new(program)
        .args(args)
        .env("DLOCK_FENCING_TOKEN", token.to_string())
        .env("DLOCK_NAME", &opts.name)
        .stdin(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dlock: cannot run {}: {e}", program.to_string_lossy());
            let _ = guard.release().await;
            return if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
        }
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let send = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(s) => status_code(s),
                    Err(e) => {
                        eprintln!("dlock: waiting for the command failed: {e}");
                        exit::SOFTWARE
                    }
                };
                if let Err(e) = guard.release().await {
                    eprintln!("dlock: releasing {:?}: {e}", opts.name);
                }
                return code;
            }
            () = &mut lost => {
                eprintln!(
                    "dlock: lost the lock {:?} (token {token}) while the command ran; terminating it",
                    opts.name
                );
                send(Signal::SIGTERM);
                if tokio::time::timeout(opts.kill_after, child.wait()).await.is_err() {
                    eprintln!("dlock: the command outlived --kill-after; killing it");
                    send(Signal::SIGKILL);
                    let _ = child.wait().await;
                }
                return exit::LOST;
            }
            _ = interrupt.recv() => send(Signal::SIGINT),
            _ = terminate.recv() => send(Signal::SIGTERM),
        }
    }
}

/// The shell's convention: the exit code, or 128 + the signal that ended the process.
fn status_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::SOFTWARE),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(exit::SOFTWARE),
        (None, None) => exit::SOFTWARE,
    }
}
