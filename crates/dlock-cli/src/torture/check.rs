//! The checker: reads the whole history of a run (every worker's grants, losses, writes and
//! releases, every injected fault, every write the resource accepted) and says whether the
//! contract held.
//!
//! - Fenced writes: the resource accepted them in strictly increasing token order per name, and
//!   its counter equals the number it accepted (no lost update).
//! - Tokens: no token was issued twice for a name, and they rose in grant order.
//! - Overlaps: two holders inside a critical section of one name at once (or more than the
//!   semaphore's permits) is a violation unless a fault that can cost a hold (a pause, a kill, a
//!   partition, a one-way cut, delayed replies) hit the older holder first, and that holder was
//!   told (its guard reported the loss); how long after the overlap began it was told is kept.
//! - Liveness: after every fault healed, some worker acquired within the lease plus a slack.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use super::history::{FaultKind, FaultRecord, HoldKind, Stamped, WorkerEvent};
use super::resource::Ledger;
use super::worker::PERMITS;

/// One hold, rebuilt from its worker's events.
#[derive(Debug, Clone)]
struct Hold {
    worker: u32,
    name: String,
    kind: HoldKind,
    token: u64,
    grant: u64,
    /// Its worker's event before the grant (the acquisition ran after it).
    since: u64,
    /// When its critical section ended (its worker's death, or the run's end, if it never
    /// said).
    end: u64,
    lost: Option<(u64, String)>,
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
    /// The longest time from a fault's healing to the next grant (ms).
    pub(crate) worst_recovery_ms: Option<u64>,
    /// Every violation, in words.
    pub(crate) violations: Vec<String>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Checks a run. `start`/`end` bound it; `lease` and `slack` set the liveness bound.
pub(crate) fn check(
    history: &[Stamped],
    faults: &[FaultRecord],
    ledger: &Ledger,
    (start, end): (u64, u64),
    lease: Duration,
    slack: Duration,
    connection_bound: bool,
) -> Report {
    let mut report = Report::default();
    for f in faults {
        *report.faults.entry(f.kind.to_string()).or_default() += 1;
    }
    let holds = rebuild(history, faults, end, connection_bound);
    report.lost_before_use = history
        .iter()
        .filter(|s| matches!(s.event, WorkerEvent::LostBeforeUse { .. }))
        .count() as u64;
    report.holds = holds.len() as u64;
    for (_, reason) in holds.iter().filter_map(|h| h.lost.as_ref()) {
        report.losses_reported += 1;
        *report.losses_by_reason.entry(reason.clone()).or_default() += 1;
    }
    check_tokens(&holds, faults, connection_bound, &mut report);
    check_overlaps(&holds, faults, connection_bound, &mut report);
    check_fencing(ledger, &mut report);
    check_liveness(
        &holds,
        history,
        faults,
        (start, end),
        lease + slack,
        &mut report,
    );
    report
}

/// Rebuilds every hold from its worker's events.
fn rebuild(
    history: &[Stamped],
    faults: &[FaultRecord],
    end: u64,
    connection_bound: bool,
) -> Vec<Hold> {
    let killed: HashMap<u32, u64> = faults
        .iter()
        .filter(|f| f.kind == FaultKind::Kill)
        .map(|f| (f.worker, f.start))
        .collect();
    let mut last_seen: HashMap<u32, u64> = HashMap::new();
    let mut open: HashMap<(u32, u64), Hold> = HashMap::new();
    let mut done = Vec::new();
    let mut ended: HashMap<(u32, u64), usize> = HashMap::new();
    for s in history {
        let w = s.worker;
        match &s.event {
            WorkerEvent::Grant {
                t,
                hold,
                name,
                kind,
                token,
            } => {
                open.insert(
                    (w, *hold),
                    Hold {
                        worker: w,
                        name: name.clone(),
                        kind: *kind,
                        token: *token,
                        grant: *t,
                        since: last_seen.get(&w).copied().unwrap_or(0),
                        end: *t,
                        lost: None,
                    },
                );
            }
            WorkerEvent::Lost {
                t, hold, reason, ..
            } => {
                if let Some(h) = open.get_mut(&(w, *hold)) {
                    h.lost.get_or_insert((*t, reason.clone()));
                }
            }
            WorkerEvent::Exit { t, hold } => {
                if let Some(mut h) = open.remove(&(w, *hold)) {
                    h.end = *t;
                    ended.insert((w, *hold), done.len());
                    done.push(h);
                }
            }
            // On a connection-bound store, a release that fails (`LockLost`) tells the holder,
            // after its critical section, that someone else may have had the lock: a hold
            // whose connection was reset moments before its release cannot be told sooner
            // than its connection check. Elsewhere the loss must come through `lost()`.
            WorkerEvent::Release { t, hold, ok: false } if connection_bound => {
                if let Some(&i) = ended.get(&(w, *hold)) {
                    done[i]
                        .lost
                        .get_or_insert((*t, "its release failed".to_owned()));
                }
            }
            _ => {}
        }
        let t = event_time(&s.event);
        let seen = last_seen.entry(w).or_default();
        *seen = (*seen).max(t);
    }
    // Holds that never ended: their worker was killed (the hold lasts until its death) or
    // the run ended first.
    for ((w, _), mut h) in open {
        h.end = killed.get(&w).copied().unwrap_or(end);
        done.push(h);
    }
    done.sort_by_key(|h| (h.grant, h.worker));
    done
}

fn event_time(e: &WorkerEvent) -> u64 {
    match e {
        WorkerEvent::Start { t, .. }
        | WorkerEvent::Grant { t, .. }
        | WorkerEvent::Fenced { t, .. }
        | WorkerEvent::Lost { t, .. }
        | WorkerEvent::Exit { t, .. }
        | WorkerEvent::Release { t, .. }
        | WorkerEvent::LostBeforeUse { t, .. }
        | WorkerEvent::Error { t, .. }
        | WorkerEvent::Stop { t } => *t,
    }
}

/// Tokens of exclusive holds: never issued twice for a name, rising in grant order.
///
/// A grant is stamped when `acquire` has returned and the worker found the hold still held,
/// so a hold whose lease ended on the way is not stamped at all (`LostBeforeUse`). A worker
/// can still be stamped late with a hold its guard calls held: a connection-bound hold
/// whose connection a fault reset while the worker was stopped is only found gone by its
/// next check, and a later holder (with a higher token) may have been stamped first. Such a
/// pair is no violation when a fault that can cost a hold hit the late worker inside that
/// window (after its previous event, before the higher token's stamp) and its guard reported
/// the hold lost; anything else is.
fn check_tokens(
    holds: &[Hold],
    faults: &[FaultRecord],
    connection_bound: bool,
    report: &mut Report,
) {
    let mut by_name: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for h in holds.iter().filter(|h| h.kind.exclusive()) {
        by_name.entry(&h.name).or_default().push(h);
    }
    for (name, hs) in by_name {
        let mut seen: HashMap<u64, u32> = HashMap::new();
        // The hold with the highest token so far.
        let mut top: Option<&Hold> = None;
        for &h in &hs {
            match top {
                Some(t) if h.token <= t.token => {
                    if stamped_late(h, t, faults, connection_bound) {
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
fn stamped_late(
    late: &Hold,
    higher: &Hold,
    faults: &[FaultRecord],
    connection_bound: bool,
) -> bool {
    late.lost.is_some()
        && faults.iter().any(|f| {
            f.hits(late.worker)
                && f.kind.can_cost_a_hold(connection_bound)
                && f.start >= late.since
                && f.start < higher.grant
                && f.end <= late.grant
        })
}

/// Whether `a` and `b` (same name) may not hold at once.
fn conflict(a: HoldKind, b: HoldKind) -> bool {
    match (a, b) {
        (HoldKind::Permit, _) | (_, HoldKind::Permit) => false,
        (HoldKind::Read, HoldKind::Read) => false,
        _ => a.exclusive() || b.exclusive(),
    }
}

/// A fault that hit `worker` and can cost it its hold, begun before `before` and not healed
/// before the hold began.
fn explaining_fault<'a>(
    faults: &'a [FaultRecord],
    hold: &Hold,
    before: u64,
    connection_bound: bool,
) -> Option<&'a FaultRecord> {
    faults.iter().find(|f| {
        f.hits(hold.worker)
            && f.kind.can_cost_a_hold(connection_bound)
            && f.start < before
            && f.end >= hold.grant
    })
}

fn check_overlaps(
    holds: &[Hold],
    faults: &[FaultRecord],
    connection_bound: bool,
    report: &mut Report,
) {
    let mut judged: std::collections::HashSet<(u32, u64, String)> = Default::default();
    let mut by_name: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for h in holds {
        by_name.entry(&h.name).or_default().push(h);
    }
    for (name, hs) in by_name {
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
                    let (explained, innocent): (Vec<&Hold>, Vec<&Hold>) =
                        permits.iter().partition(|o| {
                            explaining_fault(faults, o, newer.grant, connection_bound).is_some()
                        });
                    over.extend(explained.iter().take(excess));
                    if explained.len() < excess
                        && let Some(blamed) = innocent.first()
                    {
                        judge(name, blamed, newer, faults, connection_bound, report);
                    }
                }
            }
            for older in over {
                // One verdict per overlapped hold (the first holder that overlapped it).
                if judged.insert((older.worker, older.grant, name.to_owned())) {
                    judge(name, older, newer, faults, connection_bound, report);
                }
            }
        }
    }
}

/// An overlap of `older` by `newer`: explained (a fault hit the older holder first, and it was
/// told) or a violation.
fn judge(
    name: &str,
    older: &Hold,
    newer: &Hold,
    faults: &[FaultRecord],
    connection_bound: bool,
    report: &mut Report,
) {
    let Some(fault) = explaining_fault(faults, older, newer.grant, connection_bound) else {
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

/// The resource's ledger: accepted tokens rise per name; its counter equals its accepted
/// writes (no lost fenced update). Also counts the unfenced counter's lost updates.
fn check_fencing(ledger: &Ledger, report: &mut Report) {
    report.fenced_accepted = ledger.accepted.len() as u64;
    report.fenced_refused = ledger.refused;
    let mut last: HashMap<&str, u64> = HashMap::new();
    let mut count: HashMap<&str, u64> = HashMap::new();
    for a in &ledger.accepted {
        let prev = last.insert(&a.name, a.token);
        if prev.is_some_and(|p| a.token <= p) {
            report.fenced_violations += 1;
            report.violations.push(format!(
                "the resource accepted token {} on {} after {:?}",
                a.token, a.name, prev
            ));
        }
        *count.entry(&a.name).or_default() += 1;
    }
    for (name, n) in count {
        let value = ledger.fenced.get(name).copied().unwrap_or(0);
        if value != n {
            report.fenced_violations += 1;
            report.violations.push(format!(
                "lost fenced update on {name}: {n} writes accepted, counter at {value}"
            ));
        }
    }
    report.unfenced_lost_updates = ledger
        .unfenced
        .values()
        .map(|(value, writes)| writes.saturating_sub(*value))
        .sum();
}

fn check_liveness(
    holds: &[Hold],
    history: &[Stamped],
    faults: &[FaultRecord],
    (start, end): (u64, u64),
    bound: Duration,
    report: &mut Report,
) {
    let bound_ns = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    let mut grants: Vec<u64> = holds.iter().map(|h| h.grant).collect();
    grants.sort_unstable();
    if grants.is_empty() && end > start.saturating_add(bound_ns) {
        report
            .violations
            .push("no worker ever acquired anything".into());
        return;
    }
    for f in faults {
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
                        stall(holds, history, f, g)
                    ));
                }
            }
            None => report.violations.push(format!(
                "stuck: no grant after the {} of {} healed at {:.1} ms; {}",
                f.kind,
                f.whom(),
                ms(healed),
                stall(holds, history, f, end)
            )),
        }
    }
}

