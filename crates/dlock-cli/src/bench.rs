//! `dlock bench`: the workloads W1-W6 (described in `docs/benchmarks.md`) against several stores in one run, each lock
//! throughput set against the raw floor of the same server calls made with the client library.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use dlock::{DynLockProvider, Lease, LockOptions};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::exit;

mod chart;
mod curator;
mod floor;
use floor::Floor;
#[cfg(feature = "postgres")]
mod sqlx_pg;

/// W1 runs its cycles in this many blocks, each followed by as many cycles of its floor.
const W1_BLOCKS: u64 = 8;

/// The longest one workload may take on one backend before it is reported as failed.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(300);

/// The workloads (W1-W6, described in `docs/benchmarks.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[value(rename_all = "UPPER")]
pub enum Workload {
    /// 1 client, one name: acquire + release cycles after a warm-up.
    W1,
    /// 8 clients on one name; the critical section reads, yields and writes a counter.
    W2,
    /// W2 with the fair lock (backends that have one): how often the holder changes, and the
    /// longest wait, against W2's unfair lock.
    W2F,
    /// 2 clients ping-pong on one name: release-to-acquire handoff latency.
    W3,
    /// 8 clients, each on its own name.
    W4,
    /// 8 waiters queued in a known order on a fair lock.
    W5,
    /// One client holds 1,000 locks at once, then releases them.
    W6,
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
    /// InterProcessMutex on the same ZooKeeper (its first server) for comparison. Its Java
    /// program is compiled with javac at bench time against the Curator jars in DLOCK_JAVA_DIR
    /// (default /usr/share/java); without them (or without DLOCK_ZK_URL) its rows are skipped.
    #[arg(long = "url", value_name = "URL")]
    pub urls: Vec<String>,

    /// The workloads to run.
    #[arg(long, value_delimiter = ',', default_value = "W1,W2,W2F,W3,W4,W5,W6")]
    pub workload: Vec<Workload>,

    /// Cycles of W1 (W2 and W4 run twice as many in all, W3 a quarter as many handoffs).
    #[arg(long, default_value_t = 2000)]
    pub cycles: u64,

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

/// One measurement.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Row {
    /// The backend and strategy, e.g. `mysql/optimistic`.
    pub backend: String,
    /// The workload.
    pub workload: String,
    /// Cycles (or handoffs, grants, locks) done.
    pub cycles: u64,
    /// Wall time of the workload.
    pub seconds: f64,
    /// Cycles per second.
    pub cycles_per_sec: f64,
    /// Acquire latency (W2, W4, W5: waiting time) percentiles, microseconds.
    pub acquire_p50_us: u64,
    /// 99th percentile.
    pub acquire_p99_us: u64,
    /// 99.9th percentile.
    pub acquire_p999_us: u64,
    /// W3: release-returned to acquire-returned, microseconds.
    pub handoff_p50_us: Option<u64>,
    /// W3: 99th percentile.
    pub handoff_p99_us: Option<u64>,
    /// W2: overlaps seen plus lost counter updates (must be 0).
    pub violations: u64,
    /// W1 and W4: the floor's cycles per second (the same server calls made with the client
    /// library only, from 1 and 8 clients).
    pub floor_cycles_per_sec: Option<f64>,
    /// W1 and W4: `cycles_per_sec / floor_cycles_per_sec`.
    pub ratio_to_floor: Option<f64>,
    /// W1: the client's CPU time per cycle of the floor (its cycles only, not its
    /// connecting), microseconds: set against `cpu_us_per_cycle`, what dlock's client adds.
    #[serde(default)]
    pub floor_cpu_us_per_cycle: Option<f64>,
    /// W1 of a SQL for-update lock: the cycles per second of its row lock alone made raw
    /// (`BEGIN`, `SELECT … FOR UPDATE`, `ROLLBACK`), without the fencing token dlock takes and
    /// commits: what a lock without a fence would cost.
    #[serde(default)]
    pub lock_floor_cycles_per_sec: Option<f64>,
    /// W1 of a SQL for-update lock: `cycles_per_sec / lock_floor_cycles_per_sec`.
    #[serde(default)]
    pub ratio_to_lock_floor: Option<f64>,
    /// W2, W2F: the share of cycles (percent) whose holder was not the previous cycle's
    /// holder (8 clients taking turns fairly: about 100; a lock that starves: near 0).
    #[serde(default)]
    pub owner_switch_pct: Option<f64>,
    /// W2, W2F, W4: the longest acquire, milliseconds.
    #[serde(default)]
    pub max_wait_ms: Option<f64>,
    /// W1-W4: the process's CPU time (user + system, `getrusage`) over the workload divided by
    /// its cycles, microseconds: what one cycle costs the client.
    #[serde(default)]
    pub cpu_us_per_cycle: Option<f64>,
    /// W5: waiters served out of the order they queued in.
    pub out_of_order: Option<u64>,
    /// W5: longest minus shortest wait, milliseconds.
    pub wait_spread_ms: Option<f64>,
    /// W6: resident memory growth while holding the locks, KiB.
    pub memory_kib: Option<i64>,
    /// W6: server connections the client opened for the 1,000 locks, where measurable.
    pub server_connections: Option<i64>,
    /// Why the workload was skipped, if it was.
    pub skipped: Option<String>,
}

