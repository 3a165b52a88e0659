//! `dlock torture`: many worker processes contend for a few names with every primitive while
//! faults are injected on a schedule drawn from a seed (proxy faults in front of the store:
//! partitions, one-way cuts, silent networks on a holder, latency, resets, delayed replies;
//! process faults: SIGSTOP past the lease, SIGKILL; blips well under the lease, a SIGSTOP or a
//! partition, that must cost no hold), each hold writes to a shared resource that rejects
//! stale fencing tokens, and a checker reads the whole history and says whether the contract
//! held.
//!
//! For each store, [`attack`](mod@attack) runs the attack: [`store`] reads which faults can
//! hit it, [`plan`] draws the schedule, [`crew`] starts the [`worker`](mod@worker) processes
//! behind their proxies and reads what they say, [`faults`] injects each fault, [`check`]
//! judges the history ([`history`], with the [`resource`]'s ledger) and [`report`] says what
//! it found.

mod attack;
mod check;
mod crew;
mod faults;
mod history;
mod plan;
mod report;
mod resource;
mod store;
mod worker;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use self::attack::attack;
pub use self::history::FaultKind;
use self::history::now_ns;
use self::store::{applicable, session_override};
pub use self::worker::TortureWorkerOpts;
pub(crate) use self::worker::worker;
use crate::{exit, parse_duration};

/// The primitives a worker uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Primitive {
    /// A reentrant mutex with a watchdog lease.
    Mutex,
    /// A fair mutex (backends that have one).
    Fair,
    /// A read-write lock: 70% reads, 30% writes (backends that have one).
    Rw,
    /// A semaphore of 2 permits (backends that have one).
    Semaphore,
    /// A MultiLock over two mutex names.
    Multi,
}

/// A deliberately broken lock, to show that the checker catches each breakage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Sabotage {
    /// Every worker gets a store of its own: nothing excludes anything.
    NoExclusion,
    /// Workers report tokens that repeat.
    RepeatTokens,
    /// Workers ignore the loss signal: they stay in their critical section and never say.
    NoLoss,
    /// The store gives a stalled holder's lock away early: workers take holds with a watchdog
    /// lease of a quarter of `--lease`, so a paused holder's hold ends long before the lease
    /// the checker was told of, while nothing else is wrong.
    ShortLease,
    /// Workers report a loss half a lease after their guard did, staying in their critical
    /// section meanwhile.
    LateLoss,
    /// A fair lock that lets later waiters overtake: workers take their `fair` holds with a
    /// plain mutex, whose waiters race for each release whatever their order of arrival.
    Unfair,
    /// A dead holder's hold is never freed: workers take holds with a fixed lease of an hour,
    /// so the names a killed worker held are never granted again.
    Leak,
}

/// Options of `dlock torture`.
#[derive(Debug, Args)]
pub struct TortureOpts {
    /// A store to attack (repeat for several: each is attacked in turn, with the same seed).
    /// Network stores get a fault-injecting proxy in front of them for every worker; an
    /// embedded SQLite store gets the process faults only, and so do a Redis Cluster and a
    /// Sentinel group (their clients learn node addresses from the servers, past any proxy),
    /// which `restart` can still fail over.
    #[arg(long = "url", value_name = "URL", required = true)]
    pub urls: Vec<String>,

    /// Worker processes, each with its own connections.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub processes: u32,

    /// How long to attack each store.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub duration: Duration,

    /// The faults to inject. A fault that may cost a hold (a kill; a pause, partition,
    /// one-way cut, silent network or delay past the lease) explains an overlap of its holder
    /// only once it outlasted two thirds of a lease; a blip (0.2-0.5 of a lease) or latency
    /// explains none.
    #[arg(long, value_delimiter = ',', default_values_t = FaultKind::ALL)]
    pub faults: Vec<FaultKind>,

    /// The command that restarts the store, for `--faults ...,restart`: run with `sh -c`, it
    /// must return once the server answers again (or fail, which ends the run). Only a server
    /// the caller may restart: dlock never stops a server on its own.
    #[arg(long, value_name = "COMMAND")]
    pub restart_cmd: Option<String>,

    /// The seed of the fault schedule and of the workers' choices: a run with the same seed
    /// replays the same schedule. Default: drawn from the clock, and printed.
    #[arg(long)]
    pub seed: Option<u64>,

