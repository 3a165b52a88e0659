//! for-update on MySQL/MariaDB: a pinned connection's transaction holds `SELECT … FOR
//! UPDATE` on the name's row; a waiter waits on the row lock itself. Fencing tokens come from
//! a counter row per name, taken on another connection while the hold is proven alive.
//!
//! for-update on PostgreSQL is held by [`super::advisory`]'s statements: a PostgreSQL row
//! lock needs a transaction id, which held open keeps `VACUUM` from removing the row
//! versions that die after it anywhere in the database.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Deadline, later};
use dlock_core::{LockKind, LockName, LockStatus, Result, async_trait};
use tokio::time::Instant;

use super::{Attempt, Grant, LockStrategy, missing_id, read_row};
use crate::Inner;
use crate::db::{Conn, Pool, query};
use crate::error::{self, Meaning, from_sqlx, meaning};
use crate::pinned::{
    ClosedUnlessReturned, Held, Pinned, PinnedHold, Pinning, Release, Waits, server_seconds,
    server_wait,
};
use crate::sql::{RowLockSql, Tables};

/// The for-update strategy of one provider.
#[derive(Debug)]
pub(crate) struct ForUpdate {
    pub(crate) sql: RowLockSql,
    pinning: Pinning,
}

/// A for-update row lock just granted, on its connection.
#[derive(Debug)]
pub(crate) struct Granted {
    /// The connection whose transaction holds the row.
    pub(crate) conn: Pinned,
    /// The server's id of that connection.
    pub(crate) connection_id: u64,
    /// When the statement that set the hold's server-side lease and took the row without
    /// waiting was sent; `None` after a wait (the lease then starts with
    /// [`Pinning::start_lease`]).
    pub(crate) lease_sent: Option<Instant>,
}

/// A for-update hold: the row lock of its connection's transaction.
pub(crate) type ForUpdateHold = Held<EndTransaction>;

/// A for-update hold is given back by ending its transaction.
#[derive(Debug)]
pub(crate) struct EndTransaction {
    strategy: Arc<ForUpdate>,
}

#[async_trait]
impl Release for EndTransaction {
    async fn release(&self, hold: &PinnedHold) -> bool {
        let reset = Some(self.strategy.sql.reset_hold_timeout.as_str());
        hold.conn.lock().await.free(reset).await.is_ok()
    }
}

#[async_trait]
impl LockStrategy for ForUpdate {
    async fn try_lock(
        self: Arc<Self>,
        attempt: Attempt,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        let Some(mut granted) = self.lock(&attempt, deadline).await? else {
            return Ok(None);
        };
        // The lease runs from the statement that set it with the grant, or after a wait,
        // from now.
        let leased = match granted.lease_sent {
            Some(sent) => sent,
            None => {
                self.pinning
                    .start_lease(&mut granted.conn, attempt.ttl())
                    .await?
            }
        };
        // A fixed lease ends at its time on the server too, however long the fence took.
        let fixed_at = (!attempt.lease.is_watchdog()).then(|| later(leased, attempt.ttl()));
        let left = || {
            fixed_at.map_or(attempt.ttl(), |end| {
                end.saturating_duration_since(Instant::now())
            })
        };
        // If the connection died after the grant (and another holder got the row and a
        // token meanwhile), this fails: no guard carries a token above the real holder's.
        let token = self.fence_held(&attempt, &mut granted, left).await?;
        let pinned =
            self.pinning
                .first_hold(granted.conn, attempt, granted.connection_id, fixed_at)?;
        let signal = pinned.signal.clone();
        Ok(Some(Grant {
            hold: Arc::new(ForUpdateHold {
                pinned,
                how: EndTransaction { strategy: self },
            }),
            token,
            sent: leased,
            signal: Some(signal),
        }))
    }

