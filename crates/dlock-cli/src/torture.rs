//! `dlock torture`: many worker processes contend for a few names with every primitive while
//! faults are injected on a schedule drawn from a seed (proxy faults in front of the store:
//! partitions, one-way cuts, latency, resets, delayed replies; process faults: SIGSTOP past the
//! lease, SIGKILL), each hold writes to a shared resource that rejects stale fencing tokens,
//! and a checker reads the whole history and says whether the contract held.

mod check;
mod history;
mod resource;
mod worker;

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::{Args, ValueEnum};
use dlock::backend::{from_now, later};
use dlock_proxy::{Fault, Proxy};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub use self::history::FaultKind;
use self::history::{FaultRecord, Stamped, WorkerEvent, now_ns};
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

    /// The faults to inject.
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
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub lease: Duration,

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

/// Tiny, stable pseudo-random numbers (SplitMix64): a seed replays the same run on any
/// version of anything.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 for `n` = 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = u64::try_from(high.saturating_sub(low).as_millis()).unwrap_or(0);
        low.saturating_add(Duration::from_millis(self.below(span + 1)))
    }
}

/// One planned fault.
#[derive(Debug, Clone, Copy)]
struct Planned {
    /// When, from the start of the attack.
    at: Duration,
    kind: FaultKind,
    slot: usize,
    /// How long it lasts (zero for a reset or a kill).
    lasts: Duration,
    /// The added latency, for `Latency`.
    latency: Duration,
    /// Which way, for `OneWay`.
    upstream: bool,
}

/// The schedule of a run: one fault at a time, every one healed before the next, drawn from
/// the seed.
fn schedule(seed: u64, opts: &TortureOpts, kinds: &[FaultKind], slots: usize) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let mut plan = Vec::new();
    if kinds.is_empty() {
        return plan;
    }
    let lease = opts.lease;
    let mut at = lease;
    let stop = opts.duration.saturating_sub(lease * 2);
    while at < stop {
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let slot = rng.below(slots as u64) as usize;
        let lasts = match kind {
            FaultKind::Pause | FaultKind::Partition | FaultKind::OneWay | FaultKind::Delay => {
                rng.between(lease * 3 / 2, lease * 3)
            }
            FaultKind::Latency => rng.between(lease / 2, lease * 2),
            FaultKind::Reset | FaultKind::Kill | FaultKind::Restart => Duration::ZERO,
        };
        plan.push(Planned {
            at,
            kind,
            slot,
            lasts,
            latency: Duration::from_millis(50 + rng.below(251)),
            upstream: rng.below(2) == 0,
        });
        at = at
            .saturating_add(lasts)
            .saturating_add(rng.between(lease / 2, lease * 2));
    }
    plan
}

/// The report of one store.
#[derive(Debug, Serialize)]
struct StoreReport {
    url: String,
    seed: u64,
    processes: u32,
    duration_s: f64,
    primitives: Vec<String>,
    faults_planned: usize,
    command: String,
    #[serde(flatten)]
    report: check::Report,
}

