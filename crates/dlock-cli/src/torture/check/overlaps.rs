//! Overlaps: two holders inside a critical section of one name at once (or more than the
//! semaphore's permits) is a violation unless a fault that can cost a hold hit the older
//! holder and outlasted what its hold was vouched for (an "unexplained overlap" otherwise),
//! and that holder was told (its guard reported the loss, or it died) by a deadline ("told
//! late" otherwise).
//!
//! What a hold was vouched for: a watchdog renews every third of the lease, so a lease store
//! cannot give away the hold of a holder that a fault stalled until at least two thirds of a
//! lease after the fault began ([`Run::vouched_after_fault`]), nor before the moment its
//! guard was seen to vouch for plus the drift allowance, the sooner of the two (by a bounded
//! amount, [`Run::horizon`]); a fault that began later, or healed sooner, explains nothing. A
//! hold that lives in its connection ends when the server closes the connection, and a
//! restart of a store that forgets its holds ends every hold at once: those explain an
//! overlap from their start.
//!
//! The deadline: the guard stops vouching a drift allowance before the store's bound, so an
//! older holder that keeps running is told before the newer grant, give or take the
//! allowance. A stopped process (a pause) cannot be told before it runs again: by the pause's
//! end plus [`PAUSE_SLACK`]. A connection-bound holder learns of its broken connection at its
//! next connection check or its release, and every holder of a restarted store at its next
//! renewal: by the later of the grant and the fault's end plus a lease.

use std::collections::HashSet;
use std::time::Duration;

use super::Report;
use super::model::{Hold, Run, ms, nanos as ns};
use crate::torture::history::{FaultKind, FaultRecord, HoldKind};
use crate::torture::worker::PERMITS;

/// How long after a pause ends its holder may still be told of its loss (beyond the drift
/// allowance): the stopped process has to be scheduled again and look at its guard, on a
/// machine busy with the store and the other workers. Generous: a correct holder takes a
/// few milliseconds.
const PAUSE_SLACK: Duration = Duration::from_millis(250);

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

/// The faults that hit `hold`'s worker and can cost it its hold, begun before `before` and
/// not healed before the hold began.
fn hitting<'a>(run: &Run<'a>, hold: &Hold, before: u64) -> impl Iterator<Item = &'a FaultRecord> {
    let grant = hold.grant;
    run.costly_faults_on(hold.worker)
        .filter(move |f| f.start < before && f.end >= grant)
}

/// A fault that explains an overlap of `hold` by a grant at `at`: one of [`hitting`] that
/// outlasted what the hold was vouched for.
fn explaining_fault<'a>(run: &Run<'a>, hold: &Hold, at: u64) -> Option<&'a FaultRecord> {
    hitting(run, hold, at).find(|f| outlasted(run, hold, f, at))
}

/// Whether the store may have given away, by `at`, `hold`, whose holder `f` hit: `at` is past
/// the hold's [`Run::horizon`] for `f`, and `f` had not healed by then (less the drift
/// allowance; a kill never heals). Holds that end with their connection, and every hold of a
/// store that a restart made forget them, may be given away as soon as the fault begins.
fn outlasted(run: &Run<'_>, hold: &Hold, f: &FaultRecord, at: u64) -> bool {
    if run.terms.connection_bound || f.kind == FaultKind::Restart {
        return true;
    }
    let horizon = run.horizon(hold, f.start);
    let healed = f.kind != FaultKind::Kill && f.end.saturating_add(ns(run.allowance())) < horizon;
    at >= horizon && !healed
}

/// The latest moment the older holder of an overlap that `f` explains, overlapped by a grant
/// at `at`, may be told (see the module's docs).
fn told_by(run: &Run<'_>, f: &FaultRecord, at: u64) -> u64 {
    let after = if run.terms.connection_bound || f.kind == FaultKind::Restart {
        at.max(f.end).saturating_add(ns(run.terms.lease))
    } else if f.kind == FaultKind::Pause {
        at.max(f.end).saturating_add(ns(PAUSE_SLACK))
    } else {
        at
    };
    after.saturating_add(ns(run.allowance()))
}

