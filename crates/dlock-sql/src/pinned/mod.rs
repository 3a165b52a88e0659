//! The connection is the lease: what the for-update and advisory strategies share. Each held
//! or waiting lock pins a connection of the lock pool; the lock lives in that connection's
//! session (a row lock's transaction, an advisory lock), which the server ends (and with it
//! the lock) when the connection closes or sits idle past the hold's server-side lease.
//!
//! - [`conn`]: the pinned connection, closed rather than given back unless it is clean;
//! - [`session`]: the holds that live in one connection, and the watcher that checks it
//!   between renewals;
//! - [`hold`]: the part of a hold that the connection makes (release aside): its check, its
//!   renewal, its fixed lease enforced by the server.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Backoff, Deadline, HoldSignal, Mutex, UndoFn, UndoOnDrop, from_now};
use dlock_core::{Error, Lease, LockName, Result};
use tokio::time::Instant;

use crate::Inner;
use crate::attempt::CONNECT_GRACE;
use crate::config::Dialect;
use crate::db::{Conn, query};
use crate::error::from_sqlx;
use crate::sql::{KILL_WAIT, SessionSql};

pub(crate) mod conn;
pub(crate) mod hold;
pub(crate) mod session;

pub(crate) use conn::{ClosedUnlessReturned, HoldingConnection, Pinned, Pinners};
pub(crate) use hold::{Held, PinnedHold, Release};
pub(crate) use session::{FixedEnd, Session};

use crate::attempt::Attempt;
use session::Membership;

/// What a pinned strategy keeps for its connections and holds, whatever its lock: its
/// provider's database, the statements of a session, the one that sets a hold's server-side
/// lease, and its live holds.
#[derive(Debug)]
pub(crate) struct Pinning {
    /// The provider's database.
    pub(crate) inner: Arc<Inner>,
    session: SessionSql,
    /// The statement that sets a hold's server-side lease (`?`: seconds).
    renew: Arc<str>,
    holders: Arc<Holders>,
    /// The tasks with connections of the lock pool pinned.
    pinners: Arc<Pinners>,
}

impl Pinning {
    /// The pinning of a strategy of `inner` whose holds' server-side lease `renew` sets.
    pub(crate) fn new(inner: Arc<Inner>, renew: &str) -> Self {
        Self {
            session: SessionSql::new(inner.dialect),
            renew: Arc::from(renew),
            holders: Arc::default(),
            pinners: Arc::default(),
            inner,
        }
    }

    /// A connection of the lock pool for one held or waiting lock of `name`, waiting for one
    /// until `deadline` (with a grace to open one, so that even a zero wait makes its
    /// attempt).
    ///
    /// A pool that stays exhausted is an error that says so, not a lock held by someone:
    /// every held or waiting lock of a pinned strategy pins a connection.
    pub(crate) async fn pin(&self, name: &LockName, deadline: Deadline) -> Result<Pinned> {
        pin(&self.inner, &self.pinners, name, deadline).await
    }

    /// The session id of a pinned connection on the server.
    pub(crate) async fn session_id(&self, conn: &mut Pinned) -> Result<u64> {
        let err = self.inner.err("connection id");
        let row = query(&self.session.connection_id)
            .fetch_one(conn.get()?)
            .await
            .map_err(err)?;
        Ok(u64::try_from(row.int(0).map_err(err)?).unwrap_or(0))
    }

    /// Kills the connection it is armed with (from another connection, in the background)
    /// if dropped while armed: a statement waiting for a lock whose future was dropped would
    /// otherwise stay queued on the server until its lock wait timeout, and could even be
    /// granted the lock after its client left. The whole connection, not its statement (see
    /// [`SessionSql::kill_connection`]); the dropped acquisition closes that connection
    /// anyway. Best effort: without a tokio runtime nothing is sent, and a kill that fails is
    /// logged at debug level (the lock wait timeout then ends the statement).
    fn killer(&self) -> UndoOnDrop<u64, KillSession> {
        UndoOnDrop::new(KillSession {
            inner: Arc::clone(&self.inner),
            sql: self.session.clone(),
        })
    }

