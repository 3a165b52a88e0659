//! Liveness: after every fault healed, some worker acquired within the bound (the lease plus
//! a slack), and every name the fault's worker held while it lasted (until its release
//! answered, not only in its critical section) was granted again (to anyone) within a longer
//! bound; a stall's violation says where the time went.
//!
//! Per name, the bound adds twice the lease, the longest a worker waits for another name
//! before it tries again: a name is only granted when some worker asks for it, and the
//! workers draw their names at random. Generous on purpose: a correct store grants a freed
//! name to its waiters at once; what it catches is a name that is never given again (a hold
//! that outlives its dead holder).

use std::collections::{BTreeMap, BTreeSet};

use super::Report;
use super::model::{Run, event_time, ms};
use crate::torture::history::{FaultRecord, WorkerEvent};

/// Checks that the run made progress at all, and again after each fault healed, on every
/// name the fault could leave stuck.
pub(super) fn check(run: &Run<'_>, report: &mut Report) {
    overall(run, report);
    per_name(run, report);
}

/// Every name that a fault's worker held while the fault lasted is granted again, to anyone,
/// within the bound after the fault healed (see the module's docs).
fn per_name(run: &Run<'_>, report: &mut Report) {
    let bound = run
        .liveness_bound
        .saturating_add(run.terms.lease.saturating_mul(2));
    let bound_ns = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    let by_name = run.by_name(|_| true);
    for f in run.faults {
        let due = f.end.saturating_add(bound_ns);
        if due > run.end {
            continue;
        }
        let mut judged: BTreeSet<&str> = BTreeSet::new();
        // Held by the fault's worker while it lasted: granted before it healed, and not yet
        // released when it began (a worker killed while it released holds on).
        let held = run.holds.iter().filter(|h| {
            f.hits(h.worker) && h.grant <= f.end && h.released.unwrap_or(u64::MAX) >= f.start
        });
        for h in held {
            if !judged.insert(h.name.as_str()) {
                continue;
            }
            let next = by_name
                .get(h.name.as_str())
                .and_then(|hs| hs.iter().find(|o| o.grant > h.grant))
                .map(|o| o.grant);
            let when = match next {
                Some(g) if g <= due => continue,
                Some(g) => format!("for {} ms", g.saturating_sub(f.end) / 1_000_000),
                None => "until the run ended".to_owned(),
            };
            report.violations.push(format!(
                "stuck: {} was not granted again {when} after the {} of {} healed at {:.1} ms \
                 (bound {} ms); worker {} held it from {:.1} ms, its section ended at {:.1} ms",
                h.name,
                f.kind,
                f.whom(),
                ms(f.end),
                bound.as_millis(),
                h.worker,
                ms(h.grant),
                ms(h.end)
            ));
        }
    }
}

/// Some worker was granted something after each fault healed, within the bound.
fn overall(run: &Run<'_>, report: &mut Report) {
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
            WorkerEvent::Timeout { name, .. } => format!("gave up waiting for {name}"),
            WorkerEvent::Enqueue { .. } => continue,
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

    /// A name whose holder was killed and that no one is granted again is stuck, even while
    /// the other names keep being granted; also when the holder was killed after its
    /// critical section, before its release answered.
    #[test]
    fn a_name_never_granted_again_after_a_fault_is_a_violation() {
        let kill = fault(FaultKind::Kill, 1, 2 * S, 2 * S + S / 100);
        let mut h = vec![
            grant(1, 1, S, 1),
            on("x", grant(1, 2, S, 1)),
            exit(1, 2, 2 * S - S / 10),
        ];
        for i in 0..20 {
            let t = 3 * S + i * S;
            h.push(on("o", grant(2, i + 1, t, i + 1)));
            h.push(exit(2, i + 1, t + S / 10));
        }
        let r = run(&h, std::slice::from_ref(&kill));
        assert_violation(&r, "n was not granted again until the run ended");
        assert_violation(&r, "x was not granted again until the run ended");
        assert!(!r.violations.iter().any(|v| v.contains(" o ")), "{:?}", r);
        // Released before the kill: the store gave x back, whoever asks for it next.
        let mut freed = h.clone();
        freed.insert(3, released(1, 2, 2 * S - S / 20, true));
        let r = run(&freed, std::slice::from_ref(&kill));
        assert!(!r.violations.iter().any(|v| v.contains("x was")), "{:?}", r);
        // Granted again 5 s after the kill (within the lease, the slack and two waits): no
        // violation; 9 s after it, one.
        for (after, stuck) in [(5, false), (11, true)] {
            let mut again = freed.clone();
            again.push(grant(3, 1, after * S, 2));
            again.push(exit(3, 1, after * S + S / 10));
            let r = run(&again, std::slice::from_ref(&kill));
            assert_eq!(
                r.violations.iter().any(|v| v.contains("not granted again")),
                stuck,
                "{after} s: {:?}",
                r.violations
            );
        }
    }

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
