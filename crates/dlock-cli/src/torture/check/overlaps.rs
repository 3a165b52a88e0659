//! Overlaps: two holders inside a critical section of one name at once (or more than the
//! semaphore's permits) is a violation unless a fault that can cost a hold hit the older
//! holder first, and that holder was told (its guard reported the loss, or it died).

use std::collections::HashSet;

use super::Report;
use super::model::{Hold, Run, ms};
use crate::torture::history::{FaultKind, FaultRecord, HoldKind};
use crate::torture::worker::PERMITS;

/// Judges every hold that a later grant of its name overlapped.
pub(super) fn check(run: &Run<'_>, report: &mut Report) {
    let mut judged: HashSet<(u32, u64, String)> = HashSet::new();
    for (name, hs) in run.by_name(|_| true) {
        for (i, newer) in hs.iter().enumerate() {
            // Older holds still inside their critical section when `newer` was granted.
            let inside: Vec<&&Hold> = hs[..i]
                .iter()
                .filter(|older| older.end > newer.grant && older.worker != newer.worker)
                .collect();
            let mut over: Vec<&Hold> = inside
                .iter()
                .filter(|older| conflict(older.kind, newer.kind))
                .map(|h| **h)
                .collect();
            if newer.kind == HoldKind::Permit {
                let permits: Vec<&Hold> = inside
                    .iter()
                    .filter(|o| o.kind == HoldKind::Permit)
                    .map(|h| **h)
                    .collect();
                // More permits than there are: the excess is stale holders' (whose permits a
                // fault let expire), not everyone's. As many holders as the excess must be
                // explained by a fault (and told); a holder no fault explains is judged
                // (a violation) when the explained ones are too few, on this very grant.
                if permits.len() >= PERMITS as usize {
                    let excess = permits.len() + 1 - PERMITS as usize;
                    let (explained, innocent): (Vec<&Hold>, Vec<&Hold>) = permits
                        .iter()
                        .partition(|o| explaining_fault(run, o, newer.grant).is_some());
                    over.extend(explained.iter().take(excess));
                    if explained.len() < excess
                        && let Some(blamed) = innocent.first()
                    {
                        judge(run, name, blamed, newer, report);
                    }
                }
            }
            for older in over {
                // One verdict per overlapped hold (the first holder that overlapped it).
                if judged.insert((older.worker, older.grant, name.to_owned())) {
                    judge(run, name, older, newer, report);
                }
            }
        }
    }
}

/// Whether `a` and `b` (same name) may not hold at once.
fn conflict(a: HoldKind, b: HoldKind) -> bool {
    match (a, b) {
        (HoldKind::Permit, _) | (_, HoldKind::Permit) => false,
        (HoldKind::Read, HoldKind::Read) => false,
        _ => a.exclusive() || b.exclusive(),
    }
}

/// A fault that hit `hold`'s worker and can cost it its hold, begun before `before` and not
/// healed before the hold began.
fn explaining_fault<'a>(run: &Run<'a>, hold: &Hold, before: u64) -> Option<&'a FaultRecord> {
    run.costly_faults_on(hold.worker)
        .find(|f| f.start < before && f.end >= hold.grant)
}

