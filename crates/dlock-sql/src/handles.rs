//! The mutex and its waiting loop: polls with capped exponential backoff and jitter
//! (unique-insert, optimistic) or waits on the row lock (for-update). The core's handle adds
//! re-entry, deadlines and the rest.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{
    Backoff, Deadline, HoldSignal, NewHold, RawLock, RawReadWriteLock, Request, later,
};
use dlock_core::{Error, FencingToken, Lease, LockGuard, LockKind, LockName, Result, async_trait};
use rand::Rng;
use tokio::time::Instant;

use crate::Inner;
use crate::config::Strategy;
use crate::db::Conn;
use crate::error;
use crate::sql::AdvisoryMode;
use crate::strategies::{
    AdvisoryLock, Attempt, Beside, FixedEnd, Pinned, SessionHolds, SqlHold, watch, watch_period,
};
use crate::wake;

/// First pause between two attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(4);
/// Longest pause between two attempts.
const BACKOFF_MAX: Duration = Duration::from_millis(200);
/// Shortest pause of a waiter queued behind others of its process: a release in the process
/// wakes them in turn, and polling sooner would only contend with the holder.
const QUEUED_PAUSE: Duration = Duration::from_millis(50);

/// A mutex on one SQL provider: every attempt is an owner of its own.
#[derive(Debug)]
pub(crate) struct SqlMutex {
    pub(crate) inner: Arc<Inner>,
    /// The session of the latest write hold taken through this handle (read-write locks
    /// only), for a downgrade.
    write: std::sync::Mutex<Option<WriteSession>>,
}

/// An attempt that failed on its connection faster than this is made once more at the
/// deadline (a dead pooled connection fails at once; a database that refuses connections
/// fails only after the pool's wait).
const QUICK_FAILURE: Duration = Duration::from_millis(500);

#[async_trait]
impl RawLock for SqlMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        self.remote(req.name, req.options.lease, req.deadline, Kind::Mutex)
            .await
    }
}

/// What an acquisition takes: a mutex, or one side of a read-write lock (PostgreSQL
/// advisory only: the write side is the mutex's exclusive lock, the read side its shared
/// lock on the same key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Write,
}

impl Kind {
    fn lock_kind(self) -> LockKind {
        match self {
            Self::Mutex => LockKind::Mutex,
            Self::Read => LockKind::Read,
            Self::Write => LockKind::Write,
        }
    }

    fn mode(self) -> AdvisoryMode {
        match self {
            Self::Read => AdvisoryMode::Shared,
            Self::Mutex | Self::Write => AdvisoryMode::Exclusive,
        }
    }
}

/// A read-write lock on one SQL provider (PostgreSQL advisory only): readers share the
/// name's advisory lock, a writer takes it alone. Its write holds are remembered, so that a
/// read asked while one is held (a downgrade) is taken on the write's own session, the only
/// one the server lets in beside it.
#[derive(Debug)]
pub(crate) struct SqlReadWrite {
    mutex: SqlMutex,
}

/// Where a write hold lives, for a downgrade.
#[derive(Debug, Clone)]
pub(crate) struct WriteSession {
    conn: std::sync::Weak<tokio::sync::Mutex<Pinned>>,
    holds: std::sync::Weak<SessionHolds>,
    key: i32,
}

impl SqlReadWrite {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self {
            mutex: SqlMutex::new(inner),
        }
    }

    fn write_session(&self) -> Option<WriteSession> {
        self.mutex
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A downgrade: the read on the write hold's session. `Ok(None)` if that session is
    /// gone (the read is then taken like any other).
    async fn beside(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let Some(w) = self.write_session() else {
            return Ok(None);
        };
        let (Some(conn), Some(holds)) = (w.conn.upgrade(), w.holds.upgrade()) else {
            return Ok(None);
        };
        let inner = &self.mutex.inner;
        let attempt = Attempt {
            inner: Arc::clone(inner),
            name: req.name.clone(),
            owner: inner.next_owner(),
            lease: req.options.lease.ttl(),
        };
        let lease = req.options.lease;
        let signal = HoldSignal::new();
        let fixed: FixedEnd = Arc::new(std::sync::Mutex::new(None));
        let outcome = attempt
            .advisory_beside(
                &conn,
                &holds,
                w.key,
                lease,
                signal.clone(),
                Arc::clone(&fixed),
            )
            .await;
        let (token, sent, id) = match outcome {
            Ok(Beside::Granted { token, sent, id }) => (token, sent, id),
            Ok(Beside::SessionGone) => return Ok(None),
            Ok(Beside::KeyGone) => {
                // The name gets a key again on its next grant, as in a first acquire.
                inner.forget_key(req.name);
                return Err(Error::Backend {
                    backend: inner.backend,
                    message: format!("the advisory key of {:?} vanished", req.name.as_str()),
                    retryable: true,
                    source: None,
                });
            }
            Err(e) => return Err(e),
        };
        let lock = AdvisoryLock {
            key: w.key,
            mode: AdvisoryMode::Shared,
            session: holds,
            id,
        };
        let hold = SqlHold::Advisory(attempt, conn, signal.clone(), fixed, lock);
        Ok(Some(self.mutex.guard(
            hold,
            Kind::Read,
            lease,
            token,
            sent,
            Some(signal),
        )))
    }
}