pub(crate) async fn torture(opts: TortureOpts) -> u8 {
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
        if applicable(&opts, url).1.is_empty() {
            eprintln!(
                "dlock: {}: none of the requested faults can hit it (a store without a \
                 network to attack, a Redis Cluster or a Sentinel group takes pause, kill and \
                 restart)",
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
                print_report(&r);
                if !r.report.violations.is_empty() {
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

fn print_report(r: &StoreReport) {
    let rep = &r.report;
    say!(
        "{}: {} processes, {:.0} s, seed {}: {} holds; faults {:?}",
        dlock::redact(&r.url),
        r.processes,
        r.duration_s,
        r.seed,
        rep.holds,
        rep.faults
    );
    say!(
        "  fenced writes: {} accepted, {} refused as stale, {} fencing violations; {} grants \
         stamped late after a pause",
        rep.fenced_accepted,
        rep.fenced_refused,
        rep.fenced_violations,
        rep.late_grants_explained
    );
    say!(
        "  overlaps: {} explained by a fault, {} unexplained; {} unfenced updates lost",
        rep.overlaps_explained,
        rep.overlaps_unexplained,
        rep.unfenced_lost_updates
    );
    let reasons: Vec<String> = rep
        .losses_by_reason
        .iter()
        .map(|(reason, n)| format!("{reason}: {n}"))
        .collect();
    say!(
        "  losses reported: {}{}{}; worst report delay after an overlap began: {}; worst \
         recovery after a fault: {}",
        rep.losses_reported,
        if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join(", "))
        },
        if rep.lost_before_use == 0 {
            String::new()
        } else {
            format!(
                ", and {} holds lost before their critical section began (not used)",
                rep.lost_before_use
            )
        },
        rep.worst_report_delay_ms
            .map_or("-".to_string(), |d| format!("{d} ms")),
        rep.worst_recovery_ms
            .map_or("-".to_string(), |d| format!("{d} ms"))
    );
    say!("  replay: {}", r.command);
    if rep.violations.is_empty() {
        say!("  no violation");
    } else {
        say!("  {} VIOLATIONS:", rep.violations.len());
        for v in &rep.violations {
            say!("  - {v}");
        }
    }
}

/// Whether a store's clients learn the data servers' addresses from the servers (a Redis
/// Cluster, a Sentinel group), past any proxy: such a store gets the process faults and
/// restarts only. Read from the parsed URL, as the Redis backend reads it.
fn learns_addresses(url: &str) -> bool {
    let Ok(parsed) = url::Url::parse(url) else {
        return false;
    };
    match parsed.scheme() {
        "redis+sentinel" | "rediss+sentinel" => true,
        "redis" | "rediss" => parsed
            .query_pairs()
            .any(|(k, v)| k == "cluster" && matches!(&*v, "true" | "1" | "yes")),
        _ => false,
    }
}

/// A URL split around its host list: the head, the `host:port`s, the rest ([`hosts`]).
type Split = (String, Vec<String>, String);

/// The proxy split of `url` (`None`: no proxies) and the requested faults that can hit it.
fn applicable(opts: &TortureOpts, url: &str) -> (Option<Split>, Vec<FaultKind>) {
    let split = hosts(url).filter(|_| !learns_addresses(url));
    let kinds = opts
        .faults
        .iter()
        .copied()
        .filter(|k| split.is_some() || !k.needs_proxy())
        .collect();
    (split, kinds)
}

/// Splits `scheme://[userinfo@]host:port[,host:port...][/rest]` into the head before the
/// hosts, the host:port list (with the scheme's default port filled in) and the rest.
fn hosts(url: &str) -> Option<Split> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let default = match scheme {
        "redis" | "rediss" => 6379,
        "mysql" | "mariadb" => 3306,
        "zk" => 2181,
        "postgres" | "postgresql" => 5432,
        "etcd" | "etcds" => 2379,
        _ => return None,
    };
    let hosts = hostlist
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            let has_port = h.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']'));
            if has_port {
                h.to_owned()
            } else {
                format!("{h}:{default}")
            }
        })
        .collect();
    Some((format!("{scheme}://{userinfo}"), hosts, tail.to_owned()))
}

/// One worker slot: its proxies (one per server) and the process in it now.
struct Slot {
    proxies: Vec<Proxy>,
    url: String,
    child: Option<Child>,
    worker: u32,
    pid: Option<Pid>,
    /// The tasks reading what this slot's workers (the current one and those it replaced)
    /// write; each ends at its worker's end of output.
    readers: Vec<tokio::task::JoinHandle<()>>,
}

