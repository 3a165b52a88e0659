//! Histories for the checks' tests: one worker event or fault per call, on the name `n`.

use std::time::Duration;

use super::{Report, Terms, check};
use crate::torture::history::{FaultKind, FaultRecord, HoldKind, Stamped, WorkerEvent};
use crate::torture::resource::Ledger;

/// One second, in the history's nanoseconds.
pub(super) const S: u64 = 1_000_000_000;

/// Worker `worker` is granted its hold `hold` of the mutex `n` at `t`, with `token`.
pub(super) fn grant(worker: u32, hold: u64, t: u64, token: u64) -> Stamped {
    granted(worker, hold, t, token, HoldKind::Mutex)
}

/// As [`grant`], a permit of the semaphore `n`.
pub(super) fn permit(worker: u32, hold: u64, t: u64, token: u64) -> Stamped {
    granted(worker, hold, t, token, HoldKind::Permit)
}

fn granted(worker: u32, hold: u64, t: u64, token: u64, kind: HoldKind) -> Stamped {
    Stamped {
        worker,
        event: WorkerEvent::Grant {
            t,
            hold,
            name: "n".into(),
            kind,
            token,
        },
    }
}

/// As [`grant`], a hold of the fair mutex `n`.
pub(super) fn fair_grant(worker: u32, hold: u64, t: u64, token: u64) -> Stamped {
    granted(worker, hold, t, token, HoldKind::Fair)
}

/// Worker `worker` begins its fair acquisition `attempt` of `n` at `t`, waiting up to 4 s.
pub(super) fn enqueue(worker: u32, attempt: u64, t: u64) -> Stamped {
    Stamped {
        worker,
        event: WorkerEvent::Enqueue {
            t,
            attempt,
            name: "n".into(),
            kind: HoldKind::Fair,
            wait_ms: 4_000,
            set: false,
        },
    }
}

/// Worker `worker`'s fair acquisition `attempt` of `n` gave up at `t`.
pub(super) fn timeout(worker: u32, attempt: u64, t: u64) -> Stamped {
    Stamped {
        worker,
        event: WorkerEvent::Timeout {
            t,
            attempt,
            name: "n".into(),
        },
    }
}

/// `event` (a grant, a loss, an enqueue or a timeout) on the name `name` instead of `n`.
pub(super) fn on(name: &str, mut event: Stamped) -> Stamped {
    match &mut event.event {
        WorkerEvent::Grant { name: n, .. }
        | WorkerEvent::Lost { name: n, .. }
        | WorkerEvent::Enqueue { name: n, .. }
        | WorkerEvent::Timeout { name: n, .. } => {
            name.clone_into(n);
        }
        _ => {}
    }
    event
}

/// The critical section of the hold ends at `t`.
pub(super) fn exit(worker: u32, hold: u64, t: u64) -> Stamped {
    Stamped {
        worker,
        event: WorkerEvent::Exit { t, hold },
    }
}

/// Worker 1 holds the mutex `n` from 1 s to 2 s, then worker 2 from 3 s to 4 s, granted with
/// `first` and `second`.
pub(super) fn handoff(first: u64, second: u64) -> [Stamped; 4] {
    [
        grant(1, 1, S, first),
        exit(1, 1, 2 * S),
        grant(2, 1, 3 * S, second),
        exit(2, 1, 4 * S),
    ]
}

/// The release of the hold answered at `t`.
pub(super) fn released(worker: u32, hold: u64, t: u64, ok: bool) -> Stamped {
    Stamped {
        worker,
        event: WorkerEvent::Release { t, hold, ok },
    }
}

/// The guard of the hold reported it lost at `t` (reason `test`).
pub(super) fn lost(worker: u32, hold: u64, t: u64) -> Stamped {
    Stamped {
        worker,
        event: WorkerEvent::Lost {
            t,
            hold,
            name: "n".into(),
            reason: "test".into(),
        },
    }
}

/// At `t`, the guard of the hold was seen to vouch for it until `until`.
pub(super) fn vouched(worker: u32, hold: u64, t: u64, until: u64) -> Stamped {
    Stamped {
        worker,
        event: WorkerEvent::Vouched { t, hold, until },
    }
}

/// A fault of `kind` on `worker` from `start` until it healed at `end`.
pub(super) fn fault(kind: FaultKind, worker: u32, start: u64, end: u64) -> FaultRecord {
    FaultRecord {
        kind,
        worker,
        start,
        end,
    }
}

/// The terms of the checks' tests: a 2 s lease (and span), a 2 s liveness slack, holds that
/// outlive their connections, a durable store.
pub(super) const TERMS: Terms = Terms {
    lease: Duration::from_secs(2),
    span: Duration::from_secs(2),
    slack: Duration::from_secs(2),
    connection_bound: false,
    durable: true,
};

/// Checks a 100 s run of a store whose holds outlive their connections, with a 2 s lease.
pub(super) fn run(history: &[Stamped], faults: &[FaultRecord]) -> Report {
    run_on(history, faults, false)
}

/// As [`run`], on a store whose holds live in their connections if `connection_bound`.
pub(super) fn run_on(
    history: &[Stamped],
    faults: &[FaultRecord],
    connection_bound: bool,
) -> Report {
    run_with(
        history,
        faults,
        Terms {
            connection_bound,
            ..TERMS
        },
    )
}

/// As [`run`], on a store with the given terms.
pub(super) fn run_with(history: &[Stamped], faults: &[FaultRecord], terms: Terms) -> Report {
    check(history, faults, &Ledger::default(), (0, 100 * S), terms)
}

/// Asserts that one of the report's violations says `needle`.
pub(super) fn assert_violation(r: &Report, needle: &str) {
    assert!(
        r.violations.iter().any(|v| v.contains(needle)),
        "{:?}",
        r.violations
    );
}