    /// Starts a hold's server-side lease of `ttl` on its pinned connection after a wait, and
    /// returns when the statement was sent: the client's lease runs from there, before the
    /// server starts counting idle time. Called right after the grant (the wait had set a
    /// lease too, so the lock is never without one).
    pub(crate) async fn start_lease(&self, conn: &mut Pinned, ttl: Duration) -> Result<Instant> {
        let sent = Instant::now();
        self.set_lease(conn, ttl, "set the hold's server-side lease")
            .await?;
        Ok(sent)
    }

    /// Sets a hold's server-side lease to `ttl` on its connection (which proves it alive); a
    /// failure is an error about `what`.
    pub(crate) async fn set_lease(
        &self,
        conn: &mut Pinned,
        ttl: Duration,
        what: &'static str,
    ) -> Result<()> {
        conn.renew(&self.renew, ttl)
            .await
            .map_err(self.inner.err(what))
    }

    /// The first hold of a session just granted on `conn` (server connection
    /// `connection_id`) for `attempt`, ending at `fixed_at` for a fixed lease: it is
    /// remembered among the strategy's holders and its connection is watched from a period on
    /// (a hold released before then, as most are, never starts the watcher).
    pub(crate) fn first_hold(
        &self,
        conn: Pinned,
        attempt: Attempt,
        connection_id: u64,
        fixed_at: Option<Instant>,
    ) -> Result<PinnedHold> {
        self.holders
            .remember(&attempt.owner, &attempt.name, connection_id);
        let ttl = attempt.ttl();
        let signal = HoldSignal::new();
        // A fixed lease is enforced by the server too (the watcher keeps the server-side
        // lease at what is left of it), not only by the client.
        let fixed: FixedEnd = Arc::new(Mutex::new(fixed_at));
        let session = Session::new();
        let membership = session
            .join(&signal, Arc::clone(&fixed), ttl)
            .ok_or_else(|| {
                Error::backend_failed(self.inner.backend, "a new session took no hold", true)
            })?;
        let (watched, statement) = (session.clone(), Arc::clone(&self.renew));
        let conn = conn.watched(session::watch_period(ttl), move |me| {
            session::watch(me, watched, ttl, statement)
        });
        Ok(self.hold_in(attempt, conn, signal, fixed, session, Arc::new(membership)))
    }

    /// A hold of `attempt` in `session` on `conn`, already in it: the first, or a further
    /// one of a session that holds others (a read downgraded beside its write).
    pub(crate) fn hold_in(
        &self,
        attempt: Attempt,
        conn: HoldingConnection,
        signal: HoldSignal,
        fixed: FixedEnd,
        session: Session,
        membership: Arc<Membership>,
    ) -> PinnedHold {
        let ttl = attempt.ttl();
        PinnedHold {
            name: attempt.name,
            owner: attempt.owner,
            ttl,
            conn,
            signal,
            fixed,
            session,
            membership,
            renew: Arc::clone(&self.renew),
            holders: Arc::clone(&self.holders),
        }
    }

    /// The statements of a session.
    #[cfg(all(test, feature = "mysql"))]
    pub(crate) fn session_sql(&self) -> &SessionSql {
        &self.session
    }

    /// The server connection that holds `name`, if one of this strategy's holds holds it.
    pub(crate) fn holder_connection_id(&self, name: &str) -> Option<u64> {
        self.holders.connection_of(name)
    }
}