type Shared<T> = Arc<Mutex<T>>;

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn attack(
    opts: &TortureOpts,
    url: &str,
    seed: u64,
    exe: &std::path::Path,
    history_out: Option<&mut std::io::BufWriter<std::fs::File>>,
) -> Result<StoreReport, u8> {
    let shown = dlock::redact(url);
    if url.starts_with("memory:") {
        eprintln!(
            "dlock: {shown}: a memory store lives inside one process; torture needs a store \
             its worker processes share (sqlite://, redis://, zk://, mysql://, ...)"
        );
        return Err(exit::CONFIG);
    }
    let locks = dlock::connect(url)
        .await
        .map_err(|e| crate::fail(&format!("cannot use {shown}"), &e))?;
    let caps = locks.capabilities();
    let primitives: Vec<Primitive> = opts
        .primitives
        .iter()
        .copied()
        .filter(|p| match p {
            Primitive::Fair => caps.fair,
            Primitive::Rw => caps.read_write,
            Primitive::Semaphore => caps.semaphore,
            Primitive::Mutex | Primitive::Multi => true,
        })
        .collect();
    for p in &opts.primitives {
        if !primitives.contains(p) {
            eprintln!("dlock: {shown} has no {p:?}: left out");
        }
    }
    if primitives.is_empty() {
        eprintln!("dlock: {shown}: none of the requested primitives is supported");
        return Err(exit::CONFIG);
    }
    let (split, kinds) = applicable(opts, url);
    if split.is_none() && kinds.len() < opts.faults.len() {
        let why = if learns_addresses(url) {
            "its clients learn the servers' addresses from the servers, past any proxy"
        } else {
            "it has no network to attack"
        };
        eprintln!("dlock: {shown}: {why}: only process faults (pause, kill) and restarts");
    }
    let resource = resource::Resource::start().await.map_err(|e| {
        eprintln!("dlock: cannot start the shared resource: {e}");
        exit::SOFTWARE
    })?;
    let prefix = format!("torture/{seed:x}/{:x}", now_ns() % 0xffff_ffff);
    let history: Shared<Vec<Stamped>> = Arc::default();
    let holding: Shared<HashMap<u32, i64>> = Arc::default();
    let mut slots = Vec::new();
    let mut next_worker = 0u32;
    for i in 0..opts.processes {
        let (proxies, worker_url) = match &split {
            Some((head, servers, tail)) => {
                let mut proxies = Vec::new();
                for server in servers {
                    let p = Proxy::start(server.as_str()).await.map_err(|e| {
                        eprintln!("dlock: cannot put a proxy in front of {server}: {e}");
                        exit::UNAVAILABLE
                    })?;
                    proxies.push(p);
                }
                let list: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
                (proxies, format!("{head}{}{tail}", list.join(",")))
            }
            None if opts.sabotage == Some(Sabotage::NoExclusion) => {
                (Vec::new(), private_store(url, i))
            }
            None => (Vec::new(), url.to_owned()),
        };
        let mut slot = Slot {
            proxies,
            url: worker_url,
            child: None,
            worker: 0,
            pid: None,
            readers: Vec::new(),
        };
        spawn(
            &mut slot,
            next_worker,
            opts,
            seed,
            &prefix,
            &primitives,
            exe,
            &resource,
            &history,
            &holding,
        )?;
        next_worker += 1;
        slots.push(slot);
    }
    let plan = schedule(seed, opts, &kinds, slots.len());
    let start = now_ns();
    let started = tokio::time::Instant::now();
    let mut faults: Vec<FaultRecord> = Vec::new();
    // The store gets at least a lease of calm after each fault has healed, also when the
    // fault took longer than planned (a restart command): the liveness check measures
    // recovery after each fault, which a fault that follows at once would hide.
    let last_calm = later(started, opts.duration.saturating_sub(opts.lease * 2));
    let mut calm_until = started;
    for planned in &plan {
        let at = later(started, planned.at).max(calm_until);
        if at > last_calm {
            break;
        }
        tokio::time::sleep_until(at).await;
        let record = inject(
            planned,
            &mut slots,
            &mut next_worker,
            opts,
            seed,
            &prefix,
            &primitives,
            exe,
            &resource,
            &history,
            &holding,
        )
        .await;
        match record {
            Ok(record) => {
                faults.push(record);
                calm_until = from_now(opts.lease);
            }
            Err(code) => {
                stop(&mut slots, opts.lease).await;
                return Err(code);
            }
        }
    }
    tokio::time::sleep_until(later(started, opts.duration)).await;
    let end = now_ns();
    stop(&mut slots, opts.lease).await;
    // Every worker has exited: its reader ends once it has read the worker's last line.
    for reader in slots.iter_mut().flat_map(|s| s.readers.drain(..)) {
        if tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .is_err()
        {
            eprintln!("dlock: a worker's output was not closed 5 s after it exited");
        }
    }
    let history = std::mem::take(&mut *guard(&history));
    let ledger = resource.ledger();
    let report = check::check(
        &history,
        &faults,
        &ledger,
        (start, end),
        opts.lease,
        Duration::from_secs(2),
        caps.connection_bound,
    );
    if let Some(out) = history_out {
        for s in &history {
            if let Ok(line) = serde_json::to_string(s) {
                let _ = writeln!(out, "{line}");
            }
        }
        for f in &faults {
            if let Ok(line) = serde_json::to_string(f) {
                let _ = writeln!(out, "{line}");
            }
        }
        for a in &ledger.accepted {
            if let Ok(line) = serde_json::to_string(a) {
                let _ = writeln!(out, "{line}");
            }
        }
        let _ = out.flush();
    }
    let faults_arg: Vec<String> = opts.faults.iter().map(ToString::to_string).collect();
    let prims_arg: Vec<String> = primitives
        .iter()
        .map(|p| format!("{p:?}").to_lowercase())
        .collect();
    Ok(StoreReport {
        url: shown.clone(),
        seed,
        processes: opts.processes,
        duration_s: opts.duration.as_secs_f64(),
        primitives: prims_arg.clone(),
        faults_planned: plan.len(),
        command: format!(
            "dlock torture --url '{shown}' --processes {} --duration {} --faults {} \
             --primitives {} --names {} --lease {} --hold {} --seed {seed}{}",
            opts.processes,
            humantime::format_duration(opts.duration),
            faults_arg.join(","),
            prims_arg.join(","),
            opts.names,
            humantime::format_duration(opts.lease),
            humantime::format_duration(opts.hold),
            opts.restart_cmd
                .as_ref()
                .map_or_else(String::new, |cmd| format!(
                    " --restart-cmd '{}'",
                    cmd.replace('\'', r"'\''")
                )),
        ),
        report,
    })
}

