//! The worker processes of one store's attack: the slots they run in (each behind its own
//! proxies), how a worker is started and its output read, and how all of them are stopped.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use dlock::backend::Mutex;
use dlock_proxy::{Fault, Proxy};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::history::{Stamped, WorkerEvent, now_ns};
use super::resource::Resource;
use super::{Primitive, Sabotage, TortureOpts};
use crate::exit;

/// One worker slot: its proxies (one per server) and the process in it now.
pub(super) struct Slot {
    pub(super) proxies: Vec<Proxy>,
    pub(super) url: String,
    pub(super) child: Option<Child>,
    pub(super) worker: u32,
    pub(super) pid: Option<Pid>,
    /// Whether this slot's workers run on a drifting clock (`--clock-rate`).
    pub(super) drifts: bool,
    /// The tasks reading what this slot's workers (the current one and those it replaced)
    /// write; each ends at its worker's end of output.
    pub(super) readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Slot {
    /// A slot with no worker in it yet, whose workers reach the store at `url`.
    pub(super) fn new(proxies: Vec<Proxy>, url: String) -> Self {
        Self {
            proxies,
            url,
            child: None,
            worker: 0,
            pid: None,
            drifts: false,
            readers: Vec::new(),
        }
    }

    /// Sets `fault` on every proxy of the slot.
    pub(super) fn set_fault(&self, fault: Fault) {
        for p in &self.proxies {
            p.set_fault(fault);
        }
    }
}

/// What the workers' output readers share with the attack.
pub(super) type Shared<T> = Arc<Mutex<T>>;

/// Starts the workers of one store's attack, each with a new id, and gathers what they say.
pub(super) struct Crew<'a> {
    pub(super) opts: &'a TortureOpts,
    /// How long the store keeps a silent holder's hold ([`span`](super::store::span)).
    pub(super) span: Duration,
    seed: u64,
    prefix: String,
    primitives: &'a [Primitive],
    exe: &'a Path,
    resource: &'a Resource,
    /// Every event of every worker, in the order read.
    pub(super) history: Shared<Vec<Stamped>>,
    /// Per worker: its grants minus its critical sections' exits (above 0: it holds now).
    pub(super) holding: Shared<HashMap<u32, i64>>,
    /// What made the history unusable: a drifting worker's clock that did not drift.
    pub(super) errors: Shared<Vec<String>>,
    next_worker: u32,
}

impl<'a> Crew<'a> {
    pub(super) fn new(
        opts: &'a TortureOpts,
        span: Duration,
        seed: u64,
        prefix: String,
        primitives: &'a [Primitive],
        exe: &'a Path,
        resource: &'a Resource,
    ) -> Self {
        Self {
            opts,
            span,
            seed,
            prefix,
            primitives,
            exe,
            resource,
            history: Arc::default(),
            holding: Arc::default(),
            errors: Arc::default(),
            next_worker: 0,
        }
    }

    /// Starts the next worker in `slot`, and a task that reads its events into the history.
    pub(super) fn spawn(&mut self, slot: &mut Slot) -> Result<(), u8> {
        let (opts, worker) = (self.opts, self.next_worker);
        let prims: Vec<String> = self
            .primitives
            .iter()
            .map(|p| format!("{p:?}").to_lowercase())
            .collect();
        let mut cmd = Command::new(self.exe);
        cmd.arg("torture-worker")
            .arg("--id")
            .arg(worker.to_string())
            .arg("--url")
            .arg(&slot.url)
            .arg("--resource")
            .arg(self.resource.addr().to_string())
            .arg("--seed")
            .arg(self.seed.to_string())
            .arg("--prefix")
            .arg(&self.prefix)
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
        if opts.defaults {
            cmd.arg("--defaults");
        }
        let drift = opts.clock_rate.filter(|_| slot.drifts);
        if let Some(rate) = drift {
            let lib = faketime_lib().ok_or_else(|| {
                eprintln!(
                    "dlock: --clock-rate needs libfaketime (the OS package libfaketime): none \
                     of {} exists",
                    FAKETIME_LIBS.join(", ")
                );
                exit::CONFIG
            })?;
            // A rate needs a start offset ("+0") to take effect; the faked clocks then count
            // from a base of libfaketime's choosing, which the reader maps back (`Drift`).
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME", format!("+0 x{rate}"));
        }
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
        let history = Arc::clone(&self.history);
        let holding = Arc::clone(&self.holding);
        let errors = Arc::clone(&self.errors);
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut drift = drift.map(Drift::new);
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(event) = serde_json::from_str::<WorkerEvent>(&line) else {
                    continue;
                };
                match &event {
                    WorkerEvent::Grant { .. } => *holding.lock().entry(worker).or_default() += 1,
                    WorkerEvent::Exit { .. } => *holding.lock().entry(worker).or_default() -= 1,
                    _ => {}
                }
                match drift.as_mut() {
                    Some(d) => d.read.push((event, now_ns())),
                    None => history.lock().push(Stamped { worker, event }),
                }
            }
            if let Some(d) = drift {
                match d.mapped() {
                    Ok(events) => history
                        .lock()
                        .extend(events.into_iter().map(|event| Stamped { worker, event })),
                    Err(why) => errors.lock().push(format!("worker {worker}: {why}")),
                }
            }
        });
        slot.pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        slot.child = Some(child);
        slot.worker = worker;
        slot.readers.push(reader);
        self.next_worker += 1;
        Ok(())
    }
}