/// A store under test.
#[derive(Debug, Clone)]
struct Target {
    label: String,
    url: String,
    /// Test only: each client gets its own private store, so nothing is excluded (the
    /// benchmark's exclusion checker must see violations).
    broken: bool,
    /// The workloads run through Apache Curator (Java) against the ZooKeeper of `url`, which
    /// is empty when no zk:// store is configured (the rows then say so).
    curator: bool,
    /// W1 and W3 through sqlx's own `PgAdvisoryLock` against the PostgreSQL of `url`.
    sqlx_pg: bool,
}

impl Target {
    async fn client(&self) -> dlock::Result<DynLockProvider> {
        if self.broken {
            return Ok(Arc::new(dlock::memory::MemoryProvider::new()));
        }
        Ok(Arc::clone(dlock::connect(&self.url).await?.provider()))
    }
}

fn label_of(url: &str) -> String {
    let scheme = url.split("://").next().unwrap_or("?");
    let strategy = url
        .split_once("strategy=")
        .map(|(_, s)| s.split('&').next().unwrap_or(s).to_owned());
    match scheme {
        "mysql" | "mariadb" | "sqlite" | "postgres" | "postgresql" => {
            let scheme = if scheme == "postgresql" {
                "postgres"
            } else {
                scheme
            };
            format!(
                "{scheme}/{}",
                strategy.unwrap_or_else(|| "unique-insert".into())
            )
        }
        "redis" | "rediss" if url.contains("cluster=true") => "redis-cluster".into(),
        other => other.to_owned(),
    }
}

fn targets(opts: &BenchOpts) -> (Vec<Target>, Option<PathBuf>) {
    let mut urls = opts.urls.clone();
    let mut scratch = None;
    if urls.is_empty() {
        let file = std::env::temp_dir().join(format!("dlock-bench-{}.db", std::process::id()));
        urls.push(format!("sqlite://{}", file.display()));
        // One set of tables serves one strategy: optimistic gets its own prefix.
        urls.push(format!(
            "sqlite://{}?strategy=optimistic&table=dlock_optimistic",
            file.display()
        ));
        scratch = Some(file);
        // A named store: every client of the benchmark must share it.
        urls.push("memory://dlock-bench".into());
        for var in ["DLOCK_REDIS_URL", "DLOCK_ZK_URL", "DLOCK_ETCD_URL"] {
            if var == "DLOCK_ETCD_URL" && !cfg!(feature = "etcd") {
                // Not compiled in (it needs protoc to build): `--features etcd` adds it.
                continue;
            }
            if let Ok(url) = std::env::var(var) {
                urls.push(url);
            } else if var == "DLOCK_ZK_URL" {
                // Curator's place in the list: its rows say why they were skipped.
                urls.push(CURATOR_WITHOUT_ZK.into());
            }
        }
        for var in ["DLOCK_MYSQL_URL", "DLOCK_POSTGRES_URL"] {
            let Ok(url) = std::env::var(var) else {
                continue;
            };
            // One set of tables serves one strategy: each gets its own prefix.
            let advisory = (var == "DLOCK_POSTGRES_URL").then_some(("advisory", "dlock_advisory"));
            for (s, table) in [
                ("unique-insert", "dlock"),
                ("optimistic", "dlock_optimistic"),
                ("for-update", "dlock_for_update"),
            ]
            .into_iter()
            .chain(advisory)
            {
                let sep = if url.contains('?') { '&' } else { '?' };
                urls.push(format!("{url}{sep}strategy={s}&table={table}&pool=64"));
            }
        }
    }
    let mut targets = Vec::new();
    for url in urls {
        if url == CURATOR_WITHOUT_ZK {
            targets.push(Target {
                label: curator::LABEL.into(),
                url: String::new(),
                broken: false,
                curator: true,
                sqlx_pg: false,
            });
            continue;
        }
        let zk = url.starts_with("zk://");
        // sqlx's own advisory lock beside dlock's, on the same server.
        let advisory = cfg!(feature = "postgres")
            && url.starts_with("postgres")
            && url.contains("strategy=advisory");
        targets.push(Target {
            label: if url == "broken://" {
                "broken (test)".into()
            } else {
                label_of(&url)
            },
            broken: url == "broken://",
            url: url.clone(),
            curator: false,
            sqlx_pg: false,
        });
        if zk {
            targets.push(Target {
                label: curator::LABEL.into(),
                url,
                broken: false,
                curator: true,
                sqlx_pg: false,
            });
        }
        if advisory {
            targets.push(Target {
                label: "sqlx PgAdvisoryLock".into(),
                url: targets.last().map(|t| t.url.clone()).unwrap_or_default(),
                broken: false,
                curator: false,
                sqlx_pg: true,
            });
        }
    }
    (targets, scratch)
}

