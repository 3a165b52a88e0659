//! Liveness: after every fault healed, some worker acquired within the bound (the span plus
//! a slack), and every name the fault's worker held while it lasted (until its release
//! answered, not only in its critical section) is granted again to whoever asks for it; a
//! stall's violation says where the time went.
//!
//! Per name, the check judges asks, not time: a name is only granted when some worker asks
//! for it, and the workers draw their names at random, so a quiet name proves nothing (with
//! long critical sections and many names, nobody may draw one for many spans). A name is
//! stuck when a worker asked for it once every earlier hold of it had to be gone (a span and
//! the slack after its release answered, or after its section ended if it never did), was
//! refused for its whole wait while no fault hit it, and nobody was granted the name
//! meanwhile: what it catches is a hold that outlives its dead holder.

use std::collections::{BTreeMap, BTreeSet};

use super::Report;
use super::model::{Hold, Run, ms};
use crate::torture::history::{FaultRecord, WorkerEvent};

/// Checks that the run made progress at all, and again after each fault healed, on every
/// name the fault could leave stuck.
pub(super) fn check(run: &Run<'_>, report: &mut Report) {
    overall(run, report);
    per_name(run, report);
}

/// Every name that a fault's worker held while the fault lasted is granted again after the
/// fault healed, to anyone who asks for it once the store must have freed it (see the
/// module's docs).
fn per_name(run: &Run<'_>, report: &mut Report) {
    let free_by = u64::try_from(run.liveness_bound.as_nanos()).unwrap_or(u64::MAX);
    let by_name = run.by_name(|_| true);
    let asks = asks(run);
    // When the store must have let a hold go, counted generously: a span and the slack after
    // its release answered, or after its critical section ended if it never did.
    let done = |h: &Hold| {
        h.released
            .unwrap_or(h.end)
            .max(h.end)
            .saturating_add(free_by)
    };
    for f in run.faults {
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
            let due = f.end.saturating_add(free_by).max(done(h));
            let others: &[&Hold] = by_name.get(h.name.as_str()).map_or(&[], Vec::as_slice);
            // The first ask that began once every earlier hold of the name had to be gone,
            // and was refused for its whole wait while nobody was granted the name: the
            // store kept a free name from a worker that asked for it.
            let Some(ask) = asks.iter().find(|a| {
                a.refused
                    && !a.set
                    && a.name == h.name
                    && a.start >= due
                    && others
                        .iter()
                        .all(|o| o.grant > a.end || (o.grant <= h.grant && done(o) <= a.start))
                    && !excused(run, &asks, a, free_by)
            }) else {
                continue;
            };
            report.violations.push(format!(
                "stuck: {} was not granted again after the {} of {} healed at {:.1} ms: \
                 worker {} asked for it at {:.1} ms ({} ms after the store had to free it) and \
                 gave up at {:.1} ms; worker {} held it from {:.1} ms, its section ended at \
                 {:.1} ms",
                h.name,
                f.kind,
                f.whom(),
                ms(f.end),
                ask.worker,
                ms(ask.start),
                ask.start.saturating_sub(due) / 1_000_000,
                ms(ask.end),
                h.worker,
                ms(h.grant),
                ms(h.end)
            ));
        }
    }
}

/// One acquisition of one name (or one name of a `MultiLock`'s acquisition), from its
/// `Enqueue` to its outcome.
struct Ask<'a> {
    worker: u32,
    name: &'a str,
    /// One of a `MultiLock`'s names: it may hold this one while it waits for the other.
    set: bool,
    /// Its `Enqueue` stamp.
    start: u64,
    /// Its outcome's stamp (`u64::MAX`: none, its worker died or the run ended first).
    end: u64,
    /// Whether it returned without a hold (a `Timeout`).
    refused: bool,
}

/// Every acquisition, from each worker's `Enqueue`s and what follows them: a `Timeout` of the
/// attempt refuses its name; any other event ends the worker's open asks, unrefused (a
/// `Grant`, a `LostBeforeUse` that was granted on the way, an `Error` that says nothing).
fn asks<'a>(run: &Run<'a>) -> Vec<Ask<'a>> {
    let mut open: BTreeMap<u32, Vec<(u64, Ask<'a>)>> = BTreeMap::new();
    let mut asks = Vec::new();
    for s in run.history {
        let mine = open.entry(s.worker).or_default();
        match &s.event {
            WorkerEvent::Enqueue {
                t,
                attempt,
                name,
                set,
                ..
            } => {
                if mine.first().is_some_and(|(a, _)| a != attempt) {
                    asks.extend(mine.drain(..).map(|(_, a)| Ask { end: *t, ..a }));
                }
                let ask = Ask {
                    worker: s.worker,
                    name: name.as_str(),
                    set: *set,
                    start: *t,
                    end: u64::MAX,
                    refused: false,
                };
                mine.push((*attempt, ask));
            }
            WorkerEvent::Timeout { t, attempt, name } => {
                if let Some(i) = mine
                    .iter()
                    .position(|(a, ask)| a == attempt && ask.name == name.as_str())
                {
                    let (_, ask) = mine.remove(i);
                    asks.push(Ask {
                        end: *t,
                        refused: true,
                        ..ask
                    });
                }
            }
            other => {
                let t = other.t();
                asks.extend(mine.drain(..).map(|(_, a)| Ask { end: t, ..a }));
            }
        }
    }
    asks.extend(open.into_values().flatten().map(|(_, a)| a));
    asks
}