/// Where the time of a stall went, for its violation: the holds open while the fault lasted
/// (times from its heal: when they were granted, when their critical section ended, which for
/// a killed worker is its death) and what each
/// worker said between the heal and the next grant. A run in CI leaves nothing but its
/// output behind, so the message carries what a reader needs to tell a slow store from a
/// stuck one.
fn stall(holds: &[Hold], history: &[Stamped], fault: &FaultRecord, until: u64) -> String {
    let healed = fault.end;
    let rel = |t: u64| {
        let signed = i128::from(t) - i128::from(healed);
        format!("{:+.0} ms", signed as f64 / 1e6)
    };
    let open: Vec<String> = holds
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
    for s in history {
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
    use super::*;

    fn grant(worker: u32, hold: u64, t: u64, token: u64) -> Stamped {
        Stamped {
            worker,
            event: WorkerEvent::Grant {
                t,
                hold,
                name: "n".into(),
                kind: HoldKind::Mutex,
                token,
            },
        }
    }

    fn permit(worker: u32, hold: u64, t: u64, token: u64) -> Stamped {
        let mut g = grant(worker, hold, t, token);
        if let WorkerEvent::Grant { kind, .. } = &mut g.event {
            *kind = HoldKind::Permit;
        }
        g
    }

    fn exit(worker: u32, hold: u64, t: u64) -> Stamped {
        Stamped {
            worker,
            event: WorkerEvent::Exit { t, hold },
        }
    }

    fn released(worker: u32, hold: u64, t: u64, ok: bool) -> Stamped {
        Stamped {
            worker,
            event: WorkerEvent::Release { t, hold, ok },
        }
    }

    fn lost(worker: u32, hold: u64, t: u64) -> Stamped {
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

    const S: u64 = 1_000_000_000;

    fn run(history: &[Stamped], faults: &[FaultRecord]) -> Report {
        run_on(history, faults, false)
    }

    fn run_on(history: &[Stamped], faults: &[FaultRecord], connection_bound: bool) -> Report {
        check(
            history,
            faults,
            &Ledger::default(),
            (0, 100 * S),
            Duration::from_secs(2),
            Duration::from_secs(2),
            connection_bound,
        )
    }

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

    /// A connection reset explains an overlap (of a holder that was told) only where a hold
    /// lives in its connection (for-update); elsewhere the hold outlives a reset, and an
    /// overlap after one is a violation.
    #[test]
    fn a_reset_explains_an_overlap_only_on_connection_bound_stores() {
        let reset = FaultRecord {
            kind: FaultKind::Reset,
            worker: 1,
            start: S + S / 2,
            end: S + S / 2,
        };
        let h = [
            grant(1, 1, S, 1),
            grant(2, 1, 2 * S, 2),
            lost(1, 1, 2 * S + S / 10),
            exit(1, 1, 3 * S),
            exit(2, 1, 4 * S),
        ];
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
        let reset = FaultRecord {
            kind: FaultKind::Reset,
            worker: 1,
            start: S + S / 2,
            end: S + S / 2,
        };
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
        let pause = FaultRecord {
            kind: FaultKind::Pause,
            ..reset
        };
        let r = run_on(&history(false), &[pause], false);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
        assert!(r.violations[0].contains("never told"), "{:?}", r.violations);
    }

    /// A restart of the store hits every worker: it explains an overlap of any holder that
    /// was told, and its liveness message names every worker, not a number.
    #[test]
    fn a_restart_explains_an_overlap_of_any_holder() {
        let restart = FaultRecord {
            kind: FaultKind::Restart,
            worker: super::super::history::EVERY_WORKER,
            start: S + S / 2,
            end: S + S / 2,
        };
        let h = [
            grant(1, 1, S, 1),
            grant(2, 1, 2 * S, 2),
            lost(1, 1, 2 * S + S / 10),
            exit(1, 1, 3 * S),
            exit(2, 1, 4 * S),
        ];
        let r = run(&h, std::slice::from_ref(&restart));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.overlaps_explained, 1);
        assert_eq!(restart.whom(), "every worker");
        let r = run(&h, &[]);
        assert_eq!(r.overlaps_unexplained, 1, "{:?}", r.violations);
    }

    /// A third permit of two is explained by the one holder a fault hit (and who was told),
    /// not blamed on a holder whose permit was never in doubt. (Found by a torture run with
    /// restarts: the checker judged the oldest permit holder, which no fault had touched.)
    #[test]
    fn an_over_granted_permit_is_judged_on_the_stale_holder() {
        let pause = FaultRecord {
            kind: FaultKind::Pause,
            worker: 2,
            start: 2 * S + S / 2,
            end: 3 * S + S / 2,
        };
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
        let pause = FaultRecord {
            kind: FaultKind::Pause,
            worker: 1,
            start: S + S / 2,
            end: 6 * S,
        };
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
        assert!(
            r.violations.iter().any(|v| v.contains("token 4")),
            "{:?}",
            r.violations
        );
    }

    #[test]
    fn clean_handoffs_pass() {
        let h = [
            grant(1, 1, S, 1),
            exit(1, 1, 2 * S),
            grant(2, 1, 3 * S, 2),
            exit(2, 1, 4 * S),
        ];
        let r = run(&h, &[]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.holds, 2);
    }

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
        let pause = FaultRecord {
            kind: FaultKind::Pause,
            worker: 1,
            start: S + S / 2,
            end: 5 * S,
        };
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

    #[test]
    fn repeated_and_backward_tokens_are_violations() {
        let h = [
            grant(1, 1, S, 5),
            exit(1, 1, 2 * S),
            grant(2, 1, 3 * S, 5),
            exit(2, 1, 4 * S),
        ];
        let r = run(&h, &[]);
        assert!(
            r.violations.iter().any(|v| v.contains("issued twice")),
            "{:?}",
            r.violations
        );
        assert!(r.fenced_violations >= 1);
    }

    /// A worker paused between its acquisition and its Grant line is stamped after a later
    /// holder with a higher token (the stress run of round 2, SQLite, pause faults). That is no
    /// violation when the pause hit it in that window and it was told the hold was lost; the
    /// same history without the pause, or with the late holder never told, is one.
    #[test]
    fn a_grant_stamped_late_after_a_pause_is_explained_only_if_told() {
        let pause = FaultRecord {
            kind: FaultKind::Pause,
            worker: 1,
            start: S + S / 2,
            end: 3 * S,
        };
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
        assert!(
            r.violations.iter().any(|v| v.contains("went backwards")),
            "{:?}",
            r.violations
        );

        let untold: Vec<Stamped> = h
            .iter()
            .filter(|s| !matches!(s.event, WorkerEvent::Lost { .. }))
            .cloned()
            .collect();
        let r = run(&untold, std::slice::from_ref(&pause));
        assert!(
            r.violations.iter().any(|v| v.contains("went backwards")),
            "{:?}",
            r.violations
        );

        // A pause before the worker's previous event is not in the acquisition's window.
        let early = FaultRecord {
            start: S / 2,
            end: S / 2 + S / 10,
            ..pause
        };
        let r = run(&h, &[early]);
        assert!(
            r.violations.iter().any(|v| v.contains("went backwards")),
            "{:?}",
            r.violations
        );
    }

    #[test]
    fn a_run_stuck_after_a_fault_is_a_violation() {
        let h = [grant(1, 1, S, 1), exit(1, 1, 2 * S)];
        let f = FaultRecord {
            kind: FaultKind::Partition,
            worker: 1,
            start: 3 * S,
            end: 4 * S,
        };
        let r = run(&h, &[f]);
        assert!(
            r.violations.iter().any(|v| v.contains("stuck")),
            "{:?}",
            r.violations
        );
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

    #[test]
    fn a_stall_says_what_was_held_and_what_the_workers_said() {
        // Worker 1 holds n from S and is killed at 2S (its hold lasts till its death); worker
        // 2 keeps failing; the next grant comes at 7S, past the bound (4 s).
        let h = [
            grant(1, 1, S, 1),
            Stamped {
                worker: 2,
                event: WorkerEvent::Error {
                    t: 3 * S,
                    what: "pool timed out".into(),
                },
            },
            Stamped {
                worker: 2,
                event: WorkerEvent::Error {
                    t: 4 * S,
                    what: "pool timed out".into(),
                },
            },
            grant(2, 1, 7 * S, 2),
        ];
        let f = FaultRecord {
            kind: FaultKind::Kill,
            worker: 1,
            start: 2 * S,
            end: 2 * S + S / 100,
        };
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

    #[test]
    fn lost_fenced_updates_are_violations() {
        let mut ledger = Ledger::default();
        for token in [1, 2] {
            ledger.accepted.push(super::super::history::Accepted {
                t: token,
                name: "n".into(),
                token,
                value: 1,
            });
        }
        ledger.fenced.insert("n".into(), 1);
        let r = check(
            &[],
            &[],
            &ledger,
            (0, 0),
            Duration::ZERO,
            Duration::ZERO,
            false,
        );
        assert!(
            r.violations
                .iter()
                .any(|v| v.contains("lost fenced update")),
            "{:?}",
            r.violations
        );
    }
}
