//! The holds that live in one pinned connection, and the watcher that checks the connection
//! between renewals: the connection is the lease, so its end is every hold's end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::LossReason;
use dlock_core::backend::{HoldSet, HoldSignal, Mutex, Registration};
use tokio::time::Instant;

use super::conn::Pinned;

/// The end of a pinned hold's fixed lease (`None` for a watchdog lease), shared with the
/// session's [`watch`]er, which has the server enforce it; moved by `extend`.
pub(crate) type FixedEnd = Arc<Mutex<Option<Instant>>>;

/// The holds that live in one pinned connection, for its [`watch`]er: one, or (PostgreSQL
/// advisory) a write hold and the reads downgraded beside it on the same session. Their
/// loss signals, so that a session found dead marks every hold in it lost, and their fixed
/// leases' ends, so that the server-side lease covers the one that ends last.
///
/// A session stops taking holds once it is put back, closed, lost or no longer watched: a
/// hold must never join a session nobody watches.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    holds: HoldSet<Member>,
    /// Holds may still join. Cleared without a loss when the session is put back or its
    /// watcher ends; a loss closes `holds` too.
    open: Arc<AtomicBool>,
}

/// What the session keeps of one of its holds.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    fixed: FixedEnd,
    lease: Duration,
}

/// A hold's place in its session; the hold leaves when this is dropped or
/// [`left`](Session::leave).
#[derive(Debug)]
pub(crate) struct Membership(Mutex<Option<Registration<Member>>>);

impl Membership {
    /// Whether the hold is still in its session (not released, not dropped).
    pub(crate) fn is_member(&self) -> bool {
        self.0.lock().is_some()
    }
}

/// What the server-side lease of a pinned connection must cover right now.
#[derive(Clone, Copy)]
enum Need {
    /// A watchdog lease: the keeper renews it; the watcher only checks the connection.
    Ping,
    /// Fixed leases, the last of which ends in this long.
    Until(Duration),
    /// Nothing: every hold ended or was lost.
    Nothing,
}

