//! The checker: reads the whole history of a run (every worker's grants, losses, writes and
//! releases, every injected fault, every write the resource accepted) and says whether the
//! contract held.
//!
//! The history is first rebuilt into holds ([`model`]); then each check, a module of its own,
//! reads that [`Run`] and adds its counts and violations to the [`Report`]:
//!
//! - [`fencing`]: the resource accepted fenced writes in strictly increasing token order per
//!   name, and its counter equals the number it accepted (no lost update).
//! - [`tokens`]: no token was issued twice for a name, and they rose in grant order.
//! - [`overlaps`]: two holders inside a critical section of one name at once (or more than the
//!   semaphore's permits) is a violation unless a fault that can cost a hold (a pause, a kill,
//!   a partition, a one-way cut, delayed replies; a restart only of a store that forgets its
//!   holds) hit the older holder and outlasted what its hold was vouched for (an unexplained
//!   overlap otherwise), and that holder was told (its guard reported the loss) by a deadline
//!   ("told late" otherwise); how long after the overlap began it was told is kept, by fault.
//! - [`liveness`]: after every fault healed, some worker acquired within the span plus a
//!   slack, and every name the fault's worker held was granted again to whoever asked for it
//!   once the store had to have freed it.
//! - [`fairness`]: on a fair lock, no waiter was granted after one that began waiting
//!   clearly later, unless a fault hit it meanwhile or it had given up ("overtaken").
//!
//! A new check is a module with a `check(&Run, &mut Report)` function, listed in [`CHECKS`].

mod fairness;
mod fencing;
mod liveness;
mod model;
mod overlaps;
mod tokens;

#[cfg(test)]
mod fixtures;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use self::model::Run;
use super::history::{FaultRecord, Stamped, WorkerEvent};
use super::resource::Ledger;

/// The checks, in the order they add their violations to the report.
const CHECKS: [fn(&Run<'_>, &mut Report); 5] = [
    tokens::check,
    overlaps::check,
    fencing::check,
    liveness::check,
    fairness::check,
];

/// What the checker knows of the store and of the workers' settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    /// The workers' watchdog lease (renewed every third of it).
    pub(crate) lease: Duration,
    /// How long the store keeps a silent holder's hold, at most: the lease, or the session
    /// of a session store ([`store::span`](super::store::span)).
    pub(crate) span: Duration,
    /// What a healed fault may take, beyond the lease, until a worker is granted again.
    pub(crate) slack: Duration,
    /// Whether a hold lives in its connection, so that a reset can cost it
    /// ([`Capabilities::connection_bound`](dlock::Capabilities::connection_bound)).
    pub(crate) connection_bound: bool,
    /// Whether the store keeps its holds across a restart of its server: on such a store a
    /// restart explains no overlap.
    pub(crate) durable: bool,
}

/// What a run showed.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Report {
    /// Critical sections entered.
    pub(crate) holds: u64,
    /// Faults injected, by kind.
    pub(crate) faults: BTreeMap<String, u64>,
    /// Fenced writes the resource accepted / refused as stale.
    pub(crate) fenced_accepted: u64,
    /// Fenced writes refused because a newer holder had written.
    pub(crate) fenced_refused: u64,
    /// Violations of fencing (must be 0): out-of-order tokens, lost fenced updates.
    pub(crate) fenced_violations: u64,
    /// Grants stamped after a higher token's, explained: a fault (a pause) hit the worker
    /// between its acquisition and its stamp, and its guard reported the hold lost.
    pub(crate) late_grants_explained: u64,
    /// Holds that others overlapped, each explained by a fault that hit its holder (counted
    /// once per overlapped hold).
    pub(crate) overlaps_explained: u64,
    /// Overlaps nothing explains (must be 0), counted once per overlapped hold.
    pub(crate) overlaps_unexplained: u64,
    /// Overlapped holders a fault explains, told of their loss after the deadline (must be
    /// 0): the newer grant plus the drift allowance, for a pause its end plus a slack.
    pub(crate) told_late: u64,
    /// Updates of the unfenced counter lost to overlaps (what fencing saved).
    pub(crate) unfenced_lost_updates: u64,
    /// Holds whose guard reported a loss.
    pub(crate) losses_reported: u64,
    /// Holds an acquisition returned that were no longer held when their critical section
    /// was to begin: not used, given back (with the rest of their set).
    pub(crate) lost_before_use: u64,
    /// The reported losses by the reason their guards gave (`suspended`: the guard said the
    /// hold was no longer vouched for, without a final reason yet).
    pub(crate) losses_by_reason: BTreeMap<String, u64>,
    /// The longest time, after an overlap began, until the older holder was told (ms;
    /// negative: told before).
    pub(crate) worst_report_delay_ms: Option<i64>,
    /// [`worst_report_delay_ms`](Self::worst_report_delay_ms) by the kind of the fault that
    /// explained the overlap: a pause's is its length past the lease, the others' at most the
    /// drift allowance.
    pub(crate) worst_report_delay_by_fault_ms: BTreeMap<String, i64>,
    /// Pairs of fair waiters judged: one began waiting on a name clearly before the other,
    /// still waited when the other began, and was granted first or still waited when the
    /// other was granted.
    pub(crate) fair_pairs_checked: u64,
    /// Of those, the pairs whose earlier waiter was overtaken while a fault hit its worker
    /// (which can cost a waiter its place).
    pub(crate) fair_overtakes_explained: u64,
    /// The longest time from a fault's healing to the next grant (ms).
    pub(crate) worst_recovery_ms: Option<u64>,
    /// Every violation, in words.
    pub(crate) violations: Vec<String>,
}

