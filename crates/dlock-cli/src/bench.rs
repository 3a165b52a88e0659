//! `dlock bench`: the workloads W1-W6 (described in `docs/benchmarks.md`) against several
//! stores in one run, each lock throughput set against the raw floor of the same server calls
//! made with the client library.
//!
//! [`targets`](mod@targets) lists the stores, [`workloads`] runs each workload against one
//! of them through dlock (with [`floor`] for its raw floor, [`curator`], `rslock` and
//! `sqlx_pg` for the peer locks), and [`report`] prints, writes and compares the rows; [`chart`] draws them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::exit;

mod chart;
mod curator;
mod floor;
mod measure;
mod open_loop;
mod processes;
mod report;
#[cfg(feature = "redis")]
mod rslock;
mod scale;
#[cfg(feature = "postgres")]
mod sqlx_pg;
mod targets;
mod worker;
mod workloads;

pub use self::report::Row;
use self::report::{compare_with_baseline, load, print_table, write_json};
use self::targets::{Target, Via, targets};
pub use self::worker::BenchWorkerOpts;
pub(crate) use self::worker::worker;
use self::workloads::run_workload;

/// The longest one workload may take on one backend before it is reported as failed.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(300);

/// The workloads (W1-W9 and their variants, described in `docs/benchmarks.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[value(rename_all = "UPPER")]
pub enum Workload {
    /// 1 client, one name: acquire + release cycles after a warm-up.
    W1,
    /// W1 on a semaphore of 4 permits: one permit taken and given back per cycle.
    W1S,
    /// 8 clients on one name; the critical section reads, yields and writes a counter.
    W2,
    /// W2 with the fair lock (backends that have one): how often the holder changes, and the
    /// longest wait, against W2's unfair lock.
    W2F,
    /// W2 with each client a process of its own: every wake-up goes through the store.
    W2P,
    /// W2F with each client a process of its own.
    W2PF,
    /// 2 clients ping-pong on one name: handoff latency, from the holder's release call to
    /// the waiter's acquire returning.
    W3,
    /// W3 with each client a process of its own.
    W3P,
    /// 8 clients, each on its own name.
    W4,
    /// 8 waiters queued in a known order on a fair lock.
    W5,
    /// One client holds 1,000 locks at once, then releases them.
    W6,
    /// 64 tasks on one provider (as an application shares one), each on its own name; set
    /// against the floor of 64 tasks on one shared client (Redis, ZooKeeper, etcd).
    W7,
    /// 64 tasks on one provider on 8 names, 8 tasks to a name.
    W7H,
    /// One provider keeps `--holds` names held for `--hold-for`: renewals and calls to the
    /// store per second, memory per hold. Not in the default set (it takes minutes).
    W8,
    /// 1, 4, 16 and 64 worker processes, each with a provider of its own, cycling on names of
    /// their own: throughput, latency and client CPU as the processes grow (a row each).
    W8P,
    /// The open loop: cycles due at a fixed rate, at 50 % and 80 % of W7's closed loop, on
    /// one provider; latency from when each was due.
    W9,
}

/// Options of `dlock bench`.
#[derive(Debug, Args)]
pub struct BenchOpts {
    /// A store to measure (repeat for several). Default: the embedded SQLite (both
    /// strategies, in a temporary file), memory://, and every DLOCK_REDIS_URL, DLOCK_ZK_URL,
    /// DLOCK_ETCD_URL (when built with the `etcd` feature), DLOCK_MYSQL_URL and
    /// DLOCK_POSTGRES_URL set (MySQL and PostgreSQL with each strategy).
    ///
    /// Every zk:// store (and, by default, the place of DLOCK_ZK_URL even when it is unset) is
    /// followed by a `curator (java)` target: W1-W4 run through Apache Curator's
    /// InterProcessMutex, W1S through its InterProcessSemaphoreV2, on the same ZooKeeper (its
    /// first server) for comparison. Its Java
    /// program is compiled with javac at bench time against the Curator jars in DLOCK_JAVA_DIR
    /// (default /usr/share/java); without them (or without DLOCK_ZK_URL) its rows are skipped.
    #[arg(long = "url", value_name = "URL")]
    pub urls: Vec<String>,