/// A store of its own for worker `i` (the no-exclusion sabotage of an embedded store).
fn private_store(url: &str, i: u32) -> String {
    match url.split_once('?') {
        Some((path, query)) => format!("{path}.w{i}?{query}"),
        None => format!("{url}.w{i}"),
    }
}

#[allow(clippy::too_many_arguments)]
fn spawn(
    slot: &mut Slot,
    worker: u32,
    opts: &TortureOpts,
    seed: u64,
    prefix: &str,
    primitives: &[Primitive],
    exe: &std::path::Path,
    resource: &resource::Resource,
    history: &Shared<Vec<Stamped>>,
    holding: &Shared<HashMap<u32, i64>>,
) -> Result<(), u8> {
    let prims: Vec<String> = primitives
        .iter()
        .map(|p| format!("{p:?}").to_lowercase())
        .collect();
    let mut cmd = Command::new(exe);
    cmd.arg("torture-worker")
        .arg("--id")
        .arg(worker.to_string())
        .arg("--url")
        .arg(&slot.url)
        .arg("--resource")
        .arg(resource.addr().to_string())
        .arg("--seed")
        .arg(seed.to_string())
        .arg("--prefix")
        .arg(prefix)
        .arg("--names")
        .arg(opts.names.to_string())
        .arg("--primitives")
        .arg(prims.join(","))
        .arg("--lease")
        .arg(format!("{}ms", opts.lease.as_millis()))
        .arg("--hold")
        .arg(format!("{}ms", opts.hold.as_millis()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(s) = opts.sabotage
        && s != Sabotage::NoExclusion
    {
        cmd.arg("--sabotage").arg(
            s.to_possible_value()
                .map_or_else(String::new, |v| v.get_name().to_owned()),
        );
    }
    let mut child = cmd.spawn().map_err(|e| {
        eprintln!("dlock: cannot start a worker: {e}");
        exit::SOFTWARE
    })?;
    let Some(stdout) = child.stdout.take() else {
        return Err(exit::SOFTWARE);
    };
    let history = Arc::clone(history);
    let holding = Arc::clone(holding);
    let reader = tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(event) = serde_json::from_str::<WorkerEvent>(&line) else {
                continue;
            };
            match &event {
                WorkerEvent::Grant { .. } => *guard(&holding).entry(worker).or_default() += 1,
                WorkerEvent::Exit { .. } => *guard(&holding).entry(worker).or_default() -= 1,
                _ => {}
            }
            guard(&history).push(Stamped { worker, event });
        }
    });
    slot.pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    slot.child = Some(child);
    slot.worker = worker;
    slot.readers.push(reader);
    Ok(())
}

