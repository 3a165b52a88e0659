//! What a torture run records: every event of every worker, every fault, every fenced write,
//! each stamped with the host's monotonic clock (shared by all processes of the host).

use serde::{Deserialize, Serialize};

pub(crate) use crate::host::now_ns;

/// What a worker holds during one critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum HoldKind {
    /// A mutex (also each member of a MultiLock).
    Mutex,
    /// A fair mutex.
    Fair,
    /// A read hold.
    Read,
    /// The write hold.
    Write,
    /// A semaphore permit.
    Permit,
}

impl HoldKind {
    /// Whether holders of this kind must be alone on the name.
    pub(crate) fn exclusive(self) -> bool {
        matches!(self, Self::Mutex | Self::Fair | Self::Write)
    }
}

/// One event of a worker, as it writes it on stdout (one JSON object per line).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "e", rename_all = "snake_case")]
pub(crate) enum WorkerEvent {
    /// The worker started (with its process id).
    Start { t: u64, pid: u32 },
    /// A hold was granted: the critical section starts.
    Grant {
        t: u64,
        hold: u64,
        name: String,
        kind: HoldKind,
        token: u64,
    },
    /// The fenced write of a hold: accepted or refused by the resource.
    Fenced {
        t: u64,
        hold: u64,
        name: String,
        token: u64,
        accepted: bool,
    },
    /// The guard reported the hold lost.
    Lost {
        t: u64,
        hold: u64,
        name: String,
        reason: String,
    },
    /// The hold's guard vouched for it until `until` (on the worker's clock, as `t`), as the
    /// worker saw at `t`: reported at the first look of its critical section and each time
    /// the moment moves (a renewal the store confirmed). On a clock that runs at its rate the
    /// store cannot have given the hold away before that moment plus the drift allowance.
    Vouched { t: u64, hold: u64, until: u64 },
    /// The critical section ended (before the release was sent).
    Exit { t: u64, hold: u64 },
    /// The release answered.
    Release { t: u64, hold: u64, ok: bool },
    /// An acquisition returned a hold that was no longer held when its critical section was
    /// to begin (its lease ended on the way: a starved process, renewals that waited too
    /// long). The worker did not use it and gave it back (with the rest of its set, a
    /// `MultiLock`'s, whose members still held are not reported); the reason is its guard's.
    LostBeforeUse {
        t: u64,
        name: String,
        token: u64,
        reason: String,
    },
    /// An acquisition began: the worker is about to ask the store for `name` and wait up to
    /// `wait_ms` (its deadline is later than `t + wait_ms`, as its timer starts after this
    /// stamp). Its outcome is the worker's next event: the `Grant` of `name`, or a `Timeout`
    /// of `attempt` (an `Error` or a `LostBeforeUse` leaves it unjudged). A `MultiLock`'s
    /// acquisition is one `Enqueue` per name, of one attempt, marked `set`, and has an
    /// outcome per name.
    Enqueue {
        t: u64,
        attempt: u64,
        name: String,
        kind: HoldKind,
        wait_ms: u64,
        /// One of a `MultiLock`'s names: while it waits for another, it may hold this one.
        #[serde(default)]
        set: bool,
    },
    /// The acquisition `attempt` of `name` gave up: it returned without a hold at `t`.
    Timeout { t: u64, attempt: u64, name: String },
    /// An acquisition failed with an error (not a timeout).
    Error { t: u64, what: String },
    /// The worker stopped on request.
    Stop { t: u64 },
}

/// `$then`, with `$t` bound to the stamp of the event `$event` (of any kind).
macro_rules! with_stamp {
    ($event:expr, |$t:ident| $then:expr) => {
        match $event {
            WorkerEvent::Start { $t, .. }
            | WorkerEvent::Grant { $t, .. }
            | WorkerEvent::Fenced { $t, .. }
            | WorkerEvent::Lost { $t, .. }
            | WorkerEvent::Vouched { $t, .. }
            | WorkerEvent::Exit { $t, .. }
            | WorkerEvent::Release { $t, .. }
            | WorkerEvent::LostBeforeUse { $t, .. }
            | WorkerEvent::Enqueue { $t, .. }
            | WorkerEvent::Timeout { $t, .. }
            | WorkerEvent::Error { $t, .. }
            | WorkerEvent::Stop { $t } => $then,
        }
    };
}

impl WorkerEvent {
    /// When it happened, by the worker's clock.
    pub(crate) fn t(&self) -> u64 {
        with_stamp!(self, |t| *t)
    }

    /// When it happened, to be mapped to another clock.
    pub(crate) fn t_mut(&mut self) -> &mut u64 {
        with_stamp!(self, |t| t)
    }
}

/// A worker's event, with the worker it came from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Stamped {
    /// The worker (a new id for each process, also after a SIGKILLed one is replaced).
    pub(crate) worker: u32,
    /// The event.
    pub(crate) event: WorkerEvent,
}