    /// The workloads to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "W1,W1S,W2,W2F,W2P,W2PF,W3,W3P,W4,W5,W6,W7,W7H,W9"
    )]
    pub workload: Vec<Workload>,

    /// Cycles of W1 (W2 and W4 run twice as many in all, W3 a quarter as many handoffs).
    #[arg(long, default_value_t = 2000)]
    pub cycles: u64,

    /// W8: how many names one provider holds at once (one row each).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub holds: Vec<u64>,

    /// W8: how long the names stay held while their renewals are counted (e.g. 60s).
    #[arg(long, value_parser = crate::parse_duration, default_value = "60s")]
    pub hold_for: Duration,

    /// Stop each workload after this long, whatever its cycle count (e.g. 10s).
    #[arg(long, value_parser = crate::parse_duration)]
    pub duration: Option<Duration>,

    /// Write the results as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Draw throughput and latency per backend as an SVG chart here.
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,

    /// Measure nothing: print (and chart) the results of an earlier `--json` file.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["urls", "json"])]
    pub from_json: Option<PathBuf>,

    /// Compare the ratios to the floor (W1, W4) with those of an earlier `--json` file (e.g.
    /// the committed docs/benchmarks.json): a ratio more than 20 % below the file's is
    /// printed as a regression, and the run exits 1. Ratios, not absolute times: they carry
    /// from machine to machine.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
}