/// Applies one planned fault, waits until it has healed, and says what happened.
#[allow(clippy::too_many_arguments)]
async fn inject(
    planned: &Planned,
    slots: &mut [Slot],
    next_worker: &mut u32,
    opts: &TortureOpts,
    seed: u64,
    prefix: &str,
    primitives: &[Primitive],
    exe: &std::path::Path,
    resource: &resource::Resource,
    history: &Shared<Vec<Stamped>>,
    holding: &Shared<HashMap<u32, i64>>,
) -> Result<FaultRecord, u8> {
    let slot_count = slots.len();
    let mut index = planned.slot % slot_count;
    // Pauses and kills hit a holder when there is one (a waiter otherwise).
    if matches!(planned.kind, FaultKind::Pause | FaultKind::Kill) {
        let until = from_now(opts.lease);
        loop {
            let holder = {
                let held = guard(holding);
                (0..slot_count)
                    .map(|k| (index + k) % slot_count)
                    .find(|i| held.get(&slots[*i].worker).copied().unwrap_or(0) > 0)
            };
            if let Some(i) = holder {
                index = i;
                break;
            }
            if tokio::time::Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let slot = &mut slots[index];
    let worker = slot.worker;
    let start = now_ns();
    let set = |slot: &Slot, fault: Fault| {
        for p in &slot.proxies {
            p.set_fault(fault);
        }
    };
    match planned.kind {
        FaultKind::Pause => {
            if let Some(pid) = slot.pid {
                let _ = kill(pid, Signal::SIGSTOP);
                tokio::time::sleep(planned.lasts).await;
                let _ = kill(pid, Signal::SIGCONT);
            }
        }
        FaultKind::Kill => {
            if let Some(mut child) = slot.child.take() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            let end = now_ns();
            spawn(
                slot,
                *next_worker,
                opts,
                seed,
                prefix,
                primitives,
                exe,
                resource,
                history,
                holding,
            )?;
            *next_worker += 1;
            return Ok(FaultRecord {
                kind: planned.kind,
                worker,
                start,
                end,
            });
        }
        FaultKind::Partition => {
            set(slot, Fault::Partition);
            tokio::time::sleep(planned.lasts).await;
            set(slot, Fault::None);
        }
        FaultKind::OneWay => {
            set(
                slot,
                if planned.upstream {
                    Fault::Upstream
                } else {
                    Fault::Downstream
                },
            );
            tokio::time::sleep(planned.lasts).await;
            set(slot, Fault::None);
        }
        FaultKind::Latency => {
            set(slot, Fault::Latency(planned.latency));
            tokio::time::sleep(planned.lasts).await;
            set(slot, Fault::None);
        }
        FaultKind::Delay => {
            set(slot, Fault::DelayReplies(opts.lease + opts.lease / 2));
            tokio::time::sleep(planned.lasts).await;
            set(slot, Fault::None);
        }
        FaultKind::Reset => {
            for p in &slot.proxies {
                p.reset();
            }
        }
        FaultKind::Restart => {
            restart(opts).await?;
            return Ok(FaultRecord {
                kind: planned.kind,
                worker: history::EVERY_WORKER,
                start,
                end: now_ns(),
            });
        }
    }
    Ok(FaultRecord {
        kind: planned.kind,
        worker,
        start,
        end: now_ns(),
    })
}

/// A restart command as messages and reports show it: the passwords of URLs in it, and the
/// word after `-a` or `--pass` (redis-cli's password options), masked.
fn shown(cmd: &str) -> String {
    let mut out = Vec::new();
    let mut mask_next = false;
    for word in cmd.split(' ') {
        if mask_next && !word.is_empty() {
            out.push("***".to_owned());
            mask_next = false;
            continue;
        }
        mask_next = matches!(word, "-a" | "--pass" | "--password");
        out.push(dlock::redact(word));
    }
    out.join(" ")
}

/// How long a `--restart-cmd` may take.
const RESTART_PATIENCE: Duration = Duration::from_secs(60);

/// Runs `--restart-cmd` and waits for it (in its own process group, killed with it if it
/// overruns [`RESTART_PATIENCE`]).
async fn restart(opts: &TortureOpts) -> Result<(), u8> {
    let Some(cmd) = &opts.restart_cmd else {
        eprintln!("dlock: --faults restart needs --restart-cmd");
        return Err(exit::CONFIG);
    };
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            eprintln!("dlock: cannot run the restart command: {e}");
            exit::SOFTWARE
        })?;
    match tokio::time::timeout(RESTART_PATIENCE, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => {
            eprintln!(
                "dlock: the restart command failed ({status}): {}",
                shown(cmd)
            );
            Err(exit::SOFTWARE)
        }
        Ok(Err(e)) => {
            eprintln!("dlock: the restart command: {e}");
            Err(exit::SOFTWARE)
        }
        Err(_) => {
            if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
                let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.wait().await;
            eprintln!(
                "dlock: the restart command did not end within {}s: {}",
                RESTART_PATIENCE.as_secs(),
                shown(cmd)
            );
            Err(exit::SOFTWARE)
        }
    }
}