/// A connection of the lock pool for one held or waiting lock of `name`, waiting for one
/// until `deadline` (with a grace to open one, so that even a zero wait makes its attempt).
///
/// A pool that stays exhausted is an error that says so, not a lock held by someone: every
/// held or waiting lock of a pinned strategy pins a connection.
async fn pin(
    inner: &Inner,
    pinners: &Arc<Pinners>,
    name: &LockName,
    deadline: Deadline,
) -> Result<Pinned> {
    let backend = inner.backend;
    let Some(lock_pool) = &inner.lock_pool else {
        return Err(Error::unsupported(
            backend,
            "a lock on a connection of its own",
        ));
    };
    let exhausted = || {
        Error::backend_failed(
            backend,
            format!(
                "{} pins one connection per held or waiting lock, and all {} of the \
                 pool are in use: raise ?pool=N (within the server's max_connections)",
                inner.strategy,
                lock_pool.max_connections()
            ),
            false,
        )
    };
    // A connect that timed out while the pool had room is a slow server (retryable), not
    // an exhausted pool.
    let timed_out = || {
        if lock_pool.all_in_use() {
            exhausted()
        } else {
            Error::no_answer(
                backend,
                format!(
                    "opening a connection for a {} lock timed out",
                    inner.strategy
                ),
            )
        }
    };
    let pooled = match deadline.instant() {
        // No deadline: wait as long as it takes, also for a connection (an unbounded
        // acquire must not fail because the pool is busy), and say so, whatever the
        // cause (a full pool, or a database that does not answer), ever more rarely (the
        // 1st, 2nd, 4th, 8th … wait that ran out): a wait that never ends must not look
        // like a lock held for ever.
        None => {
            let mut waits = 0u32;
            loop {
                match lock_pool.acquire().await {
                    // The task holds (or waits for) another lock on a connection of the
                    // pool, and every connection is pinned: those it waits for may well be
                    // its own lock's and its waiters', who wait for it (a nested acquire, a
                    // MultiLock of several such locks). An error, not a wait for ever.
                    Err(sqlx::Error::PoolTimedOut)
                        if lock_pool.all_in_use()
                            && pinners.waits_for_itself(lock_pool.max_connections()) =>
                    {
                        return Err(Error::would_deadlock(
                            name,
                            format!(
                                "all {1} connections of the {0} lock pool are pinned by this \
                                 task's locks and by waiters for them, and it holds them while \
                                 it waits for one more: release its lock first, or raise \
                                 ?pool=N",
                                inner.strategy,
                                lock_pool.max_connections()
                            ),
                        ));
                    }
                    Err(sqlx::Error::PoolTimedOut) => {
                        waits = waits.saturating_add(1);
                        if waits.is_power_of_two() {
                            tracing::warn!(lock = %name, error = %timed_out(), waits, "still waiting for a connection");
                        }
                    }
                    other => break other,
                }
            }
        }
        Some(d) => {
            match tokio::time::timeout_at(d.max(from_now(CONNECT_GRACE)), lock_pool.acquire()).await
            {
                Ok(c) => c,
                Err(_) => return Err(timed_out()),
            }
        }
    };
    let pooled = match pooled {
        Err(sqlx::Error::PoolTimedOut) => return Err(timed_out()),
        other => other.map_err(|e| from_sqlx(backend, "connect", e))?,
    };
    Ok(Pinned::new(
        pooled,
        backend,
        pinners,
        name,
        deadline.instant().is_some(),
    ))
}

/// Whether a try of a pinned lock waits on the server, and for how many seconds: the first
/// try never does (an uncontended lock costs one round trip), nor one with less than a second
/// left (the server counts its lock waits in seconds); the others wait for what is left of
/// the wait, at most 50 s at a time (then they try again).
pub(crate) fn server_wait(first: bool, deadline: Deadline) -> Option<i64> {
    let left = deadline.remaining();
    let blocking = !first && left.is_none_or(|left| left >= Duration::from_secs(1));
    blocking.then(|| {
        left.map_or(50, |left| {
            i64::try_from(left.as_secs()).unwrap_or(50).min(50)
        })
    })
}

/// The longest lease of a pinned hold on `dialect`: PostgreSQL's session timeouts (the
/// server-side lease) end at 2^31 - 1 ms, and the lease goes to them in whole seconds.
pub(crate) fn max_lease(dialect: Dialect) -> Duration {
    match dialect {
        Dialect::Postgres => Duration::from_secs(2_147_483),
        Dialect::MySql | Dialect::Sqlite => Lease::MAX,
    }
}

/// A pinned hold's lease as the server's idle timeout: whole seconds, rounded up, within the
/// server's range (1 s to 365 days).
pub(crate) fn server_seconds(lease: Duration) -> i64 {
    let secs = lease
        .as_secs()
        .saturating_add(u64::from(lease.subsec_nanos() > 0));
    i64::try_from(secs.clamp(1, 31_536_000)).unwrap_or(31_536_000)
}

/// The live holds of a pinned strategy's provider, by owner: the lock's name and the server
/// connection that holds it (see `SqlProvider::holder_connection_id`).
#[derive(Debug, Default)]
pub(crate) struct Holders(Mutex<HashMap<String, (LockName, u64)>>);

