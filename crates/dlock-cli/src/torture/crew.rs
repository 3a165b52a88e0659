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

use super::history::{Stamped, WorkerEvent};
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
    seed: u64,
    prefix: String,
    primitives: &'a [Primitive],
    exe: &'a Path,
    resource: &'a Resource,
    /// Every event of every worker, in the order read.
    pub(super) history: Shared<Vec<Stamped>>,
    /// Per worker: its grants minus its critical sections' exits (above 0: it holds now).
    pub(super) holding: Shared<HashMap<u32, i64>>,
    next_worker: u32,
}

impl<'a> Crew<'a> {
    pub(super) fn new(
        opts: &'a TortureOpts,
        seed: u64,
        prefix: String,
        primitives: &'a [Primitive],
        exe: &'a Path,
        resource: &'a Resource,
    ) -> Self {
        Self {
            opts,
            seed,
            prefix,
            primitives,
            exe,
            resource,
            history: Arc::default(),
            holding: Arc::default(),
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
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(event) = serde_json::from_str::<WorkerEvent>(&line) else {
                    continue;
                };
                match &event {
                    WorkerEvent::Grant { .. } => *holding.lock().entry(worker).or_default() += 1,
                    WorkerEvent::Exit { .. } => *holding.lock().entry(worker).or_default() -= 1,
                    _ => {}
                }
                history.lock().push(Stamped { worker, event });
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