/// Checks a run. `start`/`end` bound it; `terms` say what the store and the workers promise.
pub(crate) fn check(
    history: &[Stamped],
    faults: &[FaultRecord],
    ledger: &Ledger,
    (start, end): (u64, u64),
    terms: Terms,
) -> Report {
    let run = Run::rebuild(history, faults, ledger, (start, end), terms);
    let mut report = Report::default();
    tally(&run, &mut report);
    for check in CHECKS {
        check(&run, &mut report);
    }
    report
}

/// What the run did, whatever the checks find: holds, faults, reported losses.
fn tally(run: &Run<'_>, report: &mut Report) {
    for f in run.faults {
        *report.faults.entry(f.kind.to_string()).or_default() += 1;
    }
    report.lost_before_use = run
        .history
        .iter()
        .filter(|s| matches!(s.event, WorkerEvent::LostBeforeUse { .. }))
        .count() as u64;
    report.holds = run.holds.len() as u64;
    for (_, reason) in run.holds.iter().filter_map(|h| h.lost.as_ref()) {
        report.losses_reported += 1;
        *report.losses_by_reason.entry(reason.clone()).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use crate::torture::history::{Stamped, WorkerEvent};

    /// Losses are counted once per hold, by the first reason its guard gave.
    #[test]
    fn losses_are_counted_by_reason() {
        let mut h = vec![
            grant(1, 1, S, 1),
            lost(1, 1, 2 * S),
            exit(1, 1, 3 * S),
            grant(2, 1, 4 * S, 2),
            lost(2, 1, 5 * S),
            exit(2, 1, 6 * S),
            grant(3, 1, 7 * S, 3),
            exit(3, 1, 8 * S),
        ];
        if let WorkerEvent::Lost { reason, .. } = &mut h[4].event {
            *reason = "the session expired".into();
        }
        h.insert(2, lost(1, 1, 2 * S + 1));
        let r = run(&h, &[]);
        assert_eq!(r.losses_reported, 2);
        assert_eq!(
            r.losses_by_reason.into_iter().collect::<Vec<_>>(),
            [
                ("test".to_string(), 1),
                ("the session expired".to_string(), 1)
            ]
        );
    }

    #[test]
    fn clean_handoffs_pass() {
        let r = run(&handoff(1, 2), &[]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.holds, 2);
    }

    #[test]
    fn holds_lost_before_use_are_counted_and_are_no_critical_section() {
        // Worker 2's acquisition returned a hold of n whose lease had ended (a lower token,
        // inside worker 1's section): it did not use it, so nothing overlaps.
        let h = [
            grant(1, 1, S, 2),
            Stamped {
                worker: 2,
                event: WorkerEvent::LostBeforeUse {
                    t: S + S / 2,
                    name: "n".into(),
                    token: 1,
                    reason: "the lease ran out before it could be renewed".into(),
                },
            },
            exit(1, 1, 2 * S),
        ];
        let r = run(&h, &[]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.lost_before_use, 1);
        assert_eq!(r.holds, 1);
        // Stamped as a grant (the old worker), the same hold is an overlap no fault explains.
        let h = [
            grant(1, 1, S, 2),
            grant(2, 1, S + S / 2, 1),
            exit(1, 1, 2 * S),
            exit(2, 1, 2 * S),
        ];
        let r = run(&h, &[]);
        assert!(!r.violations.is_empty());
    }
}