/// Runs `dlock bench`: measures (or, with `--from-json`, reads) the rows, prints them, writes
/// and draws them as asked, and compares them with the baseline; the exit status.
pub(crate) async fn bench(opts: BenchOpts) -> u8 {
    if let Some(path) = &opts.from_json {
        let rows = match load(path) {
            Ok(rows) => rows,
            Err(code) => return code,
        };
        print_table(&rows);
        if let Some(code) = compare_with_baseline(opts.baseline.as_deref(), &rows) {
            return code;
        }
        if let Err(code) = draw(opts.chart.as_deref(), &rows) {
            return code;
        }
        return 0;
    }
    let (targets, scratch) = targets(&opts);
    let mut rows = Vec::new();
    let progress = ProgressBar::new((targets.len() * opts.workload.len()) as u64);
    progress.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut failed = false;
    for target in &targets {
        if target.is_peer() {
            progress.set_message(target.label.clone());
            let peer_rows = peer_rows(target, &opts).await;
            failed |= report_errors(&peer_rows, &progress);
            rows.extend(peer_rows);
            progress.inc(opts.workload.len() as u64);
            continue;
        }
        for workload in &opts.workload {
            progress.set_message(format!("{} {workload:?}", target.label));
            if *workload == Workload::W8 {
                let (scale_rows, scale_failed) = scale_rows(target, &opts, &progress).await;
                failed |= scale_failed;
                rows.extend(scale_rows);
                progress.inc(1);
                continue;
            }
            if matches!(
                workload,
                Workload::W2P | Workload::W2PF | Workload::W3P | Workload::W8P | Workload::W9
            ) {
                let limited =
                    tokio::time::timeout(WORKLOAD_LIMIT, several_rows(target, *workload, &opts));
                match limited.await {
                    Ok(Ok(load_rows)) => rows.extend(load_rows),
                    outcome => {
                        failed = true;
                        let e = match outcome {
                            Ok(Err(e)) => e.to_string(),
                            _ => format!("did not finish within {WORKLOAD_LIMIT:?}"),
                        };
                        progress.suspend(|| {
                            eprintln!("dlock bench: {} {workload:?}: {e}", target.label);
                        });
                        rows.push(Row::skipped(
                            &target.label,
                            format!("{workload:?}"),
                            format!("error: {e}"),
                        ));
                    }
                }
                progress.inc(1);
                continue;
            }
            let limited =
                tokio::time::timeout(WORKLOAD_LIMIT, run_workload(target, *workload, &opts));
            let row = match limited.await.unwrap_or_else(|_| {
                Err(dlock::Error::config(format!(
                    "did not finish within {WORKLOAD_LIMIT:?}"
                )))
            }) {
                Ok(row) => row,
                Err(e) => {
                    failed = true;
                    progress.suspend(|| {
                        eprintln!("dlock bench: {} {workload:?}: {e}", target.label);
                    });
                    Row::skipped(
                        &target.label,
                        format!("{workload:?}"),
                        format!("error: {e}"),
                    )
                }
            };
            rows.push(row);
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    if let Some(file) = scratch {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
    }
    print_table(&rows);
    if let Some(path) = &opts.json
        && let Err(code) = write_json(path, &rows)
    {
        return code;
    }
    if let Err(code) = draw(opts.chart.as_deref(), &rows) {
        return code;
    }
    if rows.iter().any(|r| r.violations > 0) {
        eprintln!("dlock bench: EXCLUSION VIOLATIONS were seen (column `viol`)");
        return exit::SOFTWARE;
    }
    if let Some(code) = compare_with_baseline(opts.baseline.as_deref(), &rows) {
        return code;
    }
    if failed { exit::SOFTWARE } else { 0 }
}

/// With `--chart`: draws the rows there; a chart that cannot be drawn is said, and is the exit
/// status SOFTWARE.
fn draw(path: Option<&Path>, rows: &[Row]) -> Result<(), u8> {
    let Some(path) = path else {
        return Ok(());
    };
    chart::draw(path, rows).map_err(|e| {
        eprintln!("dlock bench: cannot draw {}: {e}", path.display());
        exit::SOFTWARE
    })
}

/// The rows of a workload across processes (W2P, W2PF, W3P, W8P: [`processes`]) or of W9
/// (a row per load).
async fn several_rows(
    target: &Target,
    workload: Workload,
    opts: &BenchOpts,
) -> dlock::Result<Vec<Row>> {
    if workload == Workload::W9 {
        open_loop::rows(target, opts).await
    } else {
        processes::rows(target, workload, opts).await
    }
}

/// W8's rows on `target`, one per `--holds` count, and whether one failed.
async fn scale_rows(target: &Target, opts: &BenchOpts, progress: &ProgressBar) -> (Vec<Row>, bool) {
    let mut rows = Vec::new();
    let mut failed = false;
    // Taking and giving back 100,000 holds may take minutes on a slow store.
    let limit = opts.hold_for.saturating_add(Duration::from_secs(900));
    for &holds in &opts.holds {
        let row = match tokio::time::timeout(limit, scale::scale(target, holds, opts)).await {
            Ok(Ok(row)) => row,
            outcome => {
                failed = true;
                let e = match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("did not finish within {limit:?}"),
                };
                progress.suspend(|| eprintln!("dlock bench: {} W8/{holds}: {e}", target.label));
                Row::skipped(&target.label, format!("W8/{holds}"), format!("error: {e}"))
            }
        };
        rows.push(row);
    }
    (rows, failed)
}

/// Prints the rows of a peer target that failed (their `skipped` starts with `error:`);
/// whether there was one.
fn report_errors(rows: &[Row], progress: &ProgressBar) -> bool {
    let mut failed = false;
    for r in rows {
        if let Some(why) = r.skipped.as_deref().filter(|s| s.starts_with("error:")) {
            failed = true;
            progress.suspend(|| eprintln!("dlock bench: {} {}: {why}", r.backend, r.workload));
        }
    }
    failed
}

/// The rows of a peer target: Curator's lock, rslock's, or sqlx's `PgAdvisoryLock` (none
/// without the `postgres` feature).
async fn peer_rows(target: &Target, opts: &BenchOpts) -> Vec<Row> {
    if target.via == Via::Curator {
        let url = Some(target.url.as_str()).filter(|u| !u.is_empty());
        return curator::rows(url, &opts.workload, opts.cycles, opts.duration).await;
    }
    #[cfg(feature = "redis")]
    if target.via == Via::Rslock {
        let ns = measure::namespace();
        return rslock::rows(&target.url, &ns, &opts.workload, opts.cycles, opts.duration).await;
    }
    #[cfg(feature = "postgres")]
    {
        let ns = measure::namespace();
        sqlx_pg::rows(&target.url, &ns, &opts.workload, opts.cycles, opts.duration).await
    }
    #[cfg(not(feature = "postgres"))]
    {
        Vec::new()
    }
}