/// Placeholder in the default URL list for the Curator target when DLOCK_ZK_URL is unset.
const CURATOR_WITHOUT_ZK: &str = "curator-without-zk";

/// Reads the rows of an earlier `--json` run.
/// A ratio to the floor that fell more than this fraction below the baseline's.
const REGRESSION: f64 = 0.20;

/// The ratios of `rows` that fell more than [`REGRESSION`] below those of the same backend
/// and workload in `baseline`, as lines to print.
fn regressions(baseline: &[Row], rows: &[Row]) -> Vec<String> {
    let mut found = Vec::new();
    for r in rows {
        let Some(now) = r.ratio_to_floor else {
            continue;
        };
        let before = baseline
            .iter()
            .find(|b| b.backend == r.backend && b.workload == r.workload)
            .and_then(|b| b.ratio_to_floor);
        if let Some(before) = before
            && now < before * (1.0 - REGRESSION)
        {
            found.push(format!(
                "{} {}: {:.0}% of its floor, was {:.0}%",
                r.backend,
                r.workload,
                now * 100.0,
                before * 100.0
            ));
        }
    }
    found
}

/// With `--baseline`: prints the regressions against it; the exit code if the run must fail
/// (a regression: 1, an unreadable file: CONFIG).
fn compare_with_baseline(baseline: Option<&std::path::Path>, rows: &[Row]) -> Option<u8> {
    let path = baseline?;
    let before = match load(path) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("dlock bench: {e}");
            return Some(exit::CONFIG);
        }
    };
    let found = regressions(&before, rows);
    if found.is_empty() {
        say!(
            "no ratio to the floor fell more than 20% below {}",
            path.display()
        );
        return None;
    }
    eprintln!("dlock bench: REGRESSIONS against {}:", path.display());
    for line in &found {
        eprintln!("  {line}");
    }
    Some(1)
}