/// Whether the refusal of `ask` may have another cause than a store that keeps a free name:
/// a fault hit its worker from a span and the slack before it until it ended (a worker
/// reconnects after a heal); another worker was granted the name meanwhile but found it lost
/// before use; or another worker's `MultiLock` may have held the name while it waited for
/// its other one. A fault on another worker while it asked for the name is no excuse,
/// though the store may then keep a grant that worker never reported for up to a span: with
/// kills every few seconds it excused every ask, and a store that keeps a dead holder's
/// name for good went uncaught.
fn excused(run: &Run<'_>, asks: &[Ask<'_>], ask: &Ask<'_>, free_by: u64) -> bool {
    // A fault on `worker` while it asked from `start` to `end` whose shadow (a span and the
    // slack after it healed) reaches `ask`.
    let shadows = |worker: u32, start: u64, end: u64| {
        run.faults.iter().any(|f| {
            f.hits(worker)
                && f.start <= end
                && f.end >= start
                && f.end.saturating_add(free_by) >= ask.start
        })
    };
    let from_before = ask.start.saturating_sub(free_by);
    // Granted to another worker on the way, and given back unused.
    let lost_before_use = run.history.iter().any(|s| {
        matches!(&s.event, WorkerEvent::LostBeforeUse { t, name, .. }
            if s.worker != ask.worker && name == ask.name && *t >= ask.start && *t <= ask.end)
    });
    lost_before_use
        || shadows(ask.worker, from_before, ask.end)
        || asks.iter().any(|o| {
            o.worker != ask.worker
                && o.name == ask.name
                && o.set
                && o.start <= ask.end
                && o.end >= ask.start
        })
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
        // A hold granted while the fault was on and still in its critical section when it
        // healed is progress the store made through the fault; its section (the workload's
        // to end, not the store's) keeps the next grant back, so the bound runs from its
        // end.
        let from = run
            .holds
            .iter()
            .filter(|h| h.grant >= f.start && h.grant <= healed && h.end > healed)
            .map(|h| h.end)
            .fold(healed, u64::max);
        if from.saturating_add(bound_ns) > end {
            continue;
        }
        let next = grants.iter().find(|g| **g >= healed).copied();
        match next {
            Some(g) => {
                let took = (g - healed) / 1_000_000;
                report.worst_recovery_ms =
                    Some(report.worst_recovery_ms.map_or(took, |w| w.max(took)));
                if g.saturating_sub(from) > bound_ns {
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
        let t = s.event.t();
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
            WorkerEvent::Grant { .. }
            | WorkerEvent::Fenced { .. }
            | WorkerEvent::Vouched { .. }
            | WorkerEvent::Exit { .. } => continue,
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
    use crate::torture::history::{FaultKind, FaultRecord, HoldKind, Stamped, WorkerEvent};

    /// A name whose holder was killed is stuck when a worker asks for it once the store had
    /// to free it and is refused for its whole wait, while nobody is granted it; also when
    /// the holder was killed after its critical section, before its release answered. A name
    /// nobody asks for, an ask made too soon, an asker hit by a fault of its own and a name
    /// somebody else was granted meanwhile say nothing.
    #[test]
    fn a_free_name_refused_after_a_fault_is_a_violation() {
        // Worker 1 holds n and x and is killed at 2 s: the store must free both by 6 s (the
        // span and the slack after the kill).
        let kill = fault(FaultKind::Kill, 1, 2 * S, 2 * S + S / 100);
        let mut base = vec![
            grant(1, 1, S, 1),
            on("x", grant(1, 2, S, 1)),
            exit(1, 2, 2 * S - S / 10),
        ];
        // The other names keep being granted.
        for i in 0..20 {
            let t = 3 * S + i * S;
            base.push(on("o", grant(2, i + 1, t, i + 1)));
            base.push(exit(2, i + 1, t + S / 10));
        }
        let refused = |worker: u32, name: &str, attempt: u64, from: u64, to: u64| {
            [
                on(name, enqueue(worker, attempt, from)),
                on(name, timeout(worker, attempt, to)),
            ]
        };
        // Worker `worker`'s MultiLock attempt on n (and another name) begins, or gives up.
        let set_ask = |worker: u32, attempt: u64, t: u64| {
            let mut e = enqueue(worker, attempt, t);
            if let WorkerEvent::Enqueue { set, kind, .. } = &mut e.event {
                *set = true;
                *kind = HoldKind::Mutex;
            }
            e
        };
        let set_timeout = |worker: u32, attempt: u64, t: u64| timeout(worker, attempt, t);
        // The violations of the base history with `more` events, under `faults`.
        let judge = |more: &[Stamped], faults: &[FaultRecord]| {
            let mut h = base.clone();
            h.extend_from_slice(more);
            run(&h, faults).violations
        };
        let says = |violations: &[String], what: &str| violations.iter().any(|v| v.contains(what));
        let kill_only = std::slice::from_ref(&kill);
        // Nobody asks: nothing to judge.
        assert!(!says(&judge(&[], kill_only), "granted again"));
        // Asked for at 7 s and refused until 11 s: stuck, both names.
        let both = [
            refused(3, "n", 1, 7 * S, 11 * S),
            refused(3, "x", 2, 12 * S, 16 * S),
        ]
        .concat();
        let v = judge(&both, kill_only);
        assert!(
            says(&v, "n was not granted again after the kill of worker 1"),
            "{v:?}"
        );
        assert!(says(&v, "x was not granted again"), "{v:?}");
        let late_n = refused(3, "n", 1, 7 * S, 11 * S);
        // Asked for too soon (at 5 s): the store may still keep the dead holder's hold.
        let soon = judge(&refused(3, "n", 1, 5 * S, 9 * S), kill_only);
        assert!(!says(&soon, "granted again"), "{soon:?}");
        // The asker was itself partitioned while it asked.
        let partition = fault(FaultKind::Partition, 3, 8 * S, 9 * S);
        let cut = judge(&late_n, &[kill.clone(), partition]);
        assert!(!says(&cut, "n was not"), "{cut:?}");
        // The asker was partitioned until just before it asked: it may still reconnect.
        let before = fault(FaultKind::Partition, 3, 5 * S, 7 * S - S / 1000);
        let v = judge(&late_n, &[kill.clone(), before]);
        assert!(!says(&v, "n was not"), "{v:?}");
        // Another worker's MultiLock asked for n (and may have held it) meanwhile.
        let set = [
            &late_n[..],
            &[set_ask(4, 9, 8 * S), set_timeout(4, 9, 12 * S)],
        ]
        .concat();
        assert!(!says(&judge(&set, kill_only), "n was not"));
        // Another worker was granted n on the way and found it lost before use.
        let unused = Stamped {
            worker: 4,
            event: WorkerEvent::LostBeforeUse {
                t: 9 * S,
                name: "n".into(),
                token: 2,
                reason: "test".into(),
            },
        };
        let taken_unused = [&late_n[..], &[unused]].concat();
        assert!(!says(&judge(&taken_unused, kill_only), "n was not"));
        // A fault on another worker while it asked for n excuses nothing.
        let orphan = [&late_n[..], &refused(4, "n", 9, 6 * S, 6 * S + S / 2)].concat();
        let cut4 = fault(FaultKind::Kill, 4, 6 * S + S / 4, 6 * S + S / 4);
        assert!(says(&judge(&orphan, &[kill.clone(), cut4]), "n was not"));
        // An earlier hold of another worker still live when the ask began: no evidence.
        let live = [&late_n[..], &[grant(4, 1, S / 2, 0), exit(4, 1, 12 * S)]].concat();
        assert!(!says(&judge(&live, kill_only), "n was not"));
        // Somebody else was granted n while the asker waited.
        let taken = [&late_n[..], &[grant(4, 1, 8 * S, 2), exit(4, 1, 10 * S)]].concat();
        assert!(!says(&judge(&taken, kill_only), "n was not"));
        // Released before the kill: x was not held while the fault lasted.
        let freed = [&both[..], &[released(1, 2, 2 * S - S / 20, true)]].concat();
        let v = judge(&freed, kill_only);
        assert!(!says(&v, "x was"), "{v:?}");
        assert!(says(&v, "n was not granted again"), "{v:?}");
    }

    #[test]
    fn a_run_stuck_after_a_fault_is_a_violation() {
        let h = [grant(1, 1, S, 1), exit(1, 1, 2 * S)];
        let f = fault(FaultKind::Partition, 1, 3 * S, 4 * S);
        let r = run(&h, &[f]);
        assert_violation(&r, "stuck");
    }

    /// A hold granted during the fault and still in its section when the fault heals is
    /// progress: the next grant is due a bound (4 s) after that section ends, not after the
    /// heal. One that comes later than that is still a stall.
    #[test]
    fn a_hold_granted_during_the_fault_moves_the_bound_to_its_end() {
        let f = fault(FaultKind::Partition, 1, 3 * S, 4 * S);
        // Worker 2 is granted just before the heal and holds 3 s; worker 3 is granted 4.5 s
        // after the heal, 1.5 s after that section ended.
        let busy = [
            grant(1, 1, S, 1),
            exit(1, 1, 2 * S),
            grant(2, 1, 4 * S - S / 100, 2),
            exit(2, 1, 7 * S),
            grant(3, 1, 8 * S + S / 2, 3),
            exit(3, 1, 9 * S),
            grant(1, 2, 20 * S, 4),
        ];
        let r = run(&busy, std::slice::from_ref(&f));
        assert!(
            !r.violations.iter().any(|v| v.contains("stuck")),
            "{:?}",
            r.violations
        );
        // The next grant 4.5 s after that section ended: stuck.
        let mut late = busy.to_vec();
        late[4] = grant(3, 1, 11 * S + S / 2, 3);
        late[5] = exit(3, 1, 12 * S);
        let r = run(&late, &[f]);
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
