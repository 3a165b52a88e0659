//! Liveness: after every fault healed, some worker acquired within the bound (the lease plus
//! a slack); a stall's violation says where the time went.

use std::collections::BTreeMap;

use super::Report;
use super::model::{Run, event_time, ms};
use crate::torture::history::{FaultRecord, WorkerEvent};

/// Checks that the run made progress at all, and again after each fault healed.
pub(super) fn check(run: &Run<'_>, report: &mut Report) {
    let (start, end, bound) = (run.start, run.end, run.liveness_bound);
    let bound_ns = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    let mut grants: Vec<u64> = run.holds.iter().map(|h| h.grant).collect();
    grants.sort_unstable();
    if grants.is_empty() && end > start.saturating_add(bound_ns) {
        report
            .violations
            .push("no worker ever acquired anything".into());
        return;
    }
    for f in run.faults {
        let healed = f.end;
        if healed.saturating_add(bound_ns) > end {
            continue;
        }
        let next = grants.iter().find(|g| **g >= healed).copied();
        match next {
            Some(g) => {
                let took = (g - healed) / 1_000_000;
                report.worst_recovery_ms =
                    Some(report.worst_recovery_ms.map_or(took, |w| w.max(took)));
                if g - healed > bound_ns {
                    report.violations.push(format!(
                        "stuck: no grant for {took} ms after the {} of {} healed (bound {} ms); {}",
                        f.kind,
                        f.whom(),
                        bound.as_millis(),
                        stall(run, f, g)
                    ));
                }
            }
            None => report.violations.push(format!(
                "stuck: no grant after the {} of {} healed at {:.1} ms; {}",
                f.kind,
                f.whom(),
                ms(healed),
                stall(run, f, end)
            )),
        }
    }
}

/// Where the time of a stall went, for its violation: the holds open while the fault lasted
/// (times from its heal: when they were granted, when their critical section ended, which for
/// a killed worker is its death) and what each worker said between the heal and the next
/// grant. A run in CI leaves nothing but its output behind, so the message carries what a
/// reader needs to tell a slow store from a stuck one.
fn stall(run: &Run<'_>, fault: &FaultRecord, until: u64) -> String {
    let healed = fault.end;
    let rel = |t: u64| {
        let signed = i128::from(t) - i128::from(healed);
        format!("{:+.0} ms", signed as f64 / 1e6)
    };
    let open: Vec<String> = run
        .holds
        .iter()
        .filter(|h| h.grant <= healed && h.end >= fault.start)
        .map(|h| {
            format!(
                "worker {} held {} (granted {}, section ended {})",
                h.worker,
                h.name,
                rel(h.grant),
                rel(h.end)
            )
        })
        .collect();
    let mut said: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for s in run.history {
        let t = event_time(&s.event);
        if t <= healed || t > until {
            continue;
        }
        let what = match &s.event {
            WorkerEvent::Start { .. } => "started".to_owned(),
            WorkerEvent::Lost { name, reason, .. } => format!("lost {name} ({reason})"),
            WorkerEvent::Release { ok, .. } => format!("released (ok: {ok})"),
            WorkerEvent::Error { what, .. } => format!("error: {what}"),
            WorkerEvent::LostBeforeUse { name, reason, .. } => {
                format!("got {name} too late to use ({reason})")
            }
            WorkerEvent::Stop { .. } => "stopped".to_owned(),
            WorkerEvent::Grant { .. } | WorkerEvent::Fenced { .. } | WorkerEvent::Exit { .. } => {
                continue;
            }
        };
        let list = said.entry(s.worker).or_default();
        // A worker that keeps failing says so once per kind of message, with its first time.
        if list.len() < 4 && !list.iter().any(|l| l.ends_with(&what)) {
            list.push(format!("{} {what}", rel(t)));
        }
    }
    let open = if open.is_empty() {
        "no hold was open during the fault".to_owned()
    } else {
        format!("open during the fault: {}", open.join(", "))
    };
    let said: Vec<String> = said
        .into_iter()
        .map(|(w, l)| format!("worker {w}: {}", l.join(", ")))
        .collect();
    if said.is_empty() {
        format!("{open}; no worker said anything until the next grant")
    } else {
        format!("{open}; until the next grant, {}", said.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::torture::history::{FaultKind, Stamped, WorkerEvent};

    #[test]
    fn a_run_stuck_after_a_fault_is_a_violation() {
        let h = [grant(1, 1, S, 1), exit(1, 1, 2 * S)];
        let f = fault(FaultKind::Partition, 1, 3 * S, 4 * S);
        let r = run(&h, &[f]);
        assert_violation(&r, "stuck");
    }

    #[test]
    fn a_stall_says_what_was_held_and_what_the_workers_said() {
        // Worker 1 holds n from S and is killed at 2S (its hold lasts till its death); worker
        // 2 keeps failing; the next grant comes at 7S, past the bound (4 s).
        let failed = |t| Stamped {
            worker: 2,
            event: WorkerEvent::Error {
                t,
                what: "pool timed out".into(),
            },
        };
        let h = [
            grant(1, 1, S, 1),
            failed(3 * S),
            failed(4 * S),
            grant(2, 1, 7 * S, 2),
        ];
        let f = fault(FaultKind::Kill, 1, 2 * S, 2 * S + S / 100);
        let r = run(&h, &[f]);
        let stuck = r
            .violations
            .iter()
            .find(|v| v.contains("stuck"))
            .unwrap_or_else(|| panic!("{:?}", r.violations));
        assert!(stuck.contains("worker 1 held n"), "{stuck}");
        assert!(stuck.contains("worker 2: +"), "{stuck}");
        assert_eq!(stuck.matches("pool timed out").count(), 1, "{stuck}");
    }
}
