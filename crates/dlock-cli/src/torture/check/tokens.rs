//! Tokens of exclusive holds: never issued twice for a name, rising in grant order.
//!
//! A grant is stamped when `acquire` has returned and the worker found the hold still held,
//! so a hold whose lease ended on the way is not stamped at all (`LostBeforeUse`). A worker
//! can still be stamped late with a hold its guard calls held: a connection-bound hold
//! whose connection a fault reset while the worker was stopped is only found gone by its
//! next check, and a later holder (with a higher token) may have been stamped first. Such a
//! pair is no violation when a fault that can cost a hold hit the late worker inside that
//! window (after its previous event, before the higher token's stamp) and its guard reported
//! the hold lost; anything else is.

use std::collections::HashMap;

use super::Report;
use super::model::{Hold, Run};

/// Checks the tokens of every exclusive hold, name by name.
pub(super) fn check(run: &Run<'_>, report: &mut Report) {
    for (name, hs) in run.by_name(|h| h.kind.exclusive()) {
        let mut seen: HashMap<u64, u32> = HashMap::new();
        // The hold with the highest token so far.
        let mut top: Option<&Hold> = None;
        for &h in &hs {
            match top {
                Some(t) if h.token <= t.token => {
                    if stamped_late(run, h, t) {
                        report.late_grants_explained += 1;
                    } else {
                        report.fenced_violations += 1;
                        report.violations.push(format!(
                            "token went backwards on {name}: worker {} got {} after worker {} got {}",
                            h.worker, h.token, t.worker, t.token
                        ));
                    }
                }
                _ => top = Some(h),
            }
        }
        for h in &hs {
            if let Some(other) = seen.insert(h.token, h.worker) {
                report.fenced_violations += 1;
                report.violations.push(format!(
                    "token {} issued twice on {name} (workers {other} and {})",
                    h.token, h.worker
                ));
            }
        }
    }
}

/// Whether `late` (a lower token stamped after `higher`'s) was stamped late: a fault that can
/// cost a hold hit its worker while it acquired (after its previous event, before `higher`
/// was stamped, healed before its own stamp), and its guard said the hold was lost.
fn stamped_late(run: &Run<'_>, late: &Hold, higher: &Hold) -> bool {
    late.lost.is_some()
        && run
            .costly_faults_on(late.worker)
            .any(|f| f.start >= late.since && f.start < higher.grant && f.end <= late.grant)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::torture::history::{FaultKind, Stamped, WorkerEvent};

    #[test]
    fn repeated_and_backward_tokens_are_violations() {
        let r = run(&handoff(5, 5), &[]);
        assert_violation(&r, "issued twice");
        assert!(r.fenced_violations >= 1);
    }

    /// A worker paused between its acquisition and its Grant line is stamped after a later
    /// holder with a higher token. That is no violation when the pause hit it in that window
    /// and it was told the hold was lost; the same history without the pause, or with the
    /// late holder never told, is one.
    #[test]
    fn a_grant_stamped_late_after_a_pause_is_explained_only_if_told() {
        let pause = fault(FaultKind::Pause, 1, S + S / 2, 3 * S);
        let released_before = released(1, 1, S, true);
        let h = [
            released_before,
            grant(2, 1, 2 * S, 43),
            exit(2, 1, 2 * S + S / 2),
            grant(1, 2, 3 * S + S / 10, 29),
            lost(1, 2, 3 * S + S / 5),
            exit(1, 2, 3 * S + S / 5),
        ];
        let r = run(&h, std::slice::from_ref(&pause));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.late_grants_explained, 1);
        assert_eq!(r.fenced_violations, 0);

        let r = run(&h, &[]);
        assert_violation(&r, "went backwards");

        let untold: Vec<Stamped> = h
            .iter()
            .filter(|s| !matches!(s.event, WorkerEvent::Lost { .. }))
            .cloned()
            .collect();
        let r = run(&untold, std::slice::from_ref(&pause));
        assert_violation(&r, "went backwards");

        // A pause before the worker's previous event is not in the acquisition's window.
        let early = fault(FaultKind::Pause, 1, S / 2, S / 2 + S / 10);
        let r = run(&h, &[early]);
        assert_violation(&r, "went backwards");
    }
}