/// An injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGSTOP a worker (preferably a holder) past its lease, then SIGCONT.
    Pause,
    /// SIGKILL a worker (preferably a holder), and start a new one in its place.
    Kill,
    /// Cut one worker off the store both ways (its proxy stalls every byte), then heal.
    Partition,
    /// Cut one worker off the store one way (requests or replies), then heal.
    OneWay,
    /// Add 50-300 ms to every chunk of one worker's traffic for a while.
    Latency,
    /// Close every connection of one worker at once.
    Reset,
    /// Delay one worker's replies past its lease for a while.
    Delay,
    /// Restart the store with the command of `--restart-cmd` (it hits every worker at once).
    /// Not in the default set: dlock cannot restart a server it did not start.
    Restart,
    /// SIGSTOP a worker (preferably a holder) for 0.2-0.5 of a lease, then SIGCONT: well
    /// inside the two thirds of a lease a store must keep a stalled hold, so it can cost no
    /// hold, and an overlap during one is unexplained.
    BlipPause,
    /// Cut one worker (preferably a holder) off the store both ways for 0.2-0.5 of a lease,
    /// then heal: like a blip pause, it can cost no hold.
    BlipPartition,
    /// A silent network on one worker (preferably a holder) for 1.5-3 leases: its connections
    /// stay open and nothing flows, both ways or (drawn) one way, then heal.
    Silent,
}

/// The worker of a fault that hits every worker (a restart of the store).
pub(crate) const EVERY_WORKER: u32 = u32::MAX;

impl FaultKind {
    /// Every kind, the default of `--faults`.
    pub(crate) const ALL: [Self; 10] = [
        Self::Pause,
        Self::Kill,
        Self::Partition,
        Self::OneWay,
        Self::Latency,
        Self::Reset,
        Self::Delay,
        Self::BlipPause,
        Self::BlipPartition,
        Self::Silent,
    ];

    /// The kinds that need a proxy in front of the store (not possible for SQLite).
    pub(crate) fn needs_proxy(self) -> bool {
        !matches!(
            self,
            Self::Pause | Self::Kill | Self::Restart | Self::BlipPause
        )
    }

    /// Whether it is aimed at a worker that holds something when it begins (at a waiter if
    /// none holds within a lease): a fault on a holder is the one that tests a hold.
    pub(crate) fn aims_at_a_holder(self) -> bool {
        matches!(
            self,
            Self::Pause | Self::Kill | Self::BlipPause | Self::BlipPartition | Self::Silent
        )
    }

    /// Whether a holder hit by it may legitimately be overlapped (its hold may end without it
    /// knowing at once). A reset costs a hold only where the hold lives in its connection
    /// ([`Capabilities::connection_bound`](dlock::Capabilities::connection_bound)); a restart
    /// only where the store is not `durable` (it forgets its holds when its server restarts).
    /// A blip never does: it heals before any store may give a stalled hold away, and a
    /// connection it leaves open keeps a connection-bound hold.
    pub(crate) fn can_cost_a_hold(self, connection_bound: bool, durable: bool) -> bool {
        match self {
            Self::Latency | Self::BlipPause | Self::BlipPartition => false,
            Self::Reset => connection_bound,
            Self::Restart => !durable,
            Self::Pause
            | Self::Kill
            | Self::Partition
            | Self::OneWay
            | Self::Delay
            | Self::Silent => true,
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pause => "pause",
            Self::Kill => "kill",
            Self::Partition => "partition",
            Self::OneWay => "one-way",
            Self::Latency => "latency",
            Self::Reset => "reset",
            Self::Delay => "delay",
            Self::Restart => "restart",
            Self::BlipPause => "blip-pause",
            Self::BlipPartition => "blip-partition",
            Self::Silent => "silent",
        })
    }
}

impl FaultRecord {
    /// Whether it hit `worker`.
    pub(crate) fn hits(&self, worker: u32) -> bool {
        self.worker == worker || self.worker == EVERY_WORKER
    }

    /// Whom it hit, for messages: `worker 3`, or `every worker`.
    pub(crate) fn whom(&self) -> String {
        if self.worker == EVERY_WORKER {
            "every worker".to_owned()
        } else {
            format!("worker {}", self.worker)
        }
    }
}

/// A fault as it was applied.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FaultRecord {
    /// What.
    pub(crate) kind: FaultKind,
    /// The worker hit ([`EVERY_WORKER`] for a restart of the store).
    pub(crate) worker: u32,
    /// When it began.
    pub(crate) start: u64,
    /// When it healed (a kill: when the process died).
    pub(crate) end: u64,
}

/// One write the fenced resource accepted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Accepted {
    /// When.
    pub(crate) t: u64,
    /// The resource (the lock's name).
    pub(crate) name: String,
    /// The token it carried.
    pub(crate) token: u64,
    /// The value written.
    pub(crate) value: u64,
}