#[async_trait]
impl RawReadWriteLock for SqlReadWrite {
    async fn read(&self, req: &Request<'_>, downgrade: bool) -> Result<Option<LockGuard>> {
        if downgrade && let Some(guard) = self.beside(req).await? {
            return Ok(Some(guard));
        }
        self.mutex
            .remote(req.name, req.options.lease, req.deadline, Kind::Read)
            .await
    }

    async fn write(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        self.mutex
            .remote(req.name, req.options.lease, req.deadline, Kind::Write)
            .await
    }
}

impl SqlMutex {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self {
            inner,
            write: std::sync::Mutex::new(None),
        }
    }

    async fn remote(
        &self,
        name: &LockName,
        lease: Lease,
        deadline: Deadline,
        kind: Kind,
    ) -> Result<Option<LockGuard>> {
        let mut pause = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
        let mut failures = 0u32;
        let mut reconnected = false;
        // Where releases are announced, a waiter sleeps until one (or its pause) ends. A
        // notification that comes while it tries is kept for its next wait. A waiter
        // registers after its first try fails: an uncontended acquire registers nothing.
        //
        // A newcomer queues behind the waiters of this process: with others already waiting
        // for this name, it waits for a release here (or its queued pause, or its deadline)
        // before its first try. A task that releases and at once acquires again thus does
        // not take the lock back before the waiter its release woke, and does not contend
        // with it (a failed try on SQLite takes the write lock the holder needs to release).
        let mut wakeup = self.inner.queue_behind(name);
        if let Some(waiting) = &wakeup {
            tokio::select! {
                () = tokio::time::sleep_until(deadline.wake_after(QUEUED_PAUSE)) => {}
                () = waiting.released() => {}
            }
        }
        loop {
            let started = Instant::now();
            let attempt = Attempt {
                inner: Arc::clone(&self.inner),
                name: name.clone(),
                owner: self.inner.next_owner(),
                lease: lease.ttl(),
            };
            // The error of an attempt the database did not answer (a connection that broke or
            // could not be had, no answer in time); `None` for one it answered "held". At the
            // deadline the last attempt's is the answer: a database that could not be asked is
            // an error, never a lock held by someone else.
            let unanswered = match self.try_once(attempt, lease, started, deadline, kind).await {
                Ok(Some(guard)) => return Ok(Some(guard)),
                Ok(None) => {
                    failures = 0;
                    None
                }
                // At the deadline, one more try at once if the attempt failed fast on its
                // connection: the connection that broke was closed, and a pooled one that
                // died while idle (closed by the server or a proxy) should not make the
                // answer. (A pool whose idle connections all died can still answer with the
                // error once per dead connection.) An attempt that failed slowly (the wait for
                // a connection) is not made twice.
                Err(e @ Error::Connection { .. }) if deadline.has_passed() => {
                    if reconnected || started.elapsed() >= QUICK_FAILURE {
                        return Err(e);
                    }
                    reconnected = true;
                    continue;
                }
                Err(e) if e.is_retryable() => {
                    failures = failures.saturating_add(1);
                    if worth_a_warning(failures) {
                        // A database that stays down must not look like a lock held for
                        // ever.
                        tracing::warn!(lock = %name, error = %e, failures, "acquire keeps failing; still retrying");
                    } else {
                        tracing::debug!(lock = %name, error = %e, "acquire attempt failed; retrying");
                    }
                    // Contention (a lock wait that ran out, a deadlock victim, a busy SQLite
                    // file) is the database's answer that the lock is held.
                    (!error::answered_busy(&e)).then_some(e)
                }
                Err(e) => return Err(e),
            };
            if deadline.has_passed() {
                return unanswered.map_or(Ok(None), Err);
            }
            if wakeup.is_none() {
                wakeup = self.inner.wakeup(name);
            } else {
                self.inner.still_waiting();
            }
            let mut pause = pause.next_pause();
            if wakeup.as_ref().is_some_and(wake::Waiting::has_company) {
                pause = pause.max(QUEUED_PAUSE);
            }
            let jittered = rand::rng().random_range(pause / 2..=pause);
            let sleep = tokio::time::sleep_until(deadline.wake_after(jittered));
            match &wakeup {
                Some(waiting) => {
                    tokio::select! {
                        () = sleep => {}
                        () = waiting.released() => {}
                    }
                }
                None => sleep.await,
            }
        }
    }

    /// One attempt. While a statement that may grant the lock is in flight, an undo is armed
    /// that deletes (or frees) the hold in the background if this future is dropped: holds
    /// are owner-checked and each attempt has its own owner, so the undo touches nothing else.
    /// For-update needs none: the connection holding the row lock is closed if dropped.
    async fn try_once(
        &self,
        attempt: Attempt,
        lease: Lease,
        started: Instant,
        deadline: Deadline,
        kind: Kind,
    ) -> Result<Option<LockGuard>> {
        let strategy = self.inner.strategy;
        if strategy.pins_connections() {
            let (conn, connection_id, key, token, sent, fixed_at);
            if strategy == Strategy::Advisory {
                // One statement took the lock, the token and the server-side lease.
                let Some(g) = attempt.advisory(deadline, kind.mode()).await? else {
                    return Ok(None);
                };
                fixed_at = (!lease.is_watchdog()).then(|| later(g.sent, lease.ttl()));
                (conn, connection_id, key, token, sent) =
                    (g.conn, g.pid, Some(g.key), g.token, g.sent);
            } else {
                let Some(mut granted) = attempt.for_update(deadline).await? else {
                    return Ok(None);
                };
                // The lease runs from the statement that set it with the grant, or after a
                // wait, from now.
                let leased = match granted.lease_sent {
                    Some(sent) => sent,
                    None => attempt.start_lease(&mut granted.conn).await?,
                };
                // A fixed lease ends at its time on the server too, however long the fence
                // took.
                fixed_at = (!lease.is_watchdog()).then(|| later(leased, lease.ttl()));
                let left = || {
                    fixed_at.map_or(attempt.lease, |end| {
                        end.saturating_duration_since(Instant::now())
                    })
                };
                // If the connection died after the grant (and another holder got the row and
                // a token meanwhile), this fails: no guard carries a token above the real
                // holder's (review M5).
                let fence = attempt.fence_held(&mut granted, left).await?;
                (conn, connection_id, key, token, sent) =
                    (granted.conn, granted.connection_id, None, fence, leased);
            }
            attempt
                .inner
                .remember_holder(&attempt.owner, &attempt.name, connection_id);
            let lease_for_watch = attempt.lease;
            let signal = HoldSignal::new();
            // A fixed lease is enforced by the server too (the watcher keeps the server-side
            // lease at what is left of it), not only by the client.
            let fixed: FixedEnd = Arc::new(std::sync::Mutex::new(fixed_at));
            let holds = Arc::new(SessionHolds::default());
            let id = holds
                .join(signal.clone(), Arc::clone(&fixed), lease_for_watch)
                .ok_or_else(|| Error::Backend {
                    backend: attempt.inner.backend,
                    message: "a new session took no hold".into(),
                    retryable: true,
                    source: None,
                })?;
            // Checked between renewals from a period on; a hold released before then (most
            // are) never starts the watcher.
            let (watched, inner) = (Arc::clone(&holds), Arc::clone(&attempt.inner));
            let conn = conn.watched(watch_period(lease_for_watch), move |me| {
                watch(
                    me,
                    watched,
                    lease_for_watch,
                    inner.hold_timeout().to_owned(),
                )
            });
            let hold = match key {
                Some(key) => {
                    if kind == Kind::Write {
                        *self
                            .write
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) =
                            Some(WriteSession {
                                conn: Arc::downgrade(&conn),
                                holds: Arc::downgrade(&holds),
                                key,
                            });
                    }
                    let lock = AdvisoryLock {
                        key,
                        mode: kind.mode(),
                        session: holds,
                        id,
                    };
                    SqlHold::Advisory(attempt, conn, signal.clone(), fixed, lock)
                }
                None => SqlHold::ForUpdate(attempt, conn, signal.clone(), fixed),
            };
            return Ok(Some(self.guard(
                hold,
                kind,
                lease,
                token,
                sent,
                Some(signal),
            )));
        }
        // The statements that may take the lock, and the undo that frees it if this future
        // is dropped, run on one connection: a dropped statement still runs to its end on the
        // server (or SQLite's worker), and the undo must come after it, never before.
        let conn = Arc::new(tokio::sync::Mutex::new(
            attempt.connection_by(deadline).await?,
        ));
        // The lease runs from the claim, not from the wait for a pooled connection (which may
        // take seconds under load: a lease counted from before it could end on arrival).
        let started = Instant::now().max(started);
        let attempt = Arc::new(attempt);
        let mut undo = Undo(Some((Arc::clone(&attempt), Arc::clone(&conn))));
        let got = {
            let mut c = conn.lock().await;
            match strategy {
                Strategy::UniqueInsert => attempt.unique_insert(&mut c).await,
                _ => attempt.optimistic(&mut c).await,
            }
        };
        let token = match got {
            Ok(Some(token)) => token,
            Ok(None) => {
                undo.0 = None;
                drop(undo);
                done(conn);
                return Ok(None);
            }
            Err(e) => {
                // The statement may have taken the lock: undo now, before the next attempt.
                // Its connection goes back first: on a pool of one, the undo's would
                // otherwise wait for it.
                drop(conn);
                undo.run().await;
                return Err(e);
            }
        };
        undo.0 = None;
        drop(undo);
        done(conn);
        let attempt = Arc::try_unwrap(attempt).map_err(|_| shared_attempt())?;
        let hold = match strategy {
            Strategy::UniqueInsert => SqlHold::UniqueInsert(attempt),
            _ => SqlHold::Optimistic(attempt, token),
        };
        Ok(Some(self.guard(hold, kind, lease, token, started, None)))
    }

    fn guard(
        &self,
        hold: SqlHold,
        kind: Kind,
        lease: Lease,
        token: u64,
        sent: Instant,
        signal: Option<HoldSignal>,
    ) -> LockGuard {
        let new = NewHold::new(
            self.inner.backend,
            kind.lock_kind(),
            hold.name().clone(),
            FencingToken::new(token),
            lease,
            sent,
            Arc::new(hold),
        );
        LockGuard::new(match signal {
            Some(signal) => new.with_signal(signal),
            None => new,
        })
    }
}