impl Holders {
    pub(crate) fn remember(&self, owner: &str, name: &LockName, connection: u64) {
        self.0
            .lock()
            .insert(owner.to_owned(), (name.clone(), connection));
    }

    pub(crate) fn forget(&self, owner: &str) {
        self.0.lock().remove(owner);
    }

    /// The server connection that holds `name`, if one of these holds it.
    pub(crate) fn connection_of(&self, name: &str) -> Option<u64> {
        self.0
            .lock()
            .values()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, id)| *id)
    }
}

/// The undo of [`Pinning::killer`]: ends a server session from another connection of the
/// pool.
struct KillSession {
    inner: Arc<Inner>,
    sql: SessionSql,
}

impl UndoFn<u64> for KillSession {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    /// Kills the session, and waits (at most [`KILL_WAIT`]) until it ended: its lock wait is
    /// gone from the server's queue when the undo is done (a provider's close waits for it).
    fn undo(&self, id: u64) -> Self::Future {
        let (inner, kill) = (Arc::clone(&self.inner), self.sql.kill_connection(id));
        let left = self.sql.connection_left.clone();
        Box::pin(async move {
            if let Err(e) = query(&kill).execute(&inner.pool).await {
                tracing::debug!(connection = id, error = %e, "could not kill a cancelled lock wait");
                return;
            }
            let Some(left) = left else { return };
            let id_arg = i64::try_from(id).unwrap_or(i64::MAX);
            let mut pause = Backoff::new(Duration::from_millis(5), Duration::from_millis(50));
            let gone = async {
                loop {
                    let there = query(&left)
                        .bind(id_arg)
                        .fetch_one(&inner.pool)
                        .await
                        .and_then(|row| row.int(0));
                    match there {
                        Ok(0) => return,
                        Ok(_) => pause.wait().await,
                        Err(e) => {
                            tracing::debug!(connection = id, error = %e, "could not tell whether a killed session ended");
                            return;
                        }
                    }
                }
            };
            // Each look may wait for a connection of a busy pool: the whole wait is bounded.
            if Deadline::after(KILL_WAIT).run(gone).await.is_none() {
                tracing::debug!(
                    connection = id,
                    "a killed lock wait's session was still there after {KILL_WAIT:?}"
                );
            }
        })
    }
}

/// The statements of one acquisition that wait for a lock on its pinned connection, each
/// run with the connection's session killed if the acquisition is dropped while it waits
/// (see [`Pinning::killer`]). That needs the session's id on the server: reported by a
/// statement, or else asked of the server once per connection. The killer is made on the
/// first wait: an acquisition that never waits makes none.
#[derive(Default)]
pub(crate) struct Waits {
    session: Option<u64>,
    killer: Option<UndoOnDrop<u64, KillSession>>,
}

impl Waits {
    /// The session's id, as a statement reported it.
    pub(crate) fn session_is(&mut self, id: u64) {
        self.session = Some(id);
    }

    /// The acquisition moved to another connection, whose session's id is not known yet.
    pub(crate) fn new_connection(&mut self) {
        self.session = None;
    }

    /// Runs `statement`, which may wait for a lock, on `conn`, with its session killed if
    /// this future is dropped meanwhile: the session's id and what the statement returned.
    ///
    /// # Errors
    ///
    /// The connection broke, or its session's id could not be read.
    pub(crate) async fn run<T>(
        &mut self,
        pinning: &Pinning,
        conn: &mut Pinned,
        statement: impl AsyncFnOnce(&mut Conn) -> T,
    ) -> Result<(u64, T)> {
        let id = match self.session {
            Some(id) => id,
            None => *self.session.insert(pinning.session_id(conn).await?),
        };
        let conn = conn.get()?;
        let killer = self.killer.get_or_insert_with(|| pinning.killer());
        killer.arm(id);
        let result = statement(conn).await;
        killer.disarm();
        Ok((id, result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lease_rounds_up_within_the_servers_range() {
        assert_eq!(server_seconds(Duration::ZERO), 1);
        assert_eq!(server_seconds(Duration::from_millis(800)), 1);
        assert_eq!(server_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(server_seconds(Duration::from_secs(30)), 30);
        assert_eq!(server_seconds(Duration::MAX), 31_536_000);
    }
}
