//! The history model the checks read: every hold rebuilt from its worker's events, with the
//! run's faults, ledger and bounds beside it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::Terms;
use crate::torture::history::{FaultKind, FaultRecord, HoldKind, Stamped, WorkerEvent};
use crate::torture::resource::Ledger;

/// How late a busy machine may send a watchdog's renewal, beyond the drift allowance: the
/// renewal's timer fires in a worker process that shares two cores with the store and the
/// other workers. Generous: a timer is late by a millisecond or two on an idle machine.
const LATE_RENEWAL: Duration = Duration::from_millis(50);

/// How much sooner than the model's bound ([`Run::vouched_after_fault`]) a late renewal the
/// guard saw may let the store give a hold away ([`Run::horizon`]): a busy machine sends a
/// renewal a few tens of milliseconds late; a keeper that renews later than this is a fault
/// of the keeper, which the checker must not excuse.
const LATEST_RENEWAL: Duration = Duration::from_millis(250);

/// One hold, rebuilt from its worker's events.
#[derive(Debug, Clone)]
pub(super) struct Hold {
    pub(super) worker: u32,
    pub(super) name: String,
    pub(super) kind: HoldKind,
    pub(super) token: u64,
    pub(super) grant: u64,
    /// Its worker's event before the grant (the acquisition ran after it).
    pub(super) since: u64,
    /// When its critical section ended (its worker's death, or the run's end, if it never
    /// said).
    pub(super) end: u64,
    /// When its guard reported it lost, and why (the first report).
    pub(super) lost: Option<(u64, String)>,
    /// The latest moment its guard was seen to vouch for it until ([`WorkerEvent::Vouched`]),
    /// if it was seen.
    pub(super) vouched: Option<u64>,
    /// When its release answered (`None`: never; its worker died first, or the run ended):
    /// until then the store may still hold it, after its critical section ended.
    pub(super) released: Option<u64>,
}

/// A run as the checks see it.
pub(super) struct Run<'a> {
    /// Every hold, in grant order.
    pub(super) holds: Vec<Hold>,
    /// Every worker event, as the workers wrote them.
    pub(super) history: &'a [Stamped],
    /// Every fault, as it was applied.
    pub(super) faults: &'a [FaultRecord],
    /// What the shared resource accepted and counted.
    pub(super) ledger: &'a Ledger,
    /// When the attack began.
    pub(super) start: u64,
    /// When the attack ended.
    pub(super) end: u64,
    /// The longest a healed fault may keep every worker from a grant.
    pub(super) liveness_bound: Duration,
    /// What the store and the workers promise.
    pub(super) terms: Terms,
}

impl<'a> Run<'a> {
    /// Rebuilds every hold from its worker's events.
    pub(super) fn rebuild(
        history: &'a [Stamped],
        faults: &'a [FaultRecord],
        ledger: &'a Ledger,
        (start, end): (u64, u64),
        terms: Terms,
    ) -> Self {
        Self {
            holds: holds(history, faults, end, terms.connection_bound),
            history,
            faults,
            ledger,
            start,
            end,
            liveness_bound: terms.span.saturating_add(terms.slack),
            terms,
        }
    }

    /// The faults that hit `worker` and can cost it a hold on this store.
    pub(super) fn costly_faults_on(&self, worker: u32) -> impl Iterator<Item = &'a FaultRecord> {
        let Terms {
            connection_bound,
            durable,
            ..
        } = self.terms;
        self.faults
            .iter()
            .filter(move |f| f.hits(worker) && f.kind.can_cost_a_hold(connection_bound, durable))
    }

    /// The core's default drift allowance for the workers' lease (1 % of it plus 5 ms): how
    /// much earlier than the store's bound a guard stops vouching for its hold, and the slack
    /// every timing rule of the checker grants on top of its bound.
    pub(super) fn allowance(&self) -> Duration {
        (self.terms.lease / 100).saturating_add(Duration::from_millis(5))
    }

    /// The least time, from the start of a fault that stalled a lease holder, before the
    /// store may give its hold away: a watchdog renews every third of the lease, so the last
    /// renewal before the fault was sent at most a third of a lease before it, and the
    /// store's lease, counted from the moment that renewal reached it, had at least two
    /// thirds left. The drift allowance and [`LATE_RENEWAL`] are taken off for a renewal that
    /// its timer sent late. A ZooKeeper or etcd hold lives in a session, pinged or kept alive
    /// at least every third of its timeout: the same bound, counted from the session's span.
    pub(super) fn vouched_after_fault(&self) -> Duration {
        let lease = self.terms.span;
        lease
            .saturating_sub(lease / 3)
            .saturating_sub(self.allowance())
            .saturating_sub(LATE_RENEWAL)
    }

    /// The earliest the store may have given `hold` away when a fault that began at `start`
    /// stalled its holder: [`vouched_after_fault`](Self::vouched_after_fault) after the fault
    /// began, or sooner where the hold's guard was last seen to vouch for less (its renewals
    /// were confirmed later than a timely watchdog's; on a busy machine a timer fires late),
    /// by [`LATEST_RENEWAL`] at most: the moment it vouched for plus the drift allowance is
    /// the store's own bound, since the guard counts the lease from the renewal's send. The
    /// sooner of the two, as the guard of a worker whose clock runs slow vouches beyond the
    /// store's bound, which the checks catch as a late report of the loss.
    pub(super) fn horizon(&self, hold: &Hold, start: u64) -> u64 {
        let model = start.saturating_add(nanos(self.vouched_after_fault()));
        let floor = model.saturating_sub(nanos(LATEST_RENEWAL));
        hold.vouched
            .map(|v| v.saturating_add(nanos(self.allowance())))
            .map_or(model, |seen| seen.clamp(floor, model))
    }

    /// The holds `keep` keeps, grouped by name, each group in grant order.
    pub(super) fn by_name(&self, keep: impl Fn(&Hold) -> bool) -> BTreeMap<&str, Vec<&Hold>> {
        let mut by_name: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
        for h in self.holds.iter().filter(|h| keep(h)) {
            by_name.entry(&h.name).or_default().push(h);
        }
        by_name
    }
}

/// Every hold, rebuilt from its worker's events, in grant order.
fn holds(
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
                        vouched: None,
                        released: None,
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
            WorkerEvent::Vouched { hold, until, .. } => {
                if let Some(h) = open.get_mut(&(w, *hold)) {
                    h.vouched = Some(h.vouched.map_or(*until, |v| v.max(*until)));
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
            WorkerEvent::Release { t, hold, ok } => {
                if let Some(&i) = ended.get(&(w, *hold)) {
                    done[i].released.get_or_insert(*t);
                    if !ok && connection_bound {
                        done[i]
                            .lost
                            .get_or_insert((*t, "its release failed".to_owned()));
                    }
                }
            }
            _ => {}
        }
        let t = s.event.t();
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

/// A duration in the history's nanoseconds (saturating).
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds as milliseconds, for messages.
pub(super) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}