    /// The primitives the workers use (those the backend lacks are left out, and said so).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mutex,fair,rw,semaphore,multi"
    )]
    pub primitives: Vec<Primitive>,

    /// Names per primitive.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=100))]
    pub names: u64,

    /// The workers' watchdog lease.
    #[arg(long, value_parser = parse_duration, default_value = "2s", conflicts_with = "defaults")]
    pub lease: Duration,

    /// Attack what users run: the workers take their holds with the library's default options
    /// (a 30 s watchdog lease) on the store's default session (the URL must not set
    /// `session_timeout_ms` or `ttl_s`), and every fault is scaled to that lease or session.
    /// Runs must be long (at least four leases; ten minutes is a good start).
    #[arg(long)]
    pub defaults: bool,

    /// The clock of the first worker runs at this rate (0.99: 1 % slow; 1.01: 1 % fast), for
    /// its whole life and each worker that replaces it, through libfaketime (the OS package
    /// `libfaketime`); faults that aim at a holder pick it when it holds. Within the drift
    /// allowance (1 % of the lease plus 5 ms) the contract must hold; a clock slower than
    /// that must be caught.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub clock_rate: Option<f64>,

    /// The longest critical section.
    #[arg(long, value_parser = parse_duration, default_value = "60ms")]
    pub hold: Duration,

    /// Write the reports (one per store) as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write the whole history (every event, fault and accepted write) as JSON lines here.
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,

    /// Test only: break the lock on purpose (the checker must say so).
    #[arg(long, hide = true)]
    pub sabotage: Option<Sabotage>,
}

/// A clock rate: a number from 0.5 to 2.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.5..=2.0).contains(&r) => Ok(r),
        _ => Err(format!(
            "{s:?}: expected a rate from 0.5 to 2 (0.99: 1 % slow)"
        )),
    }
}

/// Attacks every store of `--url` in turn; the exit status (1 if the checker found a
/// violation).
pub(crate) async fn torture(mut opts: TortureOpts) -> u8 {
    if opts.defaults {
        opts.lease = dlock::Lease::DEFAULT_TTL;
        if opts.duration < opts.lease.saturating_mul(4) {
            eprintln!(
                "dlock: --defaults attacks with {} leases: give it --duration of at least {} \
                 (10m is a good start)",
                humantime::format_duration(opts.lease),
                humantime::format_duration(opts.lease.saturating_mul(4))
            );
            return exit::CONFIG;
        }
    }
    let seed = opts
        .seed
        .unwrap_or_else(|| now_ns() ^ u64::from(std::process::id()));
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("dlock: cannot find my own executable to start the workers: {e}");
            return exit::SOFTWARE;
        }
    };
    let restarts = opts.faults.contains(&FaultKind::Restart);
    if restarts != opts.restart_cmd.is_some() {
        eprintln!(
            "dlock: --faults restart and --restart-cmd go together (the command restarts the \
             store; dlock never stops a server on its own)"
        );
        return exit::CONFIG;
    }
    // Every store is checked before the first is attacked: a run does not end half-way,
    // its earlier reports lost, on a store no requested fault can hit.
    for url in &opts.urls {
        if opts.defaults
            && let Some(key) = session_override(url)
        {
            eprintln!(
                "dlock: {}: --defaults runs the store's default session; the URL sets {key}",
                dlock::redact(url)
            );
            return exit::CONFIG;
        }
        if applicable(&opts, url).1.is_empty() {
            eprintln!(
                "dlock: {}: none of the requested faults can hit it (a store without a \
                 network to attack, a Redis Cluster or a Sentinel group takes pause, \
                 blip-pause, kill and restart)",
                dlock::redact(url)
            );
            return exit::CONFIG;
        }
    }
    let mut reports = Vec::new();
    let mut status = 0;
    let mut history_out = match &opts.history {
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Some(std::io::BufWriter::new(f)),
            Err(e) => {
                eprintln!("dlock: cannot write {}: {e}", path.display());
                return exit::CONFIG;
            }
        },
        None => None,
    };
    for url in &opts.urls {
        match attack(&opts, url, seed, &exe, history_out.as_mut()).await {
            Ok(r) => {
                r.print();
                if r.violated() {
                    status = 1;
                }
                reports.push(r);
            }
            Err(code) => return code,
        }
    }
    if let Some(path) = &opts.json {
        let written = serde_json::to_vec_pretty(&reports)
            .map_err(std::io::Error::other)
            .and_then(|json| std::fs::write(path, json));
        if let Err(e) = written {
            eprintln!("dlock: cannot write {}: {e}", path.display());
            return exit::SOFTWARE;
        }
    }
    status
}