/// Where the OS packages put libfaketime, multi-threaded variant first (a worker runs a
/// multi-threaded runtime).
const FAKETIME_LIBS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/lib64/faketime/libfaketimeMT.so.1",
];

/// The libfaketime library of this machine, if it has one.
fn faketime_lib() -> Option<&'static str> {
    FAKETIME_LIBS.into_iter().find(|p| Path::new(p).exists())
}

/// The events of a worker whose clock runs at `rate`, held back until its output ends and
/// then mapped to the harness's clock: each event happened before the harness read it, so
/// the worker's stamps, scaled by its rate and shifted as late as every read allows, give
/// each event's time within the shortest delay of any read.
struct Drift {
    rate: f64,
    /// Each event, and when the harness read it.
    read: Vec<(WorkerEvent, u64)>,
}

impl Drift {
    fn new(rate: f64) -> Self {
        Self {
            rate,
            read: Vec::new(),
        }
    }

    /// The events, stamped by the harness's clock (a `wait_ms` and a vouched `until` too), or
    /// why they cannot be: over a run long enough to tell, the worker's clock did not run at
    /// its rate (libfaketime did not take hold), and the mapping would stretch real times
    /// instead of undoing drift.
    fn mapped(mut self) -> Result<Vec<WorkerEvent>, String> {
        let stamps: Vec<(u64, u64)> = self
            .read
            .iter_mut()
            .map(|(e, at)| (*e.t_mut(), *at))
            .collect();
        let (Some(&first), Some(&last)) = (
            stamps.iter().min_by_key(|s| s.0),
            stamps.iter().max_by_key(|s| s.0),
        ) else {
            return Ok(Vec::new());
        };
        let rate = self.rate;
        // Rates and whole nanoseconds: far below 2^53 of them in any run.
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let scale = move |d: u64| (d as f64 / rate) as u64;
        #[allow(clippy::cast_precision_loss)]
        {
            let (theirs, ours) = (
                last.0.saturating_sub(first.0),
                last.1.saturating_sub(first.1),
            );
            if ours >= 5_000_000_000 && rate != 1.0 {
                let seen = theirs as f64 / ours as f64;
                if (seen - rate).abs() >= (seen - 1.0).abs() {
                    return Err(format!(
                        "the drifting worker's clock ran at {seen:.4}, not {rate}: \
                         libfaketime did not take hold"
                    ));
                }
            }
        }
        let since = move |t: u64| scale(t.saturating_sub(first.0));
        let start = self
            .read
            .iter_mut()
            .map(|(e, at)| at.saturating_sub(since(*e.t_mut())))
            .min()
            .unwrap_or(0);
        Ok(self
            .read
            .into_iter()
            .map(|(mut e, _)| {
                let theirs = *e.t_mut();
                let at = start.saturating_add(since(theirs));
                *e.t_mut() = at;
                match &mut e {
                    WorkerEvent::Enqueue { wait_ms, .. } => *wait_ms = scale(*wait_ms),
                    // What the guard had left, counted no shorter than on the worker's
                    // clock: a store counts its lease in real time from the renewal, which a
                    // fast clock's guard saw as sooner than it was.
                    WorkerEvent::Vouched { until, .. } => {
                        let ahead = until.saturating_sub(theirs);
                        *until = at.saturating_add(ahead.max(scale(ahead)));
                    }
                    _ => {}
                }
                e
            })
            .collect())
    }
}

/// Heals everything, asks every worker to stop (closing its stdin), waits for them, and kills
/// by pid the ones that do not stop.
pub(super) async fn stop(slots: &mut [Slot], lease: Duration) {
    for slot in slots.iter_mut() {
        slot.set_fault(Fault::None);
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