/// Whether the `failures`-th retryable failure in a row of one acquisition is logged as a
/// warning: the 5th, then the 10th, 20th, 40th … (fewer as an outage goes on).
fn worth_a_warning(failures: u32) -> bool {
    failures == 5
        || (failures >= 10 && failures.is_multiple_of(10) && (failures / 10).is_power_of_two())
}

fn shared_attempt() -> Error {
    Error::Backend {
        backend: "sql",
        message: "an attempt was still shared when it became a hold".into(),
        retryable: true,
        source: None,
    }
}

/// Hands the connection of an attempt whose statements all succeeded back for the next
/// statement (see [`Conn::done`]); still shared (it cannot be, once the undo is gone), it
/// goes back to sqlx when the last owner drops it.
fn done(conn: Shared) {
    if let Ok(conn) = Arc::try_unwrap(conn) {
        conn.into_inner().done();
    }
}

/// Frees whatever an in-flight attempt may have taken, if dropped while armed, on the
/// connection the attempt's statements ran on (so after them).
struct Undo(Option<(Arc<Attempt>, Shared)>);

/// The connection of one attempt, shared with its undo.
type Shared = Arc<tokio::sync::Mutex<Conn>>;

impl Undo {
    /// Undoes after a failed statement (which has ended), on a fresh connection: the
    /// attempt's own may be the reason it failed.
    async fn run(&mut self) {
        if let Some((a, conn)) = self.0.take() {
            // The attempt's connection is not waited for (it ended its statement), nor kept
            // while the undo waits for one.
            drop(conn);
            let r = match a.inner.strategy {
                Strategy::UniqueInsert => a.unique_release().await,
                Strategy::Optimistic => a.optimistic_release(None).await,
                Strategy::ForUpdate | Strategy::Advisory => Ok(false),
            };
            if let Err(e) = r {
                tracing::warn!(lock = %a.name, error = %e, "undo of a failed acquisition failed; its lease ends it");
            }
        }
    }
}

async fn undo(a: &Attempt, conn: &Shared) {
    let mut c = conn.lock().await;
    let r = match a.inner.strategy {
        Strategy::UniqueInsert => a.unique_release_on(&mut c).await,
        Strategy::Optimistic => a.optimistic_release_on(&mut c, None).await,
        Strategy::ForUpdate | Strategy::Advisory => Ok(false),
    };
    if let Err(e) = r {
        tracing::warn!(lock = %a.name, error = %e, "undo of an interrupted acquisition failed; its lease ends it");
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some((a, conn)) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move { undo(&a, &conn).await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::worth_a_warning;

    #[test]
    fn an_outage_is_warned_about_ever_more_rarely() {
        let warned: Vec<u32> = (1..=200).filter(|n| worth_a_warning(*n)).collect();
        assert_eq!(warned, [5, 10, 20, 40, 80, 160]);
        assert!(worth_a_warning(10 * 1024));
        assert!(!worth_a_warning(u32::MAX));
    }
}