/// An overlap of `older` by `newer`: explained (a fault hit the older holder and outlasted its
/// hold, and it was told in time) or a violation.
fn judge(run: &Run<'_>, name: &str, older: &Hold, newer: &Hold, report: &mut Report) {
    let Some(fault) = explaining_fault(run, older, newer.grant) else {
        report.overlaps_unexplained += 1;
        let why = match hitting(run, older, newer.grant).last() {
            None => "with no fault on the first".to_owned(),
            Some(f) => format!(
                "while the {} that hit the first from {:.1} ms to {:.1} ms cannot have cost it \
                 its hold by then (the store had to keep it until {:.1} ms)",
                f.kind,
                ms(f.start),
                ms(f.end),
                ms(run.horizon(older, f.start))
            ),
        };
        report.violations.push(format!(
            "unexplained overlap on {name}: worker {} ({:?}, token {}) held from {:.1} ms to \
             {:.1} ms and worker {} ({:?}, token {}) got it at {:.1} ms, {why}",
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
            let delay = (i128::from(*told) - i128::from(newer.grant)) / 1_000_000;
            let delay = i64::try_from(delay).unwrap_or(i64::MAX);
            report.worst_report_delay_ms =
                Some(report.worst_report_delay_ms.map_or(delay, |w| w.max(delay)));
            report
                .worst_report_delay_by_fault_ms
                .entry(fault.kind.to_string())
                .and_modify(|w| *w = (*w).max(delay))
                .or_insert(delay);
            let deadline = told_by(run, fault, newer.grant);
            if *told <= deadline {
                report.overlaps_explained += 1;
                return;
            }
            report.told_late += 1;
            report.violations.push(format!(
                "told late: worker {} was told it lost {name} (token {}) at {:.1} ms, {delay} ms \
                 after worker {} (token {}) got it; hit by a {} from {:.1} ms to {:.1} ms, it \
                 had to be told by {:.1} ms",
                older.worker,
                older.token,
                ms(*told),
                newer.worker,
                newer.token,
                fault.kind,
                ms(fault.start),
                ms(fault.end),
                ms(deadline)
            ));
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
    use super::super::Terms;
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
        let pause = fault(FaultKind::Pause, 1, S / 2, 3 * S);
        let r = run_on(&history(false), &[pause], false);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert!(r.violations[0].contains("never told"), "{:?}", r.violations);
    }

    /// A restart of a store that forgets its holds hits every worker: it explains an overlap
    /// of any holder that was told, at once, and its liveness message names every worker, not
    /// a number. On a durable store the holds survive it, and it explains nothing.
    #[test]
    fn a_restart_explains_an_overlap_only_on_a_store_that_forgets() {
        let restart = fault(FaultKind::Restart, EVERY_WORKER, S + S / 2, S + S / 2);
        let h = told_after_overlap();
        let forgets = Terms {
            durable: false,
            ..TERMS
        };
        let r = run_with(&h, std::slice::from_ref(&restart), forgets);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.overlaps_explained, 1);
        assert_eq!(restart.whom(), "every worker");
        let r = run_with(&h, &[], forgets);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        let r = run(&h, std::slice::from_ref(&restart));
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert_violation(&r, "unexplained overlap");
    }

    /// A fault explains an overlap only if the store may have given the hold away by the
    /// newer grant: it began at least two thirds of a lease (less the drift allowance) before
    /// it, and had not healed by then. A store that frees a stalled holder's lock sooner is
    /// caught.
    #[test]
    fn a_fault_explains_an_overlap_only_past_the_holders_horizon() {
        // Worker 1 holds from 1 s; worker 2 is granted at 4 s; worker 1 is told at 4.01 s;
        // worker 3 is granted after every fault healed.
        let h = [
            grant(1, 1, S, 1),
            grant(2, 1, 4 * S, 2),
            lost(1, 1, 4 * S + S / 100),
            exit(1, 1, 4 * S + S / 100),
            exit(2, 1, 5 * S),
            grant(3, 1, 7 * S, 3),
            exit(3, 1, 7 * S + S / 2),
        ];
        for kind in [
            FaultKind::Pause,
            FaultKind::Partition,
            FaultKind::OneWay,
            FaultKind::Silent,
        ] {
            // Began 2 s before the grant (a lease: its hold ran out), still on: explained.
            let long = fault(kind, 1, 2 * S, 6 * S);
            let r = run(&h, &[long]);
            assert!(r.violations.is_empty(), "{kind}: {:?}", r.violations);
            assert_eq!(r.overlaps_explained, 1, "{kind}");
            // Began 1.2 s before it: the hold had been renewed at most 0.67 s before the
            // fault, so the store had to keep it until 1.33 s after the fault began.
            let late = fault(kind, 1, 4 * S - S * 6 / 5, 6 * S);
            let r = run(&h, &[late]);
            assert_eq!(r.overlaps_unexplained, 1, "{kind}: {:?}", r.violations);
            assert_violation(&r, "cannot have cost it its hold");
            // Began long before it but healed after 0.5 s, well before the hold could end.
            let short = fault(kind, 1, 2 * S, 2 * S + S / 2);
            let r = run(&h, &[short]);
            assert_eq!(r.overlaps_unexplained, 1, "{kind}: {:?}", r.violations);
        }
        // A hold that lives in its connection ends when the connection does: a fault explains
        // its overlap from its start.
        let late = fault(FaultKind::Partition, 1, 4 * S - S / 10, 6 * S);
        let r = run_on(&h, &[late], true);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }

    /// A renewal confirmed later than a timely watchdog's (its timer fired late on a busy
    /// machine) leaves the store free to give the hold away sooner after a fault: the moment
    /// the guard was seen to vouch for, plus the drift allowance, is the store's bound when it
    /// comes before the model's, by 250 ms at most. It never moves the bound later.
    #[test]
    fn a_late_renewal_the_guard_saw_moves_the_horizon_sooner_only() {
        // The fault began 1.245 s before worker 2's grant at 4 s: the model's bound (two
        // thirds of the lease, less the allowance of 25 ms and 50 ms for a late renewal) is
        // 1.2583 s after it.
        let silent = [fault(FaultKind::Silent, 1, 4 * S - S * 1245 / 1000, 6 * S)];
        let history = |until: Option<u64>| {
            let mut h = vec![grant(1, 1, S, 1)];
            h.extend(until.map(|u| vouched(1, 1, S + S / 10, u)));
            h.extend([
                grant(2, 1, 4 * S, 2),
                lost(1, 1, 4 * S),
                exit(1, 1, 4 * S + S / 1000),
                exit(2, 1, 5 * S),
                grant(3, 1, 7 * S, 3),
                exit(3, 1, 7 * S + S / 2),
            ]);
            h
        };
        // Unseen: the model alone, which the grant came before.
        let r = run(&history(None), &silent);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert_violation(&r, "the store had to keep it until 4013.3 ms");
        // Seen to vouch until 3.975 s: the store's bound is 4 s, the grant's own instant.
        let r = run(&history(Some(4 * S - S / 40)), &silent);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.overlaps_explained, 1);
        // A millisecond more: the grant came before the store's bound.
        let r = run(&history(Some(4 * S - S / 40 + S / 1000)), &silent);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert_violation(&r, "the store had to keep it until 4001.0 ms");
        // Seen to vouch beyond the model's bound (a slow clock's guard): the model's holds.
        let r = run(&history(Some(5 * S)), &silent);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert_violation(&r, "the store had to keep it until 4013.3 ms");
        // A fault that began 1 s before the grant: the model's bound is 4.2583 s, and no
        // renewal seen, however late, excuses a grant 250 ms or more before it (a keeper
        // that renews that late is at fault).
        let later_fault = [fault(FaultKind::Silent, 1, 3 * S, 6 * S)];
        let r = run(&history(Some(3 * S + S / 2)), &later_fault);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert_violation(&r, "the store had to keep it until 4008.3 ms");
    }

    /// An older holder still running must be told of its loss by the newer grant plus the
    /// drift allowance; a paused one by the pause's end plus a slack. Later is a violation,
    /// and the worst delays are reported by fault.
    #[test]
    fn a_holder_told_late_is_a_violation() {
        let told_at = |t| {
            [
                grant(1, 1, S, 1),
                grant(2, 1, 4 * S, 2),
                lost(1, 1, t),
                exit(1, 1, t),
                exit(2, 1, 6 * S),
                grant(3, 1, 9 * S, 3),
                exit(3, 1, 9 * S + S / 2),
            ]
        };
        let partition = fault(FaultKind::Partition, 1, 2 * S, 5 * S);
        let r = run(&told_at(4 * S + S / 100), std::slice::from_ref(&partition));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.worst_report_delay_by_fault_ms.get("partition"), Some(&10));
        let r = run(&told_at(4 * S + S / 2), std::slice::from_ref(&partition));
        assert_eq!(r.told_late, 1, "{:?}", r.violations);
        assert_violation(&r, "told late");
        assert_eq!(r.overlaps_explained, 0);
        // A pause until 5 s: told at 5.1 s is in time, at 5.6 s late.
        let pause = fault(FaultKind::Pause, 1, 2 * S, 5 * S);
        let r = run(&told_at(5 * S + S / 10), std::slice::from_ref(&pause));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.worst_report_delay_by_fault_ms.get("pause"), Some(&1100));
        let r = run(&told_at(5 * S + S * 6 / 10), std::slice::from_ref(&pause));
        assert_eq!(r.told_late, 1, "{:?}", r.violations);
        assert_violation(&r, "told late");
        // A connection-bound holder is told by its connection check or its release: within a
        // lease of the fault's end.
        let r = run_on(
            &told_at(5 * S + S / 2),
            std::slice::from_ref(&partition),
            true,
        );
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        let r = run_on(&told_at(8 * S), &[partition], true);
        assert_violation(&r, "told late");
    }

    /// A third permit of two is explained by the one holder a fault hit (and who was told),
    /// not blamed on a holder whose permit was never in doubt.
    #[test]
    fn an_over_granted_permit_is_judged_on_the_stale_holder() {
        let pause = fault(FaultKind::Pause, 2, 2 * S + S / 2, 4 * S + S / 2);
        let h = [
            permit(1, 1, S, 1),
            permit(2, 1, 2 * S, 2),
            permit(3, 1, 4 * S, 3),
            lost(2, 1, 4 * S + S * 6 / 10),
            exit(2, 1, 4 * S + S * 7 / 10),
            exit(3, 1, 5 * S),
            permit(3, 2, 5 * S + S / 5, 4),
            exit(3, 2, 5 * S + S / 2),
            exit(1, 1, 6 * S),
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

    /// A blip heals before any store may give a stalled hold away, so it explains no
    /// overlap: one during a blip is unexplained, whatever its length, on any store and even
    /// when its holder was told; the report counts blips by kind. A silent network of the same
    /// span explains it.
    #[test]
    fn a_blip_explains_no_overlap() {
        // Worker 1 holds from 1 s; a blip hits it from 1.2 s to 2.2 s (half the lease);
        // worker 2 is granted at 2.1 s; worker 1 is told at 2.11 s.
        let h = [
            grant(1, 1, S, 1),
            grant(2, 1, 2 * S + S / 10, 2),
            lost(1, 1, 2 * S + S * 11 / 100),
            exit(1, 1, 2 * S + S * 11 / 100),
            exit(2, 1, 3 * S),
            grant(3, 1, 4 * S, 3),
            exit(3, 1, 4 * S + S / 2),
        ];
        for kind in [FaultKind::BlipPause, FaultKind::BlipPartition] {
            let blip = fault(kind, 1, S + S / 5, 2 * S + S / 5);
            for connection_bound in [false, true] {
                let r = run_on(&h, std::slice::from_ref(&blip), connection_bound);
                assert_eq!(r.overlaps_unexplained, 1, "{kind}: {:?}", r.violations);
                assert_eq!(r.overlaps_explained, 0, "{kind}");
                assert_violation(&r, "unexplained overlap");
                assert_eq!(r.faults.get(&kind.to_string()), Some(&1), "{kind}");
            }
            let forgets = Terms {
                durable: false,
                ..TERMS
            };
            let r = run_with(&h, std::slice::from_ref(&blip), forgets);
            assert_eq!(r.overlaps_unexplained, 1, "{kind}: {:?}", r.violations);
            // Recorded as lasting past the horizon, a blip still explains nothing: the kind,
            // not the record, says it cannot cost a hold.
            let long = fault(kind, 1, S / 10, 3 * S);
            let r = run(&h, &[long]);
            assert_eq!(r.overlaps_unexplained, 1, "{kind}: {:?}", r.violations);
        }
        // Not even beside a costly fault that hit another worker.
        let elsewhere = fault(FaultKind::Silent, 2, S / 10, 2 * S);
        let blip = fault(FaultKind::BlipPause, 1, S + S / 5, 2 * S + S / 5);
        let r = run(&h, &[blip, elsewhere]);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        // A silent network on the holder that began a lease before the grant explains it.
        let silent = fault(FaultKind::Silent, 1, S / 10, 3 * S);
        let r = run(&h, &[silent]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.overlaps_explained, 1);
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