fn load(path: &std::path::Path) -> Result<Vec<Row>, String> {
    #[derive(Deserialize)]
    struct Doc {
        rows: Vec<Row>,
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str::<Doc>(&text)
        .map(|d| d.rows)
        .map_err(|e| format!("{} is not a dlock bench JSON file: {e}", path.display()))
}

pub(crate) async fn bench(opts: BenchOpts) -> u8 {
    if let Some(path) = &opts.from_json {
        let rows = match load(path) {
            Ok(rows) => rows,
            Err(e) => {
                eprintln!("dlock bench: {e}");
                return exit::CONFIG;
            }
        };
        print_table(&rows);
        if let Some(code) = compare_with_baseline(opts.baseline.as_deref(), &rows) {
            return code;
        }
        if let Some(chart_path) = &opts.chart
            && let Err(e) = chart::draw(chart_path, &rows)
        {
            eprintln!("dlock bench: cannot draw {}: {e}", chart_path.display());
            return exit::SOFTWARE;
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
        if target.curator {
            progress.set_message(target.label.clone());
            let url = Some(target.url.as_str()).filter(|u| !u.is_empty());
            let curator_rows = curator::rows(url, &opts.workload, opts.cycles, opts.duration).await;
            failed |= report_errors(&curator_rows, &progress);
            rows.extend(curator_rows);
            progress.inc(opts.workload.len() as u64);
            continue;
        }
        if target.sqlx_pg {
            progress.set_message(target.label.clone());
            let peer_rows = sqlx_peer(target, &opts).await;
            failed |= report_errors(&peer_rows, &progress);
            rows.extend(peer_rows);
            progress.inc(opts.workload.len() as u64);
            continue;
        }
        for workload in &opts.workload {
            progress.set_message(format!("{} {workload:?}", target.label));
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
                    Row {
                        backend: target.label.clone(),
                        workload: format!("{workload:?}"),
                        skipped: Some(format!("error: {e}")),
                        ..Row::default()
                    }
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
    if let Some(path) = &opts.json {
        let doc = serde_json::json!({
            "version": 1,
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "machine": { "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) },
            "rows": rows,
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("dlock bench: cannot write {}: {e}", path.display());
            return exit::SOFTWARE;
        }
    }
    if let Some(path) = &opts.chart
        && let Err(e) = chart::draw(path, &rows)
    {
        eprintln!("dlock bench: cannot draw {}: {e}", path.display());
        return exit::SOFTWARE;
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

/// Latencies from 1 µs to 10 min with 3 significant digits.
fn histogram() -> dlock::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000, 3)
        .map_err(|e| dlock::Error::config(format!("latency histogram: {e}")))
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn fill_latency(row: &mut Row, h: &Histogram<u64>) {
    if h.is_empty() {
        return;
    }
    row.acquire_p50_us = h.value_at_quantile(0.5);
    row.acquire_p99_us = h.value_at_quantile(0.99);
    row.acquire_p999_us = h.value_at_quantile(0.999);
}

/// Adds a block of `done` cycles of `target`'s floor of kind `kind` to `sum` (cycles,
/// seconds); a store without that floor sets `sum` to `None`.
async fn add_floor(
    sum: &mut Option<FloorSum>,
    target: &Target,
    done: u64,
    ns: &str,
    kind: Floor,
) -> dlock::Result<()> {
    if let Some(s) = sum.as_mut() {
        match floor::cycles_per_sec(&target.url, done.max(1), ns, kind).await? {
            Some(m) => {
                s.cycles += done.max(1);
                s.secs += done.max(1) as f64 / m.rate;
                s.cpu = s.cpu.zip(m.cpu).and_then(|(a, b)| a.checked_add(b));
            }
            None => *sum = None,
        }
    }
    Ok(())
}

/// A W1 floor's blocks so far: cycles, seconds, CPU time.
#[derive(Clone, Copy)]
struct FloorSum {
    cycles: u64,
    secs: f64,
    cpu: Option<Duration>,
}

impl FloorSum {
    const ZERO: Self = Self {
        cycles: 0,
        secs: 0.0,
        cpu: Some(Duration::ZERO),
    };

    /// Cycles per second and CPU microseconds per cycle; `None` if no time was measured.
    fn rates(self) -> Option<(f64, Option<f64>)> {
        (self.secs > 0.0 && self.cycles > 0).then(|| {
            (
                self.cycles as f64 / self.secs,
                self.cpu.map(|c| c.as_secs_f64() * 1e6 / self.cycles as f64),
            )
        })
    }
}

fn out_of_time(started: Instant, limit: Option<Duration>) -> bool {
    limit.is_some_and(|l| started.elapsed() >= l)
}

async fn run_workload(target: &Target, workload: Workload, opts: &BenchOpts) -> dlock::Result<Row> {
    let mut row = Row {
        backend: target.label.clone(),
        workload: format!("{workload:?}"),
        ..Row::default()
    };
    let ns = format!("dlock-bench/{}/{}", std::process::id(), uuid_like());
    let limit = opts.duration;
    match workload {
        Workload::W1 => {
            let p = target.client().await?;
            let lock = p.lock(&format!("{ns}/w1"), LockOptions::default())?;
            for _ in 0..200.min(opts.cycles) {
                lock.acquire().await?.release().await?;
            }
            let mut h = histogram()?;
            // dlock and its floor take turns, a block of cycles at a time, so that a slow
            // spell of the server (a checkpoint, a disk's flushes, another process) falls on
            // both alike instead of on whichever ran then.
            let block = (opts.cycles / W1_BLOCKS).max(1);
            let (mut n, mut spent, mut cpu) = (0, Duration::ZERO, Some(Duration::ZERO));
            let mut floor = (!target.broken).then_some(FloorSum::ZERO);
            // for-update: also the row lock alone, to show what its fence costs.
            let mut lock_floor = (!target.broken).then_some(FloorSum::ZERO);
            while n < opts.cycles && limit.is_none_or(|l| spent < l) {
                let before = cpu_time();
                let started = Instant::now();
                let mut done = 0;
                let left = limit.map(|l| l.saturating_sub(spent));
                while done < block && n < opts.cycles && !out_of_time(started, left) {
                    let t = Instant::now();
                    lock.acquire().await?.release().await?;
                    let _ = h.record(us(t.elapsed()));
                    done += 1;
                    n += 1;
                }
                spent = spent.saturating_add(started.elapsed());
                cpu = cpu
                    .zip(cpu_time().zip(before))
                    .and_then(|(sum, (now, before))| sum.checked_add(now.checked_sub(before)?));
                add_floor(&mut floor, target, done, &ns, Floor::Cycle).await?;
                add_floor(&mut lock_floor, target, done, &ns, Floor::LockOnly).await?;
            }
            finish(&mut row, n, spent);
            row.cpu_us_per_cycle =
                cpu.and_then(|c| (n > 0).then(|| c.as_secs_f64() * 1e6 / n as f64));
            fill_latency(&mut row, &h);
            if let Some((rate, cpu)) = floor.and_then(FloorSum::rates) {
                row.floor_cycles_per_sec = Some(rate);
                row.ratio_to_floor = Some(row.cycles_per_sec / rate);
                row.floor_cpu_us_per_cycle = cpu;
            }
            if let Some((rate, _)) = lock_floor.and_then(FloorSum::rates) {
                row.lock_floor_cycles_per_sec = Some(rate);
                row.ratio_to_lock_floor = Some(row.cycles_per_sec / rate);
            }
        }
        Workload::W2 | Workload::W2F | Workload::W4 => {
            let one_name = workload != Workload::W4;
            let fair = workload == Workload::W2F;
            let total = opts.cycles * 2;
            let per = total / 8;
            let counter = Arc::new(AtomicU64::new(0));
            let inside = Arc::new(AtomicU64::new(0));
            let overlaps = Arc::new(AtomicU64::new(0));
            // The worker that held last (8: nobody yet), and how often the holder changed.
            let last = Arc::new(AtomicU64::new(8));
            let switches = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            let mut clients = Vec::new();
            for _ in 0..8 {
                clients.push(target.client().await?);
            }
            if fair && !clients.iter().all(|c| c.capabilities().fair) {
                row.skipped = Some("no fair locks".into());
                return Ok(row);
            }
            // Every handle is made before any worker starts: a worker waits for all the
            // others (below), so none may be missing.
            let mut workers = Vec::new();
            for (i, p) in clients.into_iter().enumerate() {
                let name = if one_name {
                    format!("{ns}/w2")
                } else {
                    format!("{ns}/w4/{i}")
                };
                let lock = p.lock(&name, LockOptions::default().with_fair(fair))?;
                workers.push((i, p, lock, histogram()?));
            }
            let cpu = cpu_time();
            let started = Instant::now();
            // Every worker starts its cycles once all are spawned: on a fast store the first
            // one would otherwise run many cycles alone (no contention, no owner switch)
            // before the last one is spawned. Nothing a worker does before it waits can fail.
            let together = Arc::new(tokio::sync::Barrier::new(workers.len()));
            for (i, p, lock, mut h) in workers {
                let (counter, inside, overlaps, last, switches) = (
                    Arc::clone(&counter),
                    Arc::clone(&inside),
                    Arc::clone(&overlaps),
                    Arc::clone(&last),
                    Arc::clone(&switches),
                );
                let me = i as u64;
                let together = Arc::clone(&together);
                tasks.push(tokio::spawn(async move {
                    let _client = p; // its connections live as long as the worker
                    together.wait().await;
                    let mut done = 0u64;
                    while done < per && !out_of_time(started, limit) {
                        let t = Instant::now();
                        let g = lock.acquire().await?;
                        let _ = h.record(us(t.elapsed()));
                        // On one name, the critical section checks exclusion and counts the
                        // owner switches; W4's names are each worker's own, so it does
                        // nothing its floor does not.
                        if one_name {
                            if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            if last.swap(me, Ordering::SeqCst) != me {
                                switches.fetch_add(1, Ordering::SeqCst);
                            }
                            let seen = counter.load(Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            counter.store(seen + 1, Ordering::SeqCst);
                            inside.fetch_sub(1, Ordering::SeqCst);
                        }
                        g.release().await?;
                        done += 1;
                    }
                    Ok::<_, dlock::Error>((h, done))
                }));
            }
            let mut h = histogram()?;
            let mut done = 0;
            for t in tasks {
                let (th, n) = t
                    .await
                    .map_err(|e| dlock::Error::config(format!("worker panicked: {e}")))??;
                let _ = h.add(&th);
                done += n;
            }
            finish(&mut row, done, started.elapsed());
            row.cpu_us_per_cycle = cpu_per_cycle(cpu, done);
            fill_latency(&mut row, &h);
            row.max_wait_ms = Some(h.max() as f64 / 1000.0);
            if one_name {
                let lost = done.saturating_sub(counter.load(Ordering::SeqCst));
                row.violations = overlaps.load(Ordering::SeqCst) + lost;
                // The first grant is no switch (nobody held before it).
                let switched = switches.load(Ordering::SeqCst).saturating_sub(1);
                row.owner_switch_pct =
                    Some(100.0 * switched as f64 / done.saturating_sub(1).max(1) as f64);
            } else if !target.broken
                && let Some(floor) = floor::concurrent_cycles_per_sec(&target.url, per, &ns).await?
            {
                row.floor_cycles_per_sec = Some(floor);
                row.ratio_to_floor = Some(row.cycles_per_sec / floor);
            }
        }
        Workload::W3 => handoff(target, &ns, opts, &mut row).await?,
        Workload::W5 => fairness(target, &ns, &mut row).await?,
        Workload::W6 => scale(target, &ns, opts, &mut row).await?,
    }
    Ok(row)
}

/// The process's CPU time so far (user + system), where `getrusage` answers.
fn cpu_time() -> Option<Duration> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).ok()?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).ok()?)
            .checked_add(Duration::from_micros(u64::try_from(t.tv_usec()).ok()?))
    };
    tv(usage.user_time())?.checked_add(tv(usage.system_time())?)
}

/// CPU microseconds per cycle since `before` (from [`cpu_time`]).
fn cpu_per_cycle(before: Option<Duration>, cycles: u64) -> Option<f64> {
    let spent = cpu_time()?.checked_sub(before?)?;
    (cycles > 0).then(|| spent.as_secs_f64() * 1e6 / cycles as f64)
}

fn finish(row: &mut Row, cycles: u64, elapsed: Duration) {
    row.cycles = cycles;
    row.seconds = elapsed.as_secs_f64();
    row.cycles_per_sec = if row.seconds > 0.0 {
        cycles as f64 / row.seconds
    } else {
        0.0
    };
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

/// The rows of the sqlx `PgAdvisoryLock` target (none without the `postgres` feature).
async fn sqlx_peer(target: &Target, opts: &BenchOpts) -> Vec<Row> {
    #[cfg(feature = "postgres")]
    {
        let ns = format!("dlock-bench/{}/{}", std::process::id(), uuid_like());
        sqlx_pg::rows(&target.url, &ns, &opts.workload, opts.cycles, opts.duration).await
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (target, opts);
        Vec::new()
    }
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}")
}

/// W3: two clients pass the lock back and forth; a handoff is the time from the holder's
/// release returning to the waiter's acquire returning.
async fn handoff(target: &Target, ns: &str, opts: &BenchOpts, row: &mut Row) -> dlock::Result<()> {
    let handoffs = (opts.cycles / 4).max(2);
    let name = format!("{ns}/w3");
    let a = target.client().await?.lock(&name, LockOptions::default())?;
    let b = target.client().await?.lock(&name, LockOptions::default())?;
    let mut h = histogram()?;
    let mut held = a.acquire().await?;
    let mut holder_is_a = true;
    let started = Instant::now();
    let mut n = 0;
    while n < handoffs && !out_of_time(started, opts.duration) {
        let waiter = if holder_is_a {
            Arc::clone(&b)
        } else {
            Arc::clone(&a)
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<Instant>();
        let task = tokio::spawn(async move {
            let g = waiter.acquire().await;
            (g, Instant::now(), rx.await.ok())
        });
        // Let the waiter reach the store before the release.
        tokio::time::sleep(Duration::from_millis(2)).await;
        held.release().await?;
        let released = Instant::now();
        let _ = tx.send(released);
        let (g, acquired, _) = task
            .await
            .map_err(|e| dlock::Error::config(format!("waiter panicked: {e}")))?;
        held = g?;
        let _ = h.record(us(acquired.saturating_duration_since(released)));
        holder_is_a = !holder_is_a;
        n += 1;
    }
    held.release().await?;
    finish(row, n, started.elapsed());
    if !h.is_empty() {
        row.handoff_p50_us = Some(h.value_at_quantile(0.5));
        row.handoff_p99_us = Some(h.value_at_quantile(0.99));
    }
    Ok(())
}

/// W5: 8 waiters queue in a known order on a fair lock; how many are served out of order.
async fn fairness(target: &Target, ns: &str, row: &mut Row) -> dlock::Result<()> {
    let p = target.client().await?;
    if !p.capabilities().fair {
        row.skipped = Some("no fair locks".into());
        return Ok(());
    }
    let name = format!("{ns}/w5");
    let opts = LockOptions::new().with_fair(true);
    let holder = p.lock(&name, opts)?.acquire().await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let started = Instant::now();
    for i in 0..8u64 {
        let lock = target.client().await?.lock(&name, opts)?;
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let asked = Instant::now();
            let g = lock.acquire().await?;
            let waited = asked.elapsed();
            order.lock().map(|mut o| o.push(i)).ok();
            g.release().await?;
            Ok::<_, dlock::Error>(waited)
        }));
        // Queue them one after the other.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    holder.release().await?;
    let mut h = histogram()?;
    let mut waits = Vec::new();
    for t in tasks {
        let w = t
            .await
            .map_err(|e| dlock::Error::config(format!("waiter panicked: {e}")))??;
        let _ = h.record(us(w));
        waits.push(w);
    }
    let order = order.lock().map(|o| o.clone()).unwrap_or_default();
    finish(row, order.len() as u64, started.elapsed());
    fill_latency(row, &h);
    row.out_of_order = Some(
        order
            .iter()
            .enumerate()
            .filter(|(i, v)| *i as u64 != **v)
            .count() as u64,
    );
    if let (Some(min), Some(max)) = (waits.iter().min(), waits.iter().max()) {
        row.wait_spread_ms = Some((*max - *min).as_secs_f64() * 1000.0);
    }
    Ok(())
}

/// W6: one client holds 1,000 locks at once, then releases them.
async fn scale(target: &Target, ns: &str, opts: &BenchOpts, row: &mut Row) -> dlock::Result<()> {
    let count = opts.cycles.clamp(2, 1000);
    let before_conn = floor::server_connections(&target.url).await;
    let rss_before = rss_kib();
    let p = target.client().await?;
    let lease = LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(30)));
    let started = Instant::now();
    let mut h = histogram()?;
    let mut guards = Vec::with_capacity(usize::try_from(count).unwrap_or(1000));
    for i in 0..count {
        let t = Instant::now();
        // Bounded: a backend whose holds pin a resource (for-update: a connection each) may
        // not manage 1,000 at once; that is a finding, not a hang.
        match p
            .lock(&format!("{ns}/w6/{i}"), lease)?
            .try_acquire(Duration::from_secs(5))
            .await
        {
            Ok(Some(g)) => guards.push(g),
            Ok(None) => {
                row.skipped = Some(format!(
                    "held {i} locks at once, then waited 5 s in vain for one more (each hold pins a resource: size the pool)"
                ));
                break;
            }
            // The store's own word for its limit (for-update: the pool is exhausted) ends
            // the workload with what it managed, as the bounded wait does.
            Err(e) if !e.is_retryable() && i > 0 => {
                row.skipped = Some(format!("held {i} locks at once, then: {e}"));
                break;
            }
            Err(e) => return Err(e),
        }
        let _ = h.record(us(t.elapsed()));
    }
    let count = guards.len() as u64;
    let during_conn = floor::server_connections(&target.url).await;
    row.memory_kib = match (rss_before, rss_kib()) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    row.server_connections = match (before_conn, during_conn) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    for g in guards {
        g.release().await?;
    }
    finish(row, count, started.elapsed());
    fill_latency(row, &h);
    Ok(())
}

