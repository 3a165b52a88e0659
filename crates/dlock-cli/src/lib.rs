#![doc = include_str!("../README.md")]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

/// Prints a line to standard output like `println!`, except that a reader that went away
/// (`dlock bench | head -1`) ends the program quietly with [`exit::BROKEN_PIPE`], as a Unix
/// tool killed by `SIGPIPE` would, instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say_line(format_args!($($arg)*))
    };
}

mod bench;
mod run;
mod status;
mod torture;

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub use crate::bench::{BenchOpts, Row, Workload};
pub use crate::run::RunOpts;
pub use crate::status::StatusOpts;
pub use crate::torture::{FaultKind, Primitive, Sabotage, TortureOpts, TortureWorkerOpts};

/// Exit statuses of `dlock` itself (besides the command's own, which `dlock run` passes on).
pub mod exit {
    /// `dlock run`: the lock was not had within `--wait` (or at once with `--no-wait`), and
    /// the command was not run. Change it with `-E`, as with flock(1).
    pub const NOT_ACQUIRED: u8 = 75;
    /// `dlock run`: the lock was lost, or was about to end, while the command ran (the
    /// command was terminated), or the release found it lost after the command exited.
    pub const LOST: u8 = 76;
    /// The store could not be reached or did not answer (never taken for "held").
    pub const UNAVAILABLE: u8 = 69;
    /// A bad URL, lock name, duration or option.
    pub const CONFIG: u8 = 78;
    /// Any other failure of the store or of dlock.
    pub const SOFTWARE: u8 = 70;
    /// The command could not be executed (found but not executable).
    pub const CANNOT_EXECUTE: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
    /// Standard output was closed by its reader (`dlock bench | head -1`): the status a Unix
    /// tool killed by `SIGPIPE` gives (128 + 13).
    pub const BROKEN_PIPE: u8 = 141;
}

/// Writes one line to standard output; see `say!`.
fn say_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(line)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(i32::from(exit::BROKEN_PIPE))
        }
        Err(e) => {
            eprintln!("dlock: cannot write to standard output: {e}");
            std::process::exit(i32::from(exit::SOFTWARE))
        }
    }
}

/// dlock: distributed locks from the shell.
///
/// The store is chosen by URL: `--url`, else `DLOCK_URL`, else the embedded SQLite file in your
/// state directory (`$XDG_STATE_HOME/dlock/locks.db`), which needs no server.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Show the library's tracing on stderr: -v info, -vv debug, -vvv trace (RUST_LOG, when
    /// set, decides instead).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Sends the library's tracing to stderr, as `-v` or `RUST_LOG` asks (nothing otherwise).
    pub fn init_tracing(&self) {
        let filter = match std::env::var("RUST_LOG") {
            Ok(spec) if !spec.trim().is_empty() => tracing_subscriber::EnvFilter::new(spec),
            _ => {
                let level = match self.verbose {
                    0 => return,
                    1 => "info",
                    2 => "debug",
                    _ => "trace",
                };
                let crates = [
                    "dlock",
                    "dlock_core",
                    "dlock_cli",
                    "dlock_memory",
                    "dlock_redis",
                    "dlock_zookeeper",
                    "dlock_sql",
                    "dlock_proxy",
                ];
                let spec: Vec<String> = crates.iter().map(|c| format!("{c}={level}")).collect();
                tracing_subscriber::EnvFilter::new(format!("warn,{}", spec.join(",")))
            }
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding a lock (like flock(1), across machines).
    ///
    /// The command gets the fencing token in DLOCK_FENCING_TOKEN and the lock name in DLOCK_NAME.
    /// The lease is renewed while it runs. If the lock is about to end (its renewals fail, its
    /// session is cut off), the command's process group gets SIGTERM --kill-after before the
    /// end and SIGKILL at the end, before anyone else can hold the lock; a hold found gone
    /// gets SIGKILL at once.
    ///
    /// dlock exits with the command's status; 75 if the store answered that the lock is held
    /// and it was not had in time (-E to change); 76 if the lock was lost, or about to end,
    /// while the command ran (also when the loss is found only at the release after the
    /// command exited); 69 if the store could not be reached or did not answer (an error, not
    /// "held by someone"); 78 for a bad URL, name or duration, or a --kill-after not shorter
    /// than the hold; 127 if the command is not found.
    Run(RunOpts),
    /// Show whether a lock is held, by whom, for how long, and its last fencing token.
    Status(StatusOpts),
    /// Compare backends: run the benchmark workloads against one or more stores.
    Bench(BenchOpts),
    /// Attack a store: worker processes contend while faults are injected (partitions,
    /// pauses past the lease, kills, resets, latency), then a checker proves the contract
    /// held: fenced writes in token order, every overlap explained by a fault and reported to
    /// its holder, progress after every fault. Exits 1 on a violation.
    Torture(TortureOpts),
    /// One worker process of `dlock torture` (started by it).
    #[command(hide = true)]
    TortureWorker(TortureWorkerOpts),
    /// The reaper of `dlock run` (started by it): leads the process group the command joins,
    /// and kills it if that dlock dies without saying it is done.
    #[command(hide = true)]
    Reap,
}

/// The store to use.
#[derive(Debug, Clone, Args)]
pub struct StoreOpts {
    /// The store's URL (redis://, zk://, mysql://, sqlite://, memory://). Default: the
    /// embedded SQLite file.
    #[arg(long, env = "DLOCK_URL", value_name = "URL", hide_env_values = true)]
    pub url: Option<String>,
}

impl StoreOpts {
    /// The URL to use.
    pub fn url(&self) -> String {
        self.url.clone().unwrap_or_else(dlock::default_url)
    }
}

/// Parses a duration: `500ms`, `2s`, `1m30s`, `1h`, or a plain number of seconds.
///
/// # Errors
///
/// A message saying what is wrong, for clap to print.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && (0.0..1e9).contains(&secs) {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("{text:?} is not a duration in range"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 500ms, 10s, 2m"))
}

/// Runs the command line and returns the process's exit status.
pub async fn run(cli: Cli) -> u8 {
    match cli.command {
        Command::Run(opts) => run::run(opts).await,
        Command::Status(opts) => status::status(opts).await,
        Command::Bench(opts) => bench::bench(opts).await,
        Command::Torture(opts) => torture::torture(opts).await,
        Command::TortureWorker(opts) => torture::worker(opts).await,
        Command::Reap => run::reap().await,
    }
}

/// Prints `dlock: <what>: <error>` (errors never contain passwords) and picks the exit status.
pub(crate) fn fail(what: &str, e: &dlock::Error) -> u8 {
    eprintln!("dlock: {what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        eprintln!("  caused by: {}", dlock_core_redact(&s.to_string()));
        source = s.source();
    }
    match e {
        dlock::Error::Config { .. }
        | dlock::Error::InvalidName { .. }
        | dlock::Error::InvalidArgument { .. }
        | dlock::Error::Unsupported { .. } => exit::CONFIG,
        dlock::Error::Connection { .. } => exit::UNAVAILABLE,
        _ => exit::SOFTWARE,
    }
}

/// Client libraries may quote the URL they were given: hide any password in it.
fn dlock_core_redact(text: &str) -> String {
    text.split(' ')
        .map(dlock::redact)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        for bad in ["", "-1", "soon", "10 parsecs", "1e99", "NaN"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redacts_urls_in_messages() {
        assert_eq!(
            dlock_core_redact("connect to mysql://u:pw@h/db failed"),
            "connect to mysql://u:***@h/db failed"
        );
    }
}