    async fn describe(&self, name: &LockName) -> Result<LockStatus> {
        let err = self.pinning.inner.err("describe");
        let row = read_row(
            &self.pinning.inner,
            &self.sql.describe_fence,
            name,
            "describe",
        )
        .await?;
        let token = match row {
            Some(row) => u64::try_from(row.int(0).map_err(err)?).ok(),
            None => None,
        };
        if self.row_locked(name).await? {
            Ok(LockStatus::held_by(LockKind::Mutex, Vec::new()).with_last_token(token))
        } else {
            Ok(LockStatus::free(token))
        }
    }

    fn holder_connection_id(&self, name: &str) -> Option<u64> {
        self.pinning.holder_connection_id(name)
    }

    #[cfg(feature = "mysql")]
    fn for_update(self: Arc<Self>) -> Option<Arc<ForUpdate>> {
        Some(self)
    }
}

impl ForUpdate {
    pub(crate) fn new(inner: Arc<Inner>, tables: Tables<'_>) -> Self {
        let sql = RowLockSql::new(tables);
        let pinning = Pinning::new(inner, &sql.hold_timeout);
        Self { sql, pinning }
    }

    /// Takes the row lock on a dedicated connection (the row is created on first use),
    /// waiting until `deadline`.
    ///
    /// The hold's lease is the server's: the connection's idle timeout (`wait_timeout`), so a
    /// holder that stops talking (paused, cut off) is disconnected by the server and its row
    /// freed. The first try sets it and takes the row without waiting in one round trip; a
    /// try that waits sets it before it waits, and [`Pinning::start_lease`] again at the
    /// grant. The connection of a statement that waits for the row is killed (`KILL
    /// CONNECTION`, from another connection) if the acquisition is dropped, so a cancelled
    /// waiter leaves no waiting statement on the server.
    pub(crate) async fn lock(&self, a: &Attempt, deadline: Deadline) -> Result<Option<Granted>> {
        let s = &self.sql;
        let mut conn = self.pinning.pin(&a.name, deadline).await?;
        // The statements that wait for the row, killed if dropped while they wait.
        let mut waits = Waits::default();
        // The first try never waits (NOWAIT): an uncontended lock costs one round trip, with
        // no lock-wait setting and no connection id for the killer of a waiting statement.
        let mut first = true;
        loop {
            let wait = server_wait(std::mem::take(&mut first), deadline);
            let mut lease_sent = None;
            let locked = if let Some(lock_wait) = wait {
                // The server-side lease starts at the grant, not after it: a waiter frozen or
                // cut off while it waits, and granted the row then, is disconnected after its
                // lease of idleness instead of the server's default (8 h). The client's lease
                // starts later (at `start_lease`), so the client still gives up first.
                query(&s.lock_wait_timeout)
                    .bind(lock_wait)
                    .bind(server_seconds(a.ttl()))
                    .execute(conn.get()?)
                    .await
                    .map_err(self.pinning.inner.err("set the lock wait"))?;
                let lock =
                    async |c: &mut Conn| query(&s.lock_row).bind(a.key()).fetch_optional(c).await;
                waits.run(&self.pinning, &mut conn, lock).await?.1
            } else {
                // One round trip: the lease, then the row without waiting.
                let batch = s.lock_row_first_try(a.key(), server_seconds(a.ttl()));
                lease_sent = Some(Instant::now());
                conn.get()?
                    .batch(&batch)
                    .await
                    .map(|rows| rows.into_iter().next())
            };
            match locked {
                Ok(Some(row)) => {
                    let id = row.int(0).map_err(self.pinning.inner.err("lock"))?;
                    return Ok(Some(Granted {
                        conn,
                        connection_id: u64::try_from(id).unwrap_or(0),
                        lease_sent,
                    }));
                }
                Ok(None) => {
                    // First use of the name (or its row was deleted by hand): end the
                    // transaction (it locks nothing, but none is left open), create the row,
                    // retry.
                    conn.rollback().await;
                    self.create_row(&self.pinning.inner.pool, &a.name).await?;
                }
                Err(e) if meaning(&e) == Meaning::Busy => {
                    // Every try set the session's server-side lease: it is put back before
                    // the connection returns to the pool, where the server would otherwise
                    // close it.
                    let reset = Some(s.reset_hold_timeout.as_str());
                    if deadline.has_passed() {
                        // The last try: the rollback and the reset in one round trip.
                        conn.end(reset).await;
                        return Ok(None);
                    }
                    conn.rollback().await;
                    if conn.busy(deadline, reset).await {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(self.pinning.inner.err("lock")(e)),
            }
        }
    }

    /// The fencing token of a for-update hold just granted, taken while the hold is proven
    /// alive, so that no guard carries a token above the real holder's (a connection that
    /// died after its grant, while another holder took the row and a token): the hold's
    /// server-side lease is set again on the holding connection after the token, to `left()`,
    /// what is left of the hold's lease.
    pub(crate) async fn fence_held(
        &self,
        a: &Attempt,
        granted: &mut Granted,
        left: impl FnOnce() -> Duration,
    ) -> Result<u64> {
        let fence = self.next_fence(&self.pinning.inner.pool, &a.name).await?;
        self.confirm_lease(&mut granted.conn, left()).await?;
        Ok(fence)
    }

    /// Proves the holding connection (and so the row lock) is alive after the fence was
    /// taken on another connection, by setting its lease again: to `left`, what is left of
    /// the hold's lease.
    async fn confirm_lease(&self, conn: &mut Pinned, left: Duration) -> Result<()> {
        self.pinning
            .set_lease(conn, left, "confirm the hold after its fence")
            .await
    }

    /// The next fencing token of `name`, committed on its own (a holder that dies cannot
    /// take its token back).
    pub(crate) async fn next_fence(&self, pool: &Pool, name: &LockName) -> Result<u64> {
        let backend = self.pinning.inner.backend;
        let done = query(&self.sql.next_fence)
            .bind(name.as_str().as_bytes())
            .execute(pool)
            .await
            .map_err(self.pinning.inner.err("fence"))?;
        done.last_insert_id.ok_or_else(|| missing_id(backend, name))
    }

    /// Creates `name`'s row if it is missing. Only then: INSERT IGNORE on an existing row
    /// waits for the holder's row lock, where a plain SELECT reads without locking.
    pub(crate) async fn create_row(&self, pool: &Pool, name: &LockName) -> Result<()> {
        let exists = query(&self.sql.row_exists)
            .bind(name.as_str().as_bytes())
            .fetch_optional(pool)
            .await
            .map_err(self.pinning.inner.err("look for the lock row"))?;
        if exists.is_some() {
            return Ok(());
        }
        query(&self.sql.insert_row)
            .bind(name.as_str().as_bytes())
            .execute(pool)
            .await
            .map_err(self.pinning.inner.err("create the lock row"))?;
        Ok(())
    }

    /// Whether some connection holds `name`'s row lock, asked with a shared lock that does
    /// not wait, in a transaction rolled back at once: it never takes the lock (a plain try
    /// would) nor bumps the fence.
    async fn row_locked(&self, name: &LockName) -> Result<bool> {
        let backend = self.pinning.inner.backend;
        let Some(lock_pool) = &self.pinning.inner.lock_pool else {
            return Ok(false);
        };
        let conn = lock_pool
            .acquire()
            .await
            .map_err(|e| from_sqlx(backend, "connect", e))?;
        // Between the question (which opens a transaction) and its ROLLBACK, a dropped call
        // closes the connection: it must not go back to the pool inside that transaction.
        let mut flight = ClosedUnlessReturned(None);
        let conn = flight.0.insert(conn);
        let asked = query(&self.sql.row_locked)
            .bind(name.as_str().as_bytes())
            .fetch_optional(&mut *conn)
            .await;
        let rolled_back = query("ROLLBACK").execute(&mut *conn).await.is_ok();
        let answer = match asked {
            Ok(_) => Ok(false),
            Err(e) if error::meaning(&e) == error::Meaning::Busy => Ok(true),
            Err(e) => return Err(from_sqlx(backend, "describe", e)),
        };
        if rolled_back && let Some(conn) = flight.0.take() {
            conn.done();
        }
        answer
    }
}

#[cfg(all(test, feature = "mysql"))]
mod tests;