/// An overlap of `older` by `newer`: explained (a fault hit the older holder first, and it was
/// told) or a violation.
fn judge(run: &Run<'_>, name: &str, older: &Hold, newer: &Hold, report: &mut Report) {
    let Some(fault) = explaining_fault(run, older, newer.grant) else {
        report.overlaps_unexplained += 1;
        report.violations.push(format!(
            "unexplained overlap on {name}: worker {} ({:?}, token {}) held from {:.1} ms to \
             {:.1} ms and worker {} ({:?}, token {}) got it at {:.1} ms, with no fault on the \
             first",
            older.worker,
            older.kind,
            older.token,
            ms(older.grant),
            ms(older.end),
            newer.worker,
            newer.kind,
            newer.token,
            ms(newer.grant)
        ));
        return;
    };
    match &older.lost {
        Some((told, _)) => {
            report.overlaps_explained += 1;
            let delay = (i128::from(*told) - i128::from(newer.grant)) / 1_000_000;
            let delay = i64::try_from(delay).unwrap_or(i64::MAX);
            report.worst_report_delay_ms =
                Some(report.worst_report_delay_ms.map_or(delay, |w| w.max(delay)));
        }
        None if fault.kind == FaultKind::Kill => {
            // A dead holder is told nothing; its critical section ended with it.
            report.overlaps_explained += 1;
        }
        None => {
            report.overlaps_unexplained += 1;
            report.violations.push(format!(
                "worker {} was never told it lost {name} (token {}): worker {} (token {}) held \
                 it from {:.1} ms while the first, hit by a {} at {:.1} ms, stayed inside until \
                 {:.1} ms",
                older.worker,
                older.token,
                newer.worker,
                newer.token,
                ms(newer.grant),
                fault.kind,
                ms(fault.start),
                ms(older.end)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::torture::history::{EVERY_WORKER, FaultKind};

    #[test]
    fn an_overlap_without_a_fault_is_a_violation() {
        let h = [
            grant(1, 1, S, 1),
            grant(2, 1, 2 * S, 2),
            exit(2, 1, 3 * S),
            exit(1, 1, 4 * S),
        ];
        let r = run(&h, &[]);
        assert_eq!(r.overlaps_unexplained, 1);
        assert!(
            r.violations[0].contains("unexplained overlap"),
            "{:?}",
            r.violations
        );
    }

    #[test]
    fn an_overlap_after_a_pause_is_explained_only_if_the_holder_was_told() {
        let pause = fault(FaultKind::Pause, 1, S + S / 2, 5 * S);
        let told = [
            grant(1, 1, S, 1),
            grant(2, 1, 4 * S, 2),
            lost(1, 1, 5 * S),
            exit(1, 1, 5 * S),
            exit(2, 1, 6 * S),
            grant(3, 1, 6 * S, 3),
            exit(3, 1, 7 * S),
        ];
        let r = run(&told, std::slice::from_ref(&pause));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.overlaps_explained, 1);
        assert_eq!(r.worst_report_delay_ms, Some(1000));
        let untold = [
            grant(1, 1, S, 1),
            grant(2, 1, 4 * S, 2),
            exit(1, 1, 5 * S),
            exit(2, 1, 6 * S),
            grant(3, 1, 6 * S, 3),
            exit(3, 1, 7 * S),
        ];
        let r = run(&untold, &[pause]);
        assert_eq!(r.overlaps_unexplained, 1);
        assert!(r.violations[0].contains("never told"), "{:?}", r.violations);
    }

    /// A connection reset explains an overlap (of a holder that was told) only where a hold
    /// lives in its connection (for-update); elsewhere the hold outlives a reset, and an
    /// overlap after one is a violation.
    #[test]
    fn a_reset_explains_an_overlap_only_on_connection_bound_stores() {
        let reset = fault(FaultKind::Reset, 1, S + S / 2, S + S / 2);
        let h = told_after_overlap();
        let r = run_on(&h, std::slice::from_ref(&reset), true);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.overlaps_explained, 1);
        assert_eq!(r.worst_report_delay_ms, Some(100));
        let r = run_on(&h, &[reset], false);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
    }

    /// On a connection-bound store, a holder whose release failed was told (late): its overlap
    /// after a reset is explained, with the delay counted to the failed release. One whose
    /// release succeeded was not, and neither is one on a store whose holds outlive a
    /// connection.
    #[test]
    fn a_failed_release_tells_the_holder() {
        let reset = fault(FaultKind::Reset, 1, S + S / 2, S + S / 2);
        let history = |ok| {
            [
                grant(1, 1, S, 1),
                grant(2, 1, 2 * S, 2),
                exit(1, 1, 3 * S),
                released(1, 1, 3 * S + S / 2, ok),
                exit(2, 1, 4 * S),
            ]
        };
        let r = run_on(&history(false), std::slice::from_ref(&reset), true);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.worst_report_delay_ms, Some(1500));
        let r = run_on(&history(true), std::slice::from_ref(&reset), true);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert!(r.violations[0].contains("never told"), "{:?}", r.violations);
        // Where holds outlive a connection, a pause is what costs one, and the loss must be
        // reported by `lost()`: a failed release afterwards does not count.
        let pause = fault(FaultKind::Pause, 1, S + S / 2, S + S / 2);
        let r = run_on(&history(false), &[pause], false);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert!(r.violations[0].contains("never told"), "{:?}", r.violations);
    }

    /// A restart of the store hits every worker: it explains an overlap of any holder that
    /// was told, and its liveness message names every worker, not a number.
    #[test]
    fn a_restart_explains_an_overlap_of_any_holder() {
        let restart = fault(FaultKind::Restart, EVERY_WORKER, S + S / 2, S + S / 2);
        let h = told_after_overlap();
        let r = run(&h, std::slice::from_ref(&restart));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.overlaps_explained, 1);
        assert_eq!(restart.whom(), "every worker");
        let r = run(&h, &[]);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
    }

    /// A third permit of two is explained by the one holder a fault hit (and who was told),
    /// not blamed on a holder whose permit was never in doubt.
    #[test]
    fn an_over_granted_permit_is_judged_on_the_stale_holder() {
        let pause = fault(FaultKind::Pause, 2, 2 * S + S / 2, 3 * S + S / 2);
        let h = [
            permit(1, 1, S, 1),
            permit(2, 1, 2 * S, 2),
            permit(3, 1, 3 * S, 3),
            lost(2, 1, 3 * S + S / 10),
            exit(2, 1, 3 * S + S / 5),
            exit(3, 1, 4 * S),
            permit(3, 2, 4 * S + S / 5, 4),
            exit(3, 2, 4 * S + S / 2),
            exit(1, 1, 5 * S),
        ];
        let r = run(&h, std::slice::from_ref(&pause));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.overlaps_explained, 1);
        let r = run(&h, &[]);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
    }

    /// Two permits over two while only one holder is stale: the second over-grant is a
    /// violation, even though the stale holder explains the first.
    #[test]
    fn a_second_over_granted_permit_needs_a_second_stale_holder() {
        let pause = fault(FaultKind::Pause, 1, S + S / 2, 6 * S);
        let h = [
            permit(1, 1, S, 1),
            permit(2, 1, 2 * S, 2),
            permit(3, 1, 3 * S, 3),
            permit(4, 1, 4 * S, 4),
            lost(1, 1, 6 * S + S / 10),
            exit(1, 1, 6 * S + S / 5),
            exit(2, 1, 7 * S),
            exit(3, 1, 7 * S),
            exit(4, 1, 7 * S),
            permit(2, 2, 7 * S + S / 2, 5),
            exit(2, 2, 7 * S + S / 2 + 1),
        ];
        let r = run(&h, std::slice::from_ref(&pause));
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert_violation(&r, "token 4");
    }

    /// Worker 1 holds from 1 s; worker 2 is granted at 2 s; worker 1 is told at 2.1 s.
    fn told_after_overlap() -> [crate::torture::history::Stamped; 5] {
        [
            grant(1, 1, S, 1),
            grant(2, 1, 2 * S, 2),
            lost(1, 1, 2 * S + S / 10),
            exit(1, 1, 3 * S),
            exit(2, 1, 4 * S),
        ]
    }
}
