//! Fairness: on a fair lock, no waiter is overtaken by a later one. From each fair
//! acquisition's `Enqueue` (when it began to wait) and its outcome (its `Grant`, or its
//! `Timeout`), for every two waiters A and B of one name, from different workers, where A
//! began waiting at least [`ENQUEUE_MARGIN`] before B and was still waiting when B began: if B
//! was granted while A still waited (A was granted later, or gave up later), A was overtaken.
//! That is a violation unless a fault hit A's worker between a settling time before A began and
//! B's grant (see [`explained`]). A waiter that gave up before B's grant is not overtaken, and
//! an acquisition that ended in an error, a hold lost before use, or not at all (its worker
//! died, the run ended) is not judged: when the store dropped it is unknown.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::Report;
use super::model::{Run, ms, nanos};
use crate::torture::history::{HoldKind, Stamped, WorkerEvent};

/// How much earlier than B a waiter A must have stamped its `Enqueue` to be owed the lock
/// first. The store orders waiters by the arrival of their queueing call, not by the client's
/// stamp: between the two lie the handle's construction, a pooled connection's checkout, the
/// proxy and the scheduler of a loaded machine (workers, proxies and the store share its
/// cores), a few milliseconds, tens when a worker is descheduled on a busy machine (CI runs the
/// attack beside other tests). Waiters closer than this are not compared.
const ENQUEUE_MARGIN: Duration = Duration::from_millis(150);

/// How a fair wait ended.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// Granted at this time (its `Grant` stamp).
    Granted(u64),
    /// Gave up: the store may drop it from this time on, the earlier of its deadline (its
    /// timer cannot fire before) and its `Timeout` stamp (it had left by then).
    GaveUp(u64),
}

impl Outcome {
    /// When the wait ended.
    fn at(self) -> u64 {
        match self {
            Self::Granted(t) | Self::GaveUp(t) => t,
        }
    }
}

/// One fair wait with a known outcome.
#[derive(Debug, Clone)]
struct Wait<'a> {
    /// Its worker.
    worker: u32,
    /// The name waited for.
    name: &'a str,
    /// When it began (its `Enqueue` stamp).
    enqueued: u64,
    /// How it ended.
    outcome: Outcome,
}

/// Checks that no fair waiter was overtaken by a later one (see the module's docs), counting
/// the pairs judged and the overtakes a fault explains.
pub(super) fn check(run: &Run<'_>, report: &mut Report) {
    let margin = nanos(ENQUEUE_MARGIN);
    let mut by_name: BTreeMap<&str, Vec<Wait<'_>>> = BTreeMap::new();
    for w in waits(run.history) {
        by_name.entry(w.name).or_default().push(w);
    }
    for waits in by_name.values_mut() {
        waits.sort_by_key(|w| (w.enqueued, w.worker));
        for (i, a) in waits.iter().enumerate() {
            // The first later waiter granted while A still waited: one violation per A.
            let mut overtaken = None;
            for b in &waits[i + 1..] {
                let Outcome::Granted(granted) = b.outcome else {
                    continue;
                };
                // Waits are sorted by their start: so are those of the same worker, which
                // never overlap.
                if b.worker == a.worker
                    || b.enqueued < a.enqueued.saturating_add(margin)
                    || a.outcome.at() <= b.enqueued
                {
                    continue;
                }
                match a.outcome {
                    Outcome::Granted(t) if t < granted => report.fair_pairs_checked += 1,
                    // Gone before B's grant: B overtook no one.
                    Outcome::GaveUp(t) if t <= granted => {}
                    Outcome::Granted(_) | Outcome::GaveUp(_) => {
                        report.fair_pairs_checked += 1;
                        if explained(run, a, granted) {
                            report.fair_overtakes_explained += 1;
                        } else if overtaken.is_none() {
                            overtaken = Some((b, granted));
                        }
                    }
                }
            }
            if let Some((b, granted)) = overtaken {
                let then = match a.outcome {
                    Outcome::Granted(t) => format!("granted at {:.1} ms", ms(t)),
                    Outcome::GaveUp(t) => format!("gave up at {:.1} ms", ms(t)),
                };
                report.violations.push(format!(
                    "overtaken: worker {} waited for the fair lock {} from {:.1} ms, worker {} \
                     began waiting {:.1} ms later and was granted at {:.1} ms, while worker {} \
                     still waited ({then}); no fault hit worker {} meanwhile",
                    a.worker,
                    a.name,
                    ms(a.enqueued),
                    b.worker,
                    ms(b.enqueued.saturating_sub(a.enqueued)),
                    ms(granted),
                    a.worker,
                    a.worker
                ));
            }
        }
    }
}

/// Whether a fault explains that A lost its place before `granted` (a later waiter's grant):
/// any fault that hit A's worker from a lease (or a session, if longer) before A began waiting
/// until that grant. A pause, a partition or a kill can cost a waiter its place (its session or
/// its queue entry can expire, it can miss its turn); latency, delayed replies, a one-way cut or
/// a reset can hold its queueing call back past a later waiter's; and a worker whose
/// connections were cut reconnects with a backoff after the fault healed, so its first calls
/// after the heal may arrive late too (bounded by the lease, which its watchdog's renewals also
/// live within).
fn explained(run: &Run<'_>, a: &Wait<'_>, granted: u64) -> bool {
    let since = a
        .enqueued
        .saturating_sub(nanos(run.terms.lease.max(run.terms.span)));
    run.faults
        .iter()
        .any(|f| f.hits(a.worker) && f.start <= granted && f.end >= since)
}