/// Resident memory of this process, KiB (Linux).
fn rss_kib() -> Option<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4)
}

fn print_table(rows: &[Row]) {
    say!(
        "{:<24} {:<3} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8}  notes",
        "backend",
        "wl",
        "cycles",
        "cycles/s",
        "acq p50",
        "acq p99",
        "acq p999",
        "hand p50",
        "hand p99",
        "viol",
        "x floor",
    );
    for r in rows {
        let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| format!("{v}us"));
        let mut notes = Vec::new();
        if let Some(s) = &r.skipped {
            notes.push(format!("skipped: {s}"));
        }
        if let Some(o) = r.out_of_order {
            notes.push(format!(
                "out of order {o}/8, spread {:.1} ms",
                r.wait_spread_ms.unwrap_or(0.0)
            ));
        }
        if let Some(m) = r.memory_kib {
            notes.push(format!("mem +{m} KiB"));
        }
        if let Some(c) = r.server_connections {
            notes.push(format!("server conns +{c}"));
        }
        if let Some(f) = r.floor_cycles_per_sec {
            notes.push(match r.floor_cpu_us_per_cycle {
                Some(c) => format!("floor {f:.0}/s ({c:.0} us cpu/cycle)"),
                None => format!("floor {f:.0}/s"),
            });
        }
        if let (Some(f), Some(x)) = (r.lock_floor_cycles_per_sec, r.ratio_to_lock_floor) {
            notes.push(format!("{:.0}% of the lock alone ({f:.0}/s)", x * 100.0));
        }
        if let Some(s) = r.owner_switch_pct {
            notes.push(format!("owner switches {s:.0}%"));
        }
        if let Some(m) = r.max_wait_ms {
            notes.push(format!("max wait {m:.1} ms"));
        }
        if let Some(c) = r.cpu_us_per_cycle {
            notes.push(format!("cpu {c:.0} us/cycle"));
        }
        say!(
            "{:<24} {:<3} {:>7} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8}  {}",
            r.backend,
            r.workload,
            r.cycles,
            r.cycles_per_sec,
            format!("{}us", r.acquire_p50_us),
            format!("{}us", r.acquire_p99_us),
            format!("{}us", r.acquire_p999_us),
            opt(r.handoff_p50_us),
            opt(r.handoff_p99_us),
            r.violations,
            r.ratio_to_floor
                .map_or("-".to_owned(), |x| format!("{:.0}%", x * 100.0)),
            notes.join("; ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{Row, label_of, regressions};

    /// A ratio that fell more than 20 % is a regression; one that fell less, rose, or has
    /// nothing to compare with is not.
    #[test]
    fn regressions_are_ratios_that_fell_more_than_a_fifth() {
        let row = |backend: &str, workload: &str, ratio: Option<f64>| Row {
            backend: backend.into(),
            workload: workload.into(),
            ratio_to_floor: ratio,
            ..Row::default()
        };
        let before = [
            row("redis", "W1", Some(0.90)),
            row("redis", "W4", Some(0.90)),
            row("zk", "W1", Some(0.90)),
        ];
        let now = [
            row("redis", "W1", Some(0.70)),
            row("redis", "W4", Some(0.75)),
            row("zk", "W1", Some(1.20)),
            row("etcd", "W1", Some(0.10)),
            row("zk", "W4", None),
        ];
        assert_eq!(
            regressions(&before, &now),
            ["redis W1: 70% of its floor, was 90%"]
        );
    }

    #[test]
    fn labels_name_the_backend_and_strategy() {
        assert_eq!(label_of("sqlite:///tmp/x.db"), "sqlite/unique-insert");
        assert_eq!(
            label_of("mysql://u@h/db?strategy=for-update&pool=64"),
            "mysql/for-update"
        );
        assert_eq!(
            label_of("postgresql://u@h/db?pool=64&strategy=optimistic"),
            "postgres/optimistic"
        );
        assert_eq!(label_of("postgres://u@h/db"), "postgres/unique-insert");
        assert_eq!(label_of("redis://h:7000/?cluster=true"), "redis-cluster");
        assert_eq!(label_of("zk://h:2181"), "zk");
    }
}