/// Heals everything, asks every worker to stop (closing its stdin), waits for them, and kills
/// by pid the ones that do not stop.
async fn stop(slots: &mut [Slot], lease: Duration) {
    for slot in slots.iter_mut() {
        for p in &slot.proxies {
            p.set_fault(Fault::None);
        }
        if let Some(pid) = slot.pid {
            let _ = kill(pid, Signal::SIGCONT);
        }
        if let Some(child) = slot.child.as_mut() {
            drop(child.stdin.take());
        }
    }
    let limit = lease * 3 + Duration::from_secs(5);
    for slot in slots.iter_mut() {
        if let Some(mut child) = slot.child.take()
            && tokio::time::timeout(limit, child.wait()).await.is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_proxyable_hosts() {
        let (head, list, tail) = hosts("mysql://u:p@db.example/app?strategy=x").unwrap();
        assert_eq!(head, "mysql://u:p@");
        assert_eq!(list, ["db.example:3306"]);
        assert_eq!(tail, "/app?strategy=x");
        let (_, list, tail) = hosts("zk://a:1,b,[::1]:3/chroot").unwrap();
        assert_eq!(list, ["a:1", "b:2181", "[::1]:3"]);
        assert_eq!(tail, "/chroot");
        assert!(hosts("sqlite:///tmp/x.db").is_none());
        assert!(hosts("redis://h").is_some_and(|(_, l, _)| l == ["h:6379"]));
    }

    #[test]
    fn clusters_and_sentinel_groups_are_read_from_the_url() {
        for url in [
            "redis://h:7000?cluster=true",
            "redis://h:7000/?cluster=1",
            "rediss://h:7000?timeout_ms=5&cluster=yes",
            "redis+sentinel://s1,s2/master",
        ] {
            assert!(learns_addresses(url), "{url}");
        }
        for url in [
            "redis://h:7000?cluster=false",
            "mysql://u:p@sentinel-db/app",
            "redis://u:cluster=true@h",
            "zk://sentinel:2181",
        ] {
            assert!(!learns_addresses(url), "{url}");
        }
    }

    #[test]
    fn restart_commands_are_shown_without_passwords() {
        assert_eq!(
            shown("redis-cli -a hunter2 -u redis://:pw@h:1 shutdown && start"),
            "redis-cli -a *** -u redis://:***@h:1 shutdown && start"
        );
    }

    #[test]
    fn a_seed_replays_the_same_schedule() {
        let opts = TortureOpts {
            urls: vec![],
            processes: 4,
            duration: Duration::from_secs(60),
            faults: FaultKind::ALL.to_vec(),
            restart_cmd: None,
            seed: Some(7),
            primitives: vec![Primitive::Mutex],
            names: 3,
            lease: Duration::from_secs(2),
            hold: Duration::from_millis(60),
            json: None,
            history: None,
            sabotage: None,
        };
        let a = schedule(7, &opts, &FaultKind::ALL, 4);
        let b = schedule(7, &opts, &FaultKind::ALL, 4);
        assert!(!a.is_empty());
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let c = schedule(8, &opts, &FaultKind::ALL, 4);
        assert_ne!(format!("{a:?}"), format!("{c:?}"));
        assert!(a.iter().all(|p| p.at + p.lasts <= opts.duration));
    }
}