/// Every fair wait whose outcome is known, rebuilt from each worker's events: an `Enqueue`
/// ends at its worker's next event, a `Grant` of its name (granted) or a `Timeout` of its
/// attempt (gave up); any other next event leaves it unjudged.
fn waits(history: &[Stamped]) -> Vec<Wait<'_>> {
    let mut open: HashMap<u32, (u64, &str, u64, u64)> = HashMap::new();
    let mut waits = Vec::new();
    for s in history {
        let w = s.worker;
        if let WorkerEvent::Enqueue {
            t,
            attempt,
            name,
            kind: HoldKind::Fair,
            wait_ms,
            ..
        } = &s.event
        {
            let deadline = t.saturating_add(wait_ms.saturating_mul(1_000_000));
            open.insert(w, (*attempt, name.as_str(), *t, deadline));
            continue;
        }
        let Some((attempt, name, enqueued, deadline)) = open.remove(&w) else {
            continue;
        };
        let outcome = match &s.event {
            WorkerEvent::Grant {
                t,
                name: granted,
                kind: HoldKind::Fair,
                ..
            } if granted == name => Outcome::Granted(*t),
            WorkerEvent::Timeout { t, attempt: a, .. } if *a == attempt => {
                Outcome::GaveUp((*t).min(deadline))
            }
            _ => continue,
        };
        waits.push(Wait {
            worker: w,
            name,
            enqueued,
            outcome,
        });
    }
    waits
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::torture::history::{FaultKind, Stamped, WorkerEvent};

    /// Worker 1 begins waiting for the fair lock `n` at 1 s, worker 2 at 1.5 s; worker 3
    /// holds it from 0.9 s to 2 s; then worker 1 is granted at `first`, worker 2 at `second`
    /// (tokens in grant order). A fair store grants worker 1 first.
    fn queue(first: u64, second: u64) -> Vec<Stamped> {
        let (one, two) = if first < second { (2, 3) } else { (3, 2) };
        vec![
            fair_grant(3, 1, S - S / 10, 1),
            enqueue(1, 1, S),
            enqueue(2, 1, S + S / 2),
            exit(3, 1, 2 * S),
            fair_grant(1, 1, first, one),
            exit(1, 1, first + S / 10),
            fair_grant(2, 1, second, two),
            exit(2, 1, second + S / 10),
        ]
    }

    /// Granted in the order they began to wait: one pair judged, no violation.
    #[test]
    fn waiters_granted_in_order_pass_and_are_counted() {
        let r = run(&queue(2 * S + S / 100, 3 * S), &[]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.fair_pairs_checked, 1);
    }

    /// Worker 2, which began 0.5 s later, is granted first with no fault on worker 1.
    #[test]
    fn a_later_waiter_granted_first_is_overtaking() {
        let r = run(&queue(3 * S, 2 * S + S / 100), &[]);
        assert_violation(&r, "overtaken: worker 1 waited for the fair lock n");
        assert_eq!(r.fair_pairs_checked, 1);
    }

    /// A waiter that still waited when the later one was granted was overtaken, even if it
    /// gave up later; one whose deadline had passed was not.
    #[test]
    fn a_waiter_that_gave_up_after_the_later_grant_was_overtaken() {
        // Worker 1 waits 4 s (until 5 s) and gives up; worker 2 is granted at 2 s.
        let h = vec![
            fair_grant(3, 1, S - S / 10, 1),
            enqueue(1, 1, S),
            enqueue(2, 1, S + S / 2),
            exit(3, 1, 2 * S),
            fair_grant(2, 1, 2 * S + S / 100, 2),
            exit(2, 1, 6 * S),
            timeout(1, 1, 5 * S),
        ];
        let r = run(&h, &[]);
        assert_violation(&r, "overtaken");
        // Gone before the grant (its deadline passed at 1.2 s): not overtaken.
        let mut quick = h;
        if let WorkerEvent::Enqueue { wait_ms, .. } = &mut quick[1].event {
            *wait_ms = 200;
        }
        let r = run(&quick, &[]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.fair_pairs_checked, 0);
    }

    /// Waiters within the margin of each other are not compared; a fault on the earlier
    /// waiter's worker explains its overtaking, one on the later waiter's does not.
    #[test]
    fn waiters_closer_than_the_margin_or_hit_by_a_fault_are_not_overtaken() {
        // Worker 2 began 20 ms after worker 1: the store may have seen it first.
        let mut close = queue(3 * S, 2 * S + S / 100);
        if let WorkerEvent::Enqueue { t, .. } = &mut close[2].event {
            *t = S + S / 50;
        }
        let r = run(&close, &[]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // A partition of worker 1 while it waited: it may have lost its place.
        let h = queue(3 * S, 2 * S + S / 100);
        let f = fault(FaultKind::Partition, 1, S + S / 10, S + S / 5);
        let r = run(&h, &[f]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.fair_overtakes_explained, 1);
        // A fault on the overtaking worker explains nothing.
        let f = fault(FaultKind::Partition, 2, S + S / 10, S + S / 5);
        let r = run(&h, &[f]);
        assert_violation(&r, "overtaken");
    }

    /// A wait that ended in an error, and grants with no recorded wait, are not judged.
    #[test]
    fn waits_without_a_known_outcome_or_on_plain_mutexes_are_not_judged() {
        // Worker 1's wait ends in an error: not judged.
        let mut h = queue(3 * S, 2 * S + S / 100);
        h.insert(
            4,
            Stamped {
                worker: 1,
                event: WorkerEvent::Error {
                    t: 2 * S,
                    what: "test".into(),
                },
            },
        );
        let r = run(&h, &[]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // Plain mutex grants (no enqueue recorded): nothing to judge.
        let r = run(&handoff(1, 2), &[]);
        assert_eq!(r.fair_pairs_checked, 0);
    }
}