impl Session {
    /// A session without holds, open for them.
    pub(crate) fn new() -> Self {
        Self {
            holds: HoldSet::new(),
            open: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Adds a hold with `signal`, its fixed lease's end and its lease; `None` once the
    /// session takes no holds.
    pub(crate) fn join(
        &self,
        signal: &HoldSignal,
        fixed: FixedEnd,
        lease: Duration,
    ) -> Option<Membership> {
        if self.is_closed() {
            return None;
        }
        let registration = self.holds.register(signal, Member { fixed, lease });
        // Lost at once: the session was lost between the look above and the registration.
        if signal.is_lost() {
            return None;
        }
        Some(Membership(Mutex::new(Some(registration))))
    }

    /// Takes a hold out (released or dropped): how many holds are left, `None` if it had left
    /// already.
    pub(crate) fn leave(&self, membership: &Membership) -> Option<usize> {
        let registration = membership.0.lock().take()?;
        drop(registration);
        Some(self.holds.len())
    }

    /// No hold may join any more (the session was put back, closed or is not watched).
    pub(crate) fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
    }

    /// Whether no hold may join.
    pub(crate) fn is_closed(&self) -> bool {
        !self.open.load(Ordering::SeqCst) || self.holds.is_closed()
    }

    /// Marks every hold of the session suspended (its connection is slow to answer: the
    /// holds cannot be vouched for until it does) or vouched for again.
    fn suspend(&self, suspended: bool) {
        self.holds.suspend_all(suspended);
    }

    /// Marks every hold of the session lost (its connection is gone, and with it every lock
    /// its session held) and closes it.
    pub(crate) fn lose(&self, reason: LossReason) {
        self.close();
        self.holds.close(reason);
    }

    /// What the server-side lease must cover; a session that needs nothing any more (every
    /// hold ended or was lost, or the fixed leases ended) takes no new hold. Read under the
    /// connection's lock, which a joining hold holds too.
    fn need(&self) -> Need {
        let mut last: Option<Instant> = None;
        let mut any = false;
        let mut need = None;
        for (signal, member) in self.holds.snapshot() {
            if signal.is_lost() {
                continue;
            }
            any = true;
            match *member.fixed.lock() {
                None => {
                    need = Some(Need::Ping);
                    break;
                }
                Some(end) => last = Some(last.map_or(end, |l| l.max(end))),
            }
        }
        let need = need.unwrap_or(match last {
            Some(end) => Need::Until(end.saturating_duration_since(Instant::now())),
            None if any => Need::Ping,
            None => Need::Nothing,
        });
        if matches!(need, Need::Nothing) || matches!(need, Need::Until(left) if left.is_zero()) {
            // The watcher ends: no hold may join a session nobody watches.
            self.close();
        }
        need
    }

    /// The server-side lease to set when the hold whose fixed end is `own` extends its own
    /// to `ttl`: at least what the other holds of the session still need (their fixed
    /// lease's rest, or their whole lease if a watchdog renews it).
    pub(crate) fn server_lease(&self, own: &FixedEnd, ttl: Duration) -> Duration {
        let now = Instant::now();
        self.holds
            .snapshot()
            .into_iter()
            .filter(|(signal, m)| !Arc::ptr_eq(&m.fixed, own) && !signal.is_lost())
            .map(|(_, m)| {
                let end = *m.fixed.lock();
                end.map_or(m.lease, |end| end.saturating_duration_since(now))
            })
            .fold(ttl, Duration::max)
    }
}

/// How often a pinned hold's connection is checked between renewals: a tenth of the lease,
/// from 100 ms to 1 s.
pub(crate) fn watch_period(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// How long a ping of a holding connection may take: the lease (at least 100 ms). A
/// connection slower than that is treated as gone, and closed.
///
/// Not shorter: closing the connection ends the hold on the server, so a ping cut off early
/// turns a slow but live connection (a loaded machine, a slow network) into a lost lock. A
/// check slower than [`suspend_after`] suspends the holds meanwhile (`is_held()` is false),
/// so nothing is vouched for by a connection that does not answer (the server may have ended
/// the session behind a network that no longer carries the reset).
pub(crate) fn ping_limit(lease: Duration) -> Duration {
    lease.max(Duration::from_millis(100))
}

/// After how long an unanswered check suspends the holds of its connection: a third of the
/// lease (a renewal period), at least 100 ms.
fn suspend_after(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(100))
}

/// Watches a pinned connection (a for-update hold's, an advisory session's) between
/// renewals. The holds are that connection's locks: a reset or a network fault ends them on
/// the server at once, and the server grants them to the next waiter, so the holders must
/// not wait for their next renewal (a third of their lease) to learn of it. Pings every
/// `period`; a connection that does not answer is closed and every hold in it marked lost
/// ([`LossReason::ConnectionLost`]). Ends when the holds are released, lost or dropped. A
/// ping resets the server's idle count like a renewal does, and stops with the process like
/// one, so a paused or cut-off holder still runs out of its server-side lease.
///
/// Under fixed leases the check sets the server-side lease (with `renew`, the strategy's
/// statement) to what is left of the one that ends last instead of pinging, so a holder
/// paused just before its end loses the lock at that end (rounded up to the server's whole
/// seconds), not a whole lease after its last ping.
pub(crate) async fn watch(
    conn: Weak<tokio::sync::Mutex<Pinned>>,
    session: Session,
    lease: Duration,
    renew: Arc<str>,
) {
    watch_until_over(conn, &session, lease, &renew).await;
    // An unwatched session takes no new hold (a downgrade then takes its read elsewhere).
    session.close();
}

async fn watch_until_over(
    conn: Weak<tokio::sync::Mutex<Pinned>>,
    session: &Session,
    lease: Duration,
    renew: &str,
) {
    let period = watch_period(lease);
    let mut first = true;
    loop {
        // The first check is [`Pinned::watched`]'s start, a period after the grant.
        if !std::mem::take(&mut first) {
            tokio::time::sleep(period).await;
        }
        let Some(conn) = conn.upgrade() else {
            return;
        };
        let check = async {
            // The ends are read under the connection's lock, which `extend` holds until it
            // has moved its end: an end read before an extension must not be sent after it.
            let mut c = conn.lock().await;
            let need = session.need();
            let alive = match need {
                Need::Nothing => None,
                Need::Ping => c.ping(ping_limit(lease)).await,
                // Over: the guards report it and the keepers release; the server-side lease
                // set last ends it at most a second later if nobody can.
                Need::Until(left) if left.is_zero() => None,
                Need::Until(left) => c.renew_within(renew, left, ping_limit(lease)).await,
            };
            (alive, need, c.was_closed())
        };
        tokio::pin!(check);
        // A check not answered within a renewal period, counting the wait for the connection
        // (a renewal or a release on a dead network holds it), suspends the holds (they
        // cannot be vouched for meanwhile) until it answers; one not answered within the
        // lease ends them.
        let suspend = tokio::time::sleep(suspend_after(lease));
        let (alive, need, closed) = tokio::select! {
            biased;
            done = &mut check => done,
            () = suspend => {
                session.suspend(true);
                let done = check.await;
                if done.0 == Some(true) {
                    session.suspend(false);
                }
                done
            }
        };
        match (alive, need) {
            (Some(true), _) => {}
            (_, Need::Nothing) => return,
            (_, Need::Until(left)) if left.is_zero() => return,
            // The check failed: every hold in the connection is lost.
            (Some(false), _) => {
                session.lose(LossReason::ConnectionLost);
                return;
            }
            // The connection is gone: given back clean (the holds were released), or closed
            // (a give-back or a release that failed), which ends every hold still in it.
            (None, _) => {
                if closed {
                    session.lose(LossReason::ConnectionLost);
                }
                return;
            }
        }
    }
}
