//! The three strategies: one attempt each, and the holds they produce.

use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{
    Deadline, Hold, HoldSignal, Later, finish_if_dropped, from_now, spawn_at,
};
use dlock_core::{Error, LockName, LossReason, Result, async_trait};
use tokio::time::Instant;

use crate::Inner;
use crate::db::{Conn, query};
use crate::error::{Meaning, from_sqlx, meaning};
use crate::sql::AdvisoryMode;

/// Tokens of the unique-insert strategy: the row's AUTO_INCREMENT id in the high bits (it only
/// grows, across deletes and restarts), the number of takeovers of that row in the low bits.
/// Optimistic versions are laid out the same way: a seed (an AUTO_INCREMENT number) in the
/// high bits, the claims since the row got it in the low bits.
const TAKEOVER_BITS: u32 = 20;

/// How long even a zero-wait attempt may take to get a connection from the pool.
const CONNECT_GRACE: Duration = Duration::from_secs(1);

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// One acquisition by one owner.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: LockName,
    pub(crate) owner: String,
    pub(crate) lease: Duration,
}

impl Attempt {
    fn key(&self) -> &[u8] {
        self.name.as_str().as_bytes()
    }

    /// The driver gave no id where the statement always produces one.
    fn missing_id(&self) -> Error {
        Error::Backend {
            backend: self.inner.backend,
            message: format!("the database returned no id for {:?}", self.name),
            retryable: false,
            source: None,
        }
    }

    fn err(&self, what: &str) -> impl FnOnce(sqlx::Error) -> Error + '_ {
        let backend = self.inner.backend;
        let what = what.to_owned();
        move |e| from_sqlx(backend, &what, e)
    }

    /// A connection of the provider's pool for a few statements in a row.
    pub(crate) async fn connection(&self) -> Result<Conn> {
        self.inner.pool.acquire().await.map_err(self.err("connect"))
    }

    /// A connection of the provider's pool for an attempt's statements, waiting for one until
    /// `deadline`, with a grace to open one (so that even a zero wait makes its attempt). A
    /// pool that gives none by then (a database that does not answer its connects, or a pool
    /// busy with other statements) is a retryable [`Error::Connection`], never a lock held by
    /// someone else.
    pub(crate) async fn connection_by(&self, deadline: Deadline) -> Result<Conn> {
        let Some(d) = deadline.instant() else {
            return self.connection().await;
        };
        match tokio::time::timeout_at(d.max(from_now(CONNECT_GRACE)), self.inner.pool.acquire())
            .await
        {
            Ok(conn) => conn.map_err(self.err("connect")),
            Err(_) => Err(Error::no_answer(
                self.inner.backend,
                format!(
                    "no connection to the database for {:?} within the wait and a \
                     {CONNECT_GRACE:?} grace to open one",
                    self.name.as_str()
                ),
            )),
        }
    }

    // ------------------------------------------------------------ unique-insert

    /// INSERT the hold; on a duplicate, take an expired row over with a conditional UPDATE.
    pub(crate) async fn unique_insert(&self, conn: &mut Conn) -> Result<Option<u64>> {
        let s = &self.inner.sql;
        let insert = query(&s.insert_hold)
            .bind(self.key())
            .bind(&self.owner)
            .bind(ms(self.lease));
        // MySQL hands the AUTO_INCREMENT id back with the INSERT; SQLite through RETURNING.
        let inserted = match self.inner.dialect {
            crate::Dialect::MySql => insert
                .execute(&mut *conn)
                .await
                .map(|done| done.last_insert_id.and_then(|id| i64::try_from(id).ok())),
            crate::Dialect::Sqlite | crate::Dialect::Postgres => insert
                .fetch_one(&mut *conn)
                .await
                .and_then(|row| row.int(0))
                .map(Some),
        };
        match inserted {
            Ok(Some(id)) => return self.token(id, 0).map(Some),
            Ok(None) => return Err(self.missing_id()),
            Err(e) if meaning(&e) == Meaning::Duplicate => {}
            Err(e) => return Err(self.err("acquire")(e)),
        }
        let taken = query(&s.take_over_hold)
            .bind(&self.owner)
            .bind(ms(self.lease))
            .bind(self.key())
            .execute(&mut *conn)
            .await
            .map_err(self.err("take over"))?;
        if taken.rows_affected != 1 {
            return Ok(None);
        }
        let row = query(&s.select_hold_token)
            .bind(self.key())
            .bind(&self.owner)
            .fetch_optional(&mut *conn)
            .await
            .map_err(self.err("read the token"))?;
        let Some(row) = row else {
            // Taken over from us already (our lease was shorter than the round trip).
            return Ok(None);
        };
        let id = row.int(0).map_err(self.err("read the token"))?;
        let takeovers = row.int(1).map_err(self.err("read the token"))?;
        if takeovers >= 1 << TAKEOVER_BITS {
            // The row's token space is used up. The attempt's undo deletes the row (it is
            // ours now) and the retry inserts a new one, whose larger id gives larger tokens
            // (review M4: this used to be a hard error).
            return Err(Error::Backend {
                backend: self.inner.backend,
                message: format!(
                    "lock {:?} was taken over 2^20 times without a release; starting a new row",
                    self.name
                ),
                retryable: true,
                source: None,
            });
        }
        self.token(id, takeovers).map(Some)
    }

    pub(crate) async fn unique_release(&self) -> Result<bool> {
        let mut conn = self.connection().await?;
        let freed = self.unique_release_on(&mut conn).await?;
        conn.done();
        Ok(freed)
    }

    pub(crate) async fn unique_release_on(&self, conn: &mut Conn) -> Result<bool> {
        let done = query(&self.inner.sql.delete_hold)
            .bind(self.key())
            .bind(&self.owner)
            .execute(&mut *conn)
            .await
            .map_err(self.err("release"))?;
        Ok(self.freed(done.rows_affected == 1))
    }

    /// After a release statement (of a hold, or of an acquisition undone): if it freed the
    /// lock, wakes a waiter of this process; passes `freed` on.
    fn freed(&self, freed: bool) -> bool {
        if freed {
            self.inner.released(&self.name);
        }
        freed
    }

    pub(crate) async fn unique_renew(&self, ttl: Duration) -> Result<bool> {
        let done = query(&self.inner.sql.renew_hold)
            .bind(ms(ttl))
            .bind(self.key())
            .bind(&self.owner)
            .execute(&self.inner.pool)
            .await
            .map_err(self.err("renew"))?;
        Ok(done.rows_affected == 1)
    }

    // ------------------------------------------------------------ optimistic

    /// `UPDATE … WHERE version = ?` with the version last seen for this name; on a miss, read
    /// the current version (creating the row on first use) and try once more.
    pub(crate) async fn optimistic(&self, conn: &mut Conn) -> Result<Option<u64>> {
        let cached = self.inner.cached_version(&self.name);
        if let Some(version) = cached
            && let Some(token) = self.claim(conn, version).await?
        {
            return Ok(Some(token));
        }
        let s = &self.inner.sql;
        let mut row = query(&s.select_version)
            .bind(self.key())
            .fetch_optional(&mut *conn)
            .await
            .map_err(self.err("read the version"))?;
        if row.is_none() {
            // A new row starts at the versions of a new seed, above every token an earlier
            // row of this name gave (one deleted by hand, say): tokens never go backwards.
            let first = seed_above(&self.inner, conn, -1).await?;
            query(&s.insert_version)
                .bind(self.key())
                .bind(first)
                .execute(&mut *conn)
                .await
                .map_err(self.err("create the row"))?;
            row = query(&s.select_version)
                .bind(self.key())
                .fetch_optional(&mut *conn)
                .await
                .map_err(self.err("read the version"))?;
        }
        let Some(row) = row else { return Ok(None) };
        let version = row.int(0).map_err(self.err("read the version"))?;
        self.inner.cache_version(&self.name, version);
        if cached == Some(version) {
            return Ok(None); // the claim above already failed on this very version
        }
        self.claim(conn, version).await
    }

    /// Claims `version` of a free row; a row whose seed has no version left is moved to a
    /// new seed first.
    async fn claim(&self, conn: &mut Conn, version: i64) -> Result<Option<u64>> {
        let version = if seed_used_up(version) {
            // Only a free row moves (a seed is not minted for every poll of a held one).
            let free = query(&self.inner.sql.version_free)
                .bind(self.key())
                .bind(version)
                .fetch_optional(&mut *conn)
                .await
                .map_err(self.err("read the version"))?;
            if free.is_none() {
                return Ok(None);
            }
            // Above the row's own versions, whatever seed they came from (a row of an older
            // dlock counted from 0 and may be past 2^20).
            let next = seed_above(&self.inner, conn, version).await?;
            let moved = query(&self.inner.sql.reseed_version)
                .bind(next)
                .bind(self.key())
                .bind(version)
                .execute(&mut *conn)
                .await
                .map_err(self.err("move to a new seed"))?;
            if moved.rows_affected != 1 {
                return Ok(None); // held, or claimed or moved by someone else
            }
            self.inner.cache_version(&self.name, next);
            next
        } else {
            version
        };
        let q = query(&self.inner.sql.claim_version)
            .bind(&self.owner)
            .bind(ms(self.lease))
            .bind(self.key())
            .bind(version);
        let next = match self.inner.dialect {
            crate::Dialect::MySql => {
                let done = q.execute(&mut *conn).await.map_err(self.err("acquire"))?;
                if done.rows_affected != 1 {
                    None
                } else {
                    let id = done.last_insert_id.ok_or_else(|| self.missing_id())?;
                    Some(i64::try_from(id).map_err(|_| self.missing_id())?)
                }
            }
            crate::Dialect::Sqlite | crate::Dialect::Postgres => {
                let row = q
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(self.err("acquire"))?;
                match row {
                    Some(row) => Some(row.int(0).map_err(self.err("acquire"))?),
                    None => None,
                }
            }
        };
        Ok(next.map(|v| {
            self.inner.cache_version(&self.name, v);
            u64::try_from(v).unwrap_or(0)
        }))
    }

    pub(crate) async fn optimistic_release(&self, version: Option<u64>) -> Result<bool> {
        let mut conn = self.connection().await?;
        let freed = self.optimistic_release_on(&mut conn, version).await?;
        conn.done();
        Ok(freed)
    }

    pub(crate) async fn optimistic_release_on(
        &self,
        conn: &mut Conn,
        version: Option<u64>,
    ) -> Result<bool> {
        let s = &self.inner.sql;
        let done = match version {
            Some(v) => {
                query(&s.release_version)
                    .bind(self.key())
                    .bind(&self.owner)
                    .bind(i64::try_from(v).unwrap_or(i64::MAX))
                    .execute(&mut *conn)
                    .await
            }
            None => {
                query(&s.release_version_by_owner)
                    .bind(self.key())
                    .bind(&self.owner)
                    .execute(&mut *conn)
                    .await
            }
        }
        .map_err(self.err("release"))?;
        Ok(self.freed(done.rows_affected == 1))
    }

    pub(crate) async fn optimistic_renew(&self, version: u64, ttl: Duration) -> Result<bool> {
        let done = query(&self.inner.sql.renew_version)
            .bind(ms(ttl))
            .bind(self.key())
            .bind(&self.owner)
            .bind(i64::try_from(version).unwrap_or(i64::MAX))
            .execute(&self.inner.pool)
            .await
            .map_err(self.err("renew"))?;
        Ok(done.rows_affected == 1)
    }

    // ------------------------------------------------------------ for-update

    /// A connection of the lock pool for one held or waiting lock, waiting for one until
    /// `deadline` (with a grace to open one, so that even a zero wait makes its attempt).
    async fn pin(&self, deadline: Deadline) -> Result<Pinned> {
        let Some(lock_pool) = &self.inner.lock_pool else {
            return Err(Error::unsupported(
                self.inner.backend,
                "a lock on a connection of its own",
            ));
        };
        // Each held or waiting lock pins a connection; waiting for one respects the deadline,
        // with a grace to open one, so that even a zero wait makes its one attempt.
        // A pool that stays exhausted is an error that says so, not "held by someone" (review
        // M1): every held or waiting for-update lock pins a connection.
        let exhausted = || Error::Backend {
            backend: self.inner.backend,
            message: format!(
                "{} pins one connection per held or waiting lock, and all {} of the \
                 pool are in use: raise ?pool=N (within the server's max_connections)",
                self.inner.strategy,
                lock_pool.max_connections()
            ),
            retryable: false,
            source: None,
        };
        // A connect that timed out while the pool had room is a slow server (retryable), not
        // an exhausted pool.
        let timed_out = || {
            if lock_pool.all_in_use() {
                exhausted()
            } else {
                Error::Connection {
                    backend: self.inner.backend,
                    message: format!(
                        "opening a connection for a {} lock timed out",
                        self.inner.strategy
                    ),
                    source: None,
                }
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
                        Err(sqlx::Error::PoolTimedOut) => {
                            waits = waits.saturating_add(1);
                            if waits.is_power_of_two() {
                                tracing::warn!(lock = %self.name, error = %timed_out(), waits, "still waiting for a connection");
                            }
                        }
                        other => break other,
                    }
                }
            }
            Some(d) => {
                match tokio::time::timeout_at(d.max(from_now(CONNECT_GRACE)), lock_pool.acquire())
                    .await
                {
                    Ok(c) => c,
                    Err(_) => return Err(timed_out()),
                }
            }
        };
        let pooled = match pooled {
            Err(sqlx::Error::PoolTimedOut) => return Err(timed_out()),
            other => other.map_err(self.err("connect"))?,
        };
        Ok(Pinned {
            conn: Some(pooled),
            closed: false,
            watcher: None,
            backend: self.inner.backend,
        })
    }

    /// Takes the row lock on a dedicated connection (the row is created on first use), waiting
    /// until `deadline`.
    ///
    /// The hold's lease is the server's: the connection's idle timeout (MySQL's `wait_timeout`,
    /// PostgreSQL's `idle_in_transaction_session_timeout`), so a holder that stops talking
    /// (paused, cut off) is disconnected by the server and its row freed. The first try sets
    /// it and takes the row without waiting in one round trip; a try that waits sets it
    /// before it waits, and [`start_lease`](Self::start_lease) again at the grant. The
    /// connection of a statement that waits for the row is killed (`KILL CONNECTION`, on
    /// PostgreSQL `pg_terminate_backend`, from another connection) if the acquisition is
    /// dropped, so a cancelled waiter leaves no waiting statement on the server.
    pub(crate) async fn for_update(&self, deadline: Deadline) -> Result<Option<Granted>> {
        let s = &self.inner.sql;
        let postgres = self.inner.dialect == crate::Dialect::Postgres;
        let mut conn = self.pin(deadline).await?;
        let mut connection_id = None;
        // The first try never waits (NOWAIT): an uncontended lock costs one round trip, with
        // no lock-wait setting and no connection id for the killer of a waiting statement.
        let mut first = true;
        // Whether a try set the session's server-side lease, to be put back before the
        // connection returns to the pool, where the server would otherwise close it (MySQL;
        // PostgreSQL's is local to the transaction, which a busy try rolls back).
        let mut lease_set = false;
        loop {
            let left = deadline.remaining();
            let blocking = !first && left.is_none_or(|left| left >= Duration::from_secs(1));
            first = false;
            let mut lease_sent = None;
            // A statement that may wait gets a killer, armed while it is in flight.
            let mut killer = None;
            let locked = if blocking {
                // The server-side lease starts at the grant, not after it: a waiter frozen or
                // cut off while it waits, and granted the row then, is disconnected after its
                // lease of idleness instead of the server's default (8 h). The client's lease
                // starts later (at `start_lease`), so the client still gives up first.
                let lock_wait = left.map_or(50, |left| {
                    i64::try_from(left.as_secs()).unwrap_or(50).min(50)
                });
                let set_wait = query(&s.lock_wait_timeout)
                    .bind(lock_wait)
                    .bind(server_seconds(self.lease));
                if postgres {
                    // PostgreSQL has no autocommit switch: the row lock's transaction is
                    // opened by hand (MySQL's lock pool opens one with every statement), and
                    // the settings, local to it, come with the session's id.
                    query("BEGIN")
                        .execute(conn.get()?)
                        .await
                        .map_err(self.err("begin"))?;
                    let row = set_wait
                        .fetch_one(conn.get()?)
                        .await
                        .map_err(self.err("set the lock wait"))?;
                    let id = row.int(2).map_err(self.err("connection id"))?;
                    connection_id = Some(u64::try_from(id).unwrap_or(0));
                } else {
                    lease_set = true;
                    set_wait
                        .execute(conn.get()?)
                        .await
                        .map_err(self.err("set the lock wait"))?;
                }
                let id = match connection_id {
                    Some(id) => id,
                    None => {
                        let row = query(&s.connection_id)
                            .fetch_one(conn.get()?)
                            .await
                            .map_err(self.err("connection id"))?;
                        let id = u64::try_from(row.int(0).map_err(self.err("connection id"))?)
                            .unwrap_or(0);
                        *connection_id.insert(id)
                    }
                };
                killer = Some(KillOnDrop(Some((Arc::clone(&self.inner), id))));
                query(&s.lock_row)
                    .bind(self.key())
                    .fetch_optional(conn.get()?)
                    .await
            } else {
                // One round trip: the lease (and on PostgreSQL the transaction), then the
                // row without waiting.
                lease_set |= !postgres;
                let batch = s.lock_row_first_try(self.key(), server_seconds(self.lease));
                lease_sent = Some(Instant::now());
                conn.get()?
                    .batch(&batch)
                    .await
                    .map(|rows| rows.into_iter().next())
            };
            if let Some(mut k) = killer {
                k.0 = None;
            }
            match locked {
                Ok(Some(row)) => {
                    let id = row.int(0).map_err(self.err("lock"))?;
                    let transaction = row.int(1).map_err(self.err("lock"))?;
                    return Ok(Some(Granted {
                        conn,
                        connection_id: u64::try_from(id).unwrap_or(0),
                        transaction,
                        lease_sent,
                    }));
                }
                Ok(None) => {
                    // First use of the name (or its row was deleted by hand): end the
                    // transaction (it locks nothing, but none is left open), create the row,
                    // retry.
                    // The row is only inserted when missing: INSERT IGNORE on an existing row
                    // waits for the holder's row lock.
                    conn.rollback().await;
                    self.inner.create_row(&self.name).await?;
                }
                Err(e) if meaning(&e) == Meaning::Busy => {
                    let reset = if lease_set {
                        s.reset_hold_timeout.as_deref()
                    } else {
                        None
                    };
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
                Err(e) => return Err(self.err("lock")(e)),
            }
        }
    }

    /// The fencing token of a for-update hold just granted, taken while the hold is proven
    /// alive, so that no guard carries a token above the real holder's (review M5: a
    /// connection that died after its grant, while another holder took the row and a token).
    ///
    /// PostgreSQL proves it in the statement that takes the token (the holder's transaction
    /// is still in progress); MySQL sets the hold's server-side lease again on the holding
    /// connection after the token, to `left()`, what is left of the hold's lease.
    pub(crate) async fn fence_held(
        &self,
        granted: &mut Granted,
        left: impl FnOnce() -> Duration,
    ) -> Result<u64> {
        if self.inner.dialect != crate::Dialect::Postgres {
            let fence = self.next_fence().await?;
            self.confirm_lease(&mut granted.conn, left()).await?;
            return Ok(fence);
        }
        let session = i64::try_from(granted.connection_id).unwrap_or(0);
        let row = query(&self.inner.sql.next_fence_held)
            .bind(self.key())
            .bind(granted.transaction)
            .bind(session)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(self.err("fence"))?;
        match row {
            Some(row) => Ok(u64::try_from(row.int(0).map_err(self.err("fence"))?).unwrap_or(0)),
            None => {
                granted.conn.close();
                Err(Error::Backend {
                    backend: self.inner.backend,
                    message: format!(
                        "the connection that was granted lock {:?} ended before its fencing \
                         token was taken",
                        self.name
                    ),
                    retryable: true,
                    source: None,
                })
            }
        }
    }

    // ------------------------------------------------------------ advisory (PostgreSQL)

    /// The advisory key of this name: its number in `<prefix>_names`, given on first use.
    async fn advisory_key(&self) -> Result<i32> {
        if let Some(key) = self.inner.cached_key(&self.name) {
            return Ok(key);
        }
        let s = &self.inner.sql;
        let read = || async {
            let row = query(&s.advisory_key)
                .bind(self.key())
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(self.err("read the advisory key"))?;
            match row {
                Some(row) => row
                    .int(0)
                    .map(Some)
                    .map_err(self.err("read the advisory key")),
                None => Ok(None),
            }
        };
        let id = match read().await? {
            Some(id) => id,
            None => {
                query(&s.advisory_new_key)
                    .bind(self.key())
                    .execute(&self.inner.pool)
                    .await
                    .map_err(self.err("give the name an advisory key"))?;
                read().await?.ok_or_else(|| self.missing_id())?
            }
        };
        let key = i32::try_from(id).map_err(|_| self.missing_id())?;
        self.inner.cache_key(&self.name, key);
        Ok(key)
    }

    /// Takes the advisory lock of this name on a session of its own, waiting until
    /// `deadline`, with its fencing token taken in the granting statement.
    ///
    /// The hold's lease is the server's: the session's `idle_session_timeout` is set with the
    /// grant (in the statement that takes the lock, or before a waiting one), so a holder
    /// that stops talking (paused, cut off) is disconnected and its lock freed. The session of
    /// a waiting statement is ended (`pg_terminate_backend` from another connection) if the
    /// acquisition is dropped: nothing it might have been granted outlives it.
    pub(crate) async fn advisory(
        &self,
        deadline: Deadline,
        mode: AdvisoryMode,
    ) -> Result<Option<AdvisoryGrant>> {
        let key = self.advisory_key().await?;
        let s = &self.inner.sql;
        let mut conn = self.pin(deadline).await?;
        let lease = server_seconds(self.lease);
        let mut first = true;
        let mut lease_set = false;
        // The session's backend pid: every try that does not wait reports it, so a waiting
        // try asks only on a session that has not tried yet.
        let mut session_pid = None;
        loop {
            let left = deadline.remaining();
            let blocking = !first && left.is_none_or(|left| left >= Duration::from_secs(1));
            first = false;
            let sent;
            // (token, pid) of a grant; `None` while the lock is busy.
            let granted = if blocking {
                lease_set = true;
                let wait = left.map_or(50, |left| {
                    i64::try_from(left.as_secs()).unwrap_or(50).min(50)
                });
                query(&s.advisory_wait)
                    .bind(wait)
                    .bind(lease)
                    .execute(conn.get()?)
                    .await
                    .map_err(self.err("set the lock wait"))?;
                let pid = match session_pid {
                    Some(pid) => pid,
                    None => *session_pid.insert(self.backend_pid(&mut conn).await?),
                };
                let mut killer = KillOnDrop(Some((Arc::clone(&self.inner), pid)));
                let locked = query(&s.advisory_lock[mode.index()])
                    .bind(i64::from(key))
                    .fetch_one(conn.get()?)
                    .await;
                killer.0 = None;
                match locked {
                    Ok(row) => {
                        let token = optional_int(&row, 0).map_err(self.err("lock"))?;
                        // The statement may have waited long: the lease runs from after it
                        // (as the server's idle time does), not from when it was sent.
                        sent = self.start_lease(&mut conn).await?;
                        Some((token, pid))
                    }
                    Err(e) => {
                        // The session may hold the lock all the same (a lock timeout at the
                        // moment of the grant, or the token's UPDATE failing after it): it is
                        // closed, never reused or returned to the pool.
                        conn.close();
                        if meaning(&e) != Meaning::Busy {
                            return Err(self.err("lock")(e));
                        }
                        if deadline.has_passed() {
                            return Ok(None);
                        }
                        conn = self.pin(deadline).await?;
                        session_pid = None;
                        continue;
                    }
                }
            } else {
                sent = Instant::now();
                let row = query(&s.advisory_try[mode.index()])
                    .bind(i64::from(key))
                    .bind(lease)
                    .fetch_one(conn.get()?)
                    .await
                    .map_err(self.err("lock"))?;
                let pid = u64::try_from(row.int(2).map_err(self.err("lock"))?).unwrap_or(0);
                session_pid = Some(pid);
                // The second column is the lease set on a grant, NULL while the lock is busy.
                if row.is_null(1).map_err(self.err("lock"))? {
                    None
                } else {
                    Some((optional_int(&row, 0).map_err(self.err("lock"))?, pid))
                }
            };
            match granted {
                Some((Some(token), pid)) => {
                    let token = u64::try_from(token).map_err(|_| self.missing_id())?;
                    return Ok(Some(AdvisoryGrant {
                        conn,
                        pid,
                        key,
                        token,
                        sent,
                    }));
                }
                Some((None, _)) => {
                    // Granted, but the name's row is gone (deleted by hand): no token to give.
                    // Closing the session frees the lock; the next try gives the name a key.
                    drop(conn);
                    self.inner.forget_key(&self.name);
                    return Err(Error::Backend {
                        backend: self.inner.backend,
                        message: format!("the advisory key of {:?} vanished", self.name),
                        retryable: true,
                        source: None,
                    });
                }
                None => {}
            }
            if conn
                .busy(deadline, lease_set.then_some(s.advisory_reset.as_str()))
                .await
            {
                return Ok(None);
            }
        }
    }

    /// Takes the shared advisory lock of this name on `conn`, the session of this handle's
    /// write hold (a downgrade): the server grants a session a lock that only its own locks
    /// stand in the way of, even with writers queued (where a try would be refused), so the
    /// read is granted at once beside the write. The new hold joins the session's `holds`
    /// under the session's lock, before anything can release the write (whose release would
    /// otherwise free the read with the session), with `signal` and `fixed` (its fixed
    /// lease's end, set here from when the statement was sent).
    ///
    /// Cancel safe: the statements run in a task of their own, under the session's lock,
    /// and a read granted after the acquisition was dropped is given back there.
    pub(crate) async fn advisory_beside(
        &self,
        conn: &HoldingConnection,
        holds: &Arc<SessionHolds>,
        key: i32,
        lease: dlock_core::Lease,
        signal: HoldSignal,
        fixed: FixedEnd,
    ) -> Result<Beside> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let conn = Arc::clone(conn);
        let holds = Arc::clone(holds);
        let inner = Arc::clone(&self.inner);
        let name = self.name.clone();
        // If this future is dropped after the task answered but before the answer was read,
        // the read is given back here.
        let mut answer = Unclaimed {
            rx: Some(rx),
            give_back: (
                Arc::clone(&self.inner),
                Arc::clone(&conn),
                Arc::clone(&holds),
                key,
            ),
        };
        tokio::spawn(async move {
            let mut c = conn.lock_owned().await;
            let outcome = beside(&inner, &mut c, &holds, key, lease, signal, fixed).await;
            if let Err(Ok(Beside::Granted { id, .. })) = tx.send(outcome) {
                // Nobody took the read: give it back, keeping the write.
                holds.leave(id);
                let unlock = &inner.sql.advisory_unlock_one[AdvisoryMode::Shared.index()];
                if !c.unlock_one(unlock, key).await {
                    tracing::debug!(lock = %name, "could not give back the read of a dropped downgrade; its session is closed");
                    close_and_lose(&mut c, &holds);
                }
            }
        });
        let answered = match answer.rx.as_mut() {
            Some(rx) => rx.await,
            None => return Err(self.err("downgrade")(sqlx::Error::PoolClosed)),
        };
        answer.rx = None;
        match answered {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(e)) => Err(self.err("downgrade")(e)),
            Err(_) => Err(Error::Backend {
                backend: self.inner.backend,
                message: "the downgrade's task ended without an answer".into(),
                retryable: true,
                source: None,
            }),
        }
    }

    /// The backend pid of a pinned session.
    async fn backend_pid(&self, conn: &mut Pinned) -> Result<u64> {
        let row = query(&self.inner.sql.connection_id)
            .fetch_one(conn.get()?)
            .await
            .map_err(self.err("connection id"))?;
        Ok(u64::try_from(row.int(0).map_err(self.err("connection id"))?).unwrap_or(0))
    }

    /// Starts a for-update hold's server-side lease on its connection after a wait, and
    /// returns when the statement was sent: the client's lease runs from there, before the
    /// server starts counting idle time. Called right after the grant (the wait had set a
    /// lease too, so the row is never without one); [`fence_held`](Self::fence_held)
    /// follows.
    pub(crate) async fn start_lease(&self, conn: &mut Pinned) -> Result<Instant> {
        let sent = Instant::now();
        conn.renew(self.inner.hold_timeout(), self.lease)
            .await
            .map_err(self.err("set the hold's server-side lease"))?;
        Ok(sent)
    }

    /// Proves the holding connection (and so the row lock) is alive after the fence was
    /// taken on another connection, by setting its lease again: to `left`, what is left of
    /// the hold's lease.
    pub(crate) async fn confirm_lease(&self, conn: &mut Pinned, left: Duration) -> Result<()> {
        conn.renew(self.inner.hold_timeout(), left)
            .await
            .map_err(self.err("confirm the hold after its fence"))
    }

    /// The next fencing token of this name, committed on its own (a holder that dies cannot
    /// take its token back).
    pub(crate) async fn next_fence(&self) -> Result<u64> {
        let q = query(&self.inner.sql.next_fence).bind(self.key());
        let v = match self.inner.dialect {
            crate::Dialect::MySql => {
                let done = q
                    .execute(&self.inner.pool)
                    .await
                    .map_err(self.err("fence"))?;
                let id = done.last_insert_id.ok_or_else(|| self.missing_id())?;
                i64::try_from(id).map_err(|_| self.missing_id())?
            }
            crate::Dialect::Sqlite | crate::Dialect::Postgres => {
                let row = q
                    .fetch_one(&self.inner.pool)
                    .await
                    .map_err(self.err("fence"))?;
                row.int(0).map_err(self.err("fence"))?
            }
        };
        Ok(u64::try_from(v).unwrap_or(0))
    }
}

impl Attempt {
    /// A unique-insert token: the row id in the high bits, its takeovers in the low ones; an
    /// id too large to shift is an error, never a silently truncated token (review M4).
    fn token(&self, id: i64, takeovers: i64) -> Result<u64> {
        unique_insert_token(id, takeovers).ok_or_else(|| Error::Backend {
            backend: self.inner.backend,
            message: format!(
                "the row id {id} of lock {:?} no longer fits a fencing token",
                self.name
            ),
            retryable: false,
            source: None,
        })
    }
}

/// A unique-insert token from a row's id and takeovers, `None` if they do not fit (an id of
/// 2^44 or more, takeovers of 2^20 or more, or a negative value).
pub(crate) fn unique_insert_token(id: i64, takeovers: i64) -> Option<u64> {
    let id = u64::try_from(id).ok()?;
    let takeovers = u64::try_from(takeovers).ok()?;
    if id >= 1 << (64 - TAKEOVER_BITS) || takeovers >= 1 << TAKEOVER_BITS {
        return None;
    }
    Some((id << TAKEOVER_BITS) | takeovers)
}

/// How many seeds one call of [`seed_above`] may mint before it gives up.
const MAX_MINTS: u32 = 10_000;

/// Mints a new seed: a number never handed out before for these tables (an AUTO_INCREMENT
/// row, deleted again at once: the counter, not the row, remembers it).
async fn mint_seed(inner: &Inner, conn: &mut Conn) -> Result<i64> {
    let s = &inner.sql;
    let err = |e| from_sqlx(inner.backend, "seed", e);
    let q = query(&s.new_seed);
    let seed = match inner.dialect {
        crate::Dialect::MySql => {
            let done = q.execute(&mut *conn).await.map_err(err)?;
            done.last_insert_id
                .and_then(|id| i64::try_from(id).ok())
                .ok_or_else(|| Error::Backend {
                    backend: inner.backend,
                    message: "the database returned no id for a new seed".into(),
                    retryable: false,
                    source: None,
                })?
        }
        crate::Dialect::Sqlite | crate::Dialect::Postgres => {
            let row = q.fetch_one(&mut *conn).await.map_err(err)?;
            row.int(0).map_err(err)?
        }
    };
    if let Err(e) = query(&s.drop_seed).bind(seed).execute(&mut *conn).await {
        tracing::debug!(error = %e, "could not delete a used seed row");
    }
    Ok(seed)
}

/// The first version (`seed << 20`) of a new seed whose versions lie above `floor` (-1: any):
/// seeds are minted until one is. Each seed is a number never handed out before for these
/// tables, so its versions lie above those of every earlier seed as long as no row uses more
/// than 2^20 - 1 versions of one seed ([`Attempt::claim`] moves a row on before that); rows
/// of an older dlock, which counted from 0, are what `floor` is for.
pub(crate) async fn seed_above(inner: &Inner, conn: &mut Conn, floor: i64) -> Result<i64> {
    for _ in 0..MAX_MINTS {
        let seed = mint_seed(inner, conn).await?;
        let first = seeded(seed).ok_or_else(|| Error::Backend {
            backend: inner.backend,
            message: format!("the seed {seed} no longer fits a fencing token"),
            retryable: false,
            source: None,
        })?;
        if first > floor {
            return Ok(first);
        }
    }
    Err(Error::Backend {
        backend: inner.backend,
        message: format!(
            "{MAX_MINTS} seeds minted without passing version {floor}: the version was set by \
             hand far above what dlock hands out"
        ),
        retryable: false,
        source: None,
    })
}

/// The answer of a downgrade's task, until it is read: dropped unread, a read granted is
/// given back (in the background).
struct Unclaimed {
    rx: Option<tokio::sync::oneshot::Receiver<std::result::Result<Beside, sqlx::Error>>>,
    give_back: (Arc<Inner>, HoldingConnection, Arc<SessionHolds>, i32),
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        if let Ok(Ok(Beside::Granted { id, .. })) = rx.try_recv()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (inner, conn, holds, key) = self.give_back.clone();
            rt.spawn(release_advisory(
                inner,
                conn,
                holds,
                id,
                key,
                AdvisoryMode::Shared,
            ));
        }
    }
}

/// What a downgrade came to.
#[derive(Debug)]
pub(crate) enum Beside {
    /// The read, with its token, when its statement was sent, and its id in the session.
    Granted { token: u64, sent: Instant, id: u64 },
    /// The write's session is gone (released, lost or closed): the read is to be taken like
    /// any other.
    SessionGone,
    /// The name's key row is gone (deleted by hand): no token to give; the read was given
    /// back.
    KeyGone,
}

/// The statements of [`Attempt::advisory_beside`], on the write hold's session (locked).
async fn beside(
    inner: &Inner,
    c: &mut Pinned,
    holds: &SessionHolds,
    key: i32,
    lease: dlock_core::Lease,
    signal: HoldSignal,
    fixed: FixedEnd,
) -> std::result::Result<Beside, sqlx::Error> {
    let s = &inner.sql;
    if holds.is_closed() {
        return Ok(Beside::SessionGone);
    }
    let Some(conn) = c.conn.as_mut() else {
        return Ok(Beside::SessionGone);
    };
    // A session that holds the write gets the read at once; one that does not must not
    // wait here (it would hold up the write hold's renewals).
    let setup = query(&s.advisory_lock_timeout)
        .bind(BESIDE_WAIT_MS)
        .execute(&mut *conn)
        .await;
    let sent = Instant::now();
    let granted = match setup {
        Ok(_) => {
            query(&s.advisory_lock[AdvisoryMode::Shared.index()])
                .bind(i64::from(key))
                .fetch_one(&mut *conn)
                .await
        }
        Err(e) => Err(e),
    };
    let unlock = &s.advisory_unlock_one[AdvisoryMode::Shared.index()];
    let row = match granted {
        Ok(row) => row,
        // Busy after a short wait on the write's own session: most likely the token's UPDATE
        // waited on the name's row (another session taking a token), after the read was
        // granted in the same statement (a session's advisory lock outlives a failed
        // statement): it is given back. An error, not a read taken like any other, which
        // would wait behind this handle's own write.
        Err(e) if meaning(&e) == Meaning::Busy => {
            if !c.unlock_one(unlock, key).await {
                // Not granted (nothing to give back), or the session broke.
                if c.conn.is_none() {
                    close_and_lose(c, holds);
                }
            }
            return Err(e);
        }
        Err(e) => {
            // The session broke: so did every hold in it, the write included. The read is
            // taken like any other.
            close_and_lose(c, holds);
            tracing::debug!(error = %e, "the write's session broke during a downgrade");
            return Ok(Beside::SessionGone);
        }
    };
    let token = match optional_int(&row, 0) {
        Ok(token) => token.and_then(|t| u64::try_from(t).ok()),
        Err(e) => {
            close_and_lose(c, holds);
            return Err(e);
        }
    };
    let Some(token) = token else {
        // The name's row is gone: no token to give. The read is given back; the caller
        // forgets the key and fails retryably, as a first grant does.
        if !c.unlock_one(unlock, key).await {
            close_and_lose(c, holds);
        }
        return Ok(Beside::KeyGone);
    };
    if !lease.is_watchdog() {
        *fixed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(dlock_core::backend::later(sent, lease.ttl()));
    }
    let Some(id) = holds.join(signal, fixed, lease.ttl()) else {
        // Closed meanwhile (cannot happen under the session's lock, but a read must never
        // be handed out on a session nobody watches).
        if !c.unlock_one(unlock, key).await {
            close_and_lose(c, holds);
        }
        return Ok(Beside::SessionGone);
    };
    // The server-side lease covers the new read too (the session's was set for the write).
    let server = holds.server_lease(id, lease.ttl());
    if c.renew(&s.advisory_hold_timeout, server).await.is_err() {
        // `renew` closed the session, and with it every hold in it: the read was never handed
        // out, and is taken like any other.
        let _ = holds.leave(id);
        holds.lose(LossReason::ConnectionLost);
        holds.close();
        return Ok(Beside::SessionGone);
    }
    Ok(Beside::Granted { token, sent, id })
}

/// Closes a pinned session that broke or could not be put right, and marks every hold in it
/// lost: closing the connection ends every lock its session held.
fn close_and_lose(c: &mut Pinned, holds: &SessionHolds) {
    c.close();
    holds.lose(LossReason::ConnectionLost);
    holds.close();
}

/// How long a downgrade may wait on the write hold's session, in milliseconds: a session
/// that holds the write is granted the read at once.
const BESIDE_WAIT_MS: i64 = 1000;

/// A granted advisory lock: the session that holds it, its backend pid, the key, the token
/// taken with the grant, and when the granting statement was sent (the lease runs from there).
#[derive(Debug)]
pub(crate) struct AdvisoryGrant {
    pub(crate) conn: Pinned,
    pub(crate) pid: u64,
    pub(crate) key: i32,
    pub(crate) token: u64,
    pub(crate) sent: Instant,
}

/// Column `i` as an integer, `None` if it is NULL.
fn optional_int(row: &crate::db::Row, i: usize) -> std::result::Result<Option<i64>, sqlx::Error> {
    if row.is_null(i)? {
        Ok(None)
    } else {
        row.int(i).map(Some)
    }
}

/// The first version of seed `seed` (`seed << 20`), `None` if it does not fit a token.
fn seeded(seed: i64) -> Option<i64> {
    if !(0..1 << (63 - TAKEOVER_BITS)).contains(&seed) {
        return None;
    }
    Some(seed << TAKEOVER_BITS)
}

/// Whether claiming `version + 1` would leave `version`'s seed (its low 20 bits would wrap).
fn seed_used_up(version: i64) -> bool {
    version
        .checked_add(1)
        .is_none_or(|next| next & ((1 << TAKEOVER_BITS) - 1) == 0)
}

/// A for-update hold's lease as the server's `wait_timeout`: whole seconds, rounded up, within
/// the server's range (1 s to 365 days).
pub(crate) fn server_seconds(lease: Duration) -> i64 {
    let secs = lease
        .as_secs()
        .saturating_add(u64::from(lease.subsec_nanos() > 0));
    i64::try_from(secs.clamp(1, 31_536_000)).unwrap_or(31_536_000)
}

/// Kills connection `id` (from another connection, in the background) if dropped while armed:
/// a waiting `SELECT … FOR UPDATE` whose future was dropped would otherwise stay queued on the
/// server until its lock wait timeout, and could even be granted the row after its client
/// left. The whole connection, not its statement (see
/// [`Statements::kill_connection`](crate::sql::Statements::kill_connection)); the dropped
/// acquisition closes that connection anyway. Best effort: without a tokio runtime nothing is
/// sent, and a kill that fails is logged at debug level (the lock wait timeout then ends the
/// statement).
struct KillOnDrop(Option<(Arc<Inner>, u64)>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some((inner, id)) = self.0.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            if let Err(e) = query(&inner.sql.kill_connection(id))
                .execute(&inner.pool)
                .await
            {
                tracing::debug!(connection = id, error = %e, "could not kill a cancelled lock wait");
            }
        });
    }
}

/// A for-update row lock just granted, on its connection.
pub(crate) struct Granted {
    /// The connection whose transaction holds the row.
    pub(crate) conn: Pinned,
    /// The server's id of that connection.
    pub(crate) connection_id: u64,
    /// PostgreSQL: the id of the transaction that holds the row (0 elsewhere).
    pub(crate) transaction: i64,
    /// When the statement that set the hold's server-side lease and took the row without
    /// waiting was sent; `None` after a wait (the lease then starts with
    /// [`Attempt::start_lease`]).
    pub(crate) lease_sent: Option<Instant>,
}

/// A connection that must not go back to the pool with a lock or an open transaction: dropped
/// while it still holds its connection, it closes it (the server then rolls back and
/// releases). It goes back to the pool only when the session is clean: after a
/// [`free`](Self::free), an [`unlock`](Self::unlock) that released, or
/// [`busy`](Self::busy) at the deadline.
#[derive(Debug)]
pub(crate) struct Pinned {
    /// `None` once given back or closed.
    conn: Option<Conn>,
    /// It was closed (broken, or not to be trusted), not given back clean.
    closed: bool,
    /// The holds' [`watch`]er, until it starts (dropped with the connection before then, it
    /// never does).
    watcher: Option<Later>,
    /// The backend, for errors.
    backend: &'static str,
}

impl Pinned {
    /// A holding connection, watched from `period` on by `watcher`, made with a weak
    /// reference to the connection (it must not keep it alive).
    pub(crate) fn watched<W, F>(mut self, period: Duration, watcher: W) -> HoldingConnection
    where
        W: FnOnce(Weak<tokio::sync::Mutex<Self>>) -> F + Send + 'static,
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        Arc::new_cyclic(|me| {
            let me = Weak::clone(me);
            self.watcher = Some(spawn_at(from_now(period), move || watcher(me)));
            tokio::sync::Mutex::new(self)
        })
    }

    fn get(&mut self) -> Result<&mut Conn> {
        // A connection closed after a failed ROLLBACK (a reset): the database could not be
        // asked on it, and a new attempt gets another.
        self.conn.as_mut().ok_or_else(|| Error::Connection {
            backend: self.backend,
            message: "the connection of this acquisition broke".into(),
            source: None,
        })
    }

    async fn rollback(&mut self) {
        if let Some(c) = self.conn.as_mut()
            && query("ROLLBACK").execute(c).await.is_err()
        {
            self.close();
        }
    }

    /// Rolls back, puts the server's default idle timeout back (`reset`, in the same round
    /// trip) and returns the connection to the pool; closes it if that fails.
    async fn end(&mut self, reset: Option<&str>) {
        let Some(c) = self.conn.as_mut() else {
            return;
        };
        let ended = match reset {
            Some(reset) => c.batch(&format!("ROLLBACK; {reset}")).await.map(drop),
            None => query("ROLLBACK").execute(&mut *c).await.map(drop),
        };
        match ended {
            Ok(()) => self.return_to_pool(),
            Err(_) => self.close(),
        }
    }

    /// Puts the server's default idle timeout back on a connection going back to the pool
    /// (closes it if that fails).
    async fn reset_lease(&mut self, reset: &str) {
        if let Some(c) = self.conn.as_mut()
            && query(reset).execute(c).await.is_err()
        {
            self.close();
        }
    }

    /// After a busy try of a pinned lock: at the deadline, puts the session back (`reset`, if
    /// a waiting try set its server-side lease), returns it to the pool and says so (`true`);
    /// with less than a second left, pauses briefly before the next try (which does not wait
    /// on the server).
    async fn busy(&mut self, deadline: Deadline, reset: Option<&str>) -> bool {
        let now = Instant::now();
        match deadline.instant() {
            Some(d) if now >= d => {
                if let Some(reset) = reset {
                    self.reset_lease(reset).await;
                }
                self.return_to_pool();
                true
            }
            Some(d) if d - now < Duration::from_secs(1) => {
                tokio::time::sleep((d - now).min(Duration::from_millis(20))).await;
                false
            }
            _ => false,
        }
    }

    /// Returns a clean connection (no transaction open, no lock held) to the pool, where it
    /// may stay warm for the next lock.
    fn return_to_pool(&mut self) {
        if let Some(c) = self.conn.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                c.done();
            } else {
                std::mem::forget(c);
            }
        }
    }

    /// Ends the hold's transaction, which frees the row, and returns the connection to the
    /// pool with the server's default idle timeout: `reset` puts it back just before, in the
    /// same round trip (MySQL), or the end of the transaction does (PostgreSQL, whose lease
    /// is local to it). The transaction changed nothing, so it ends with ROLLBACK: PostgreSQL
    /// answers a COMMIT of a transaction that locked a row only once its write-ahead log is
    /// on disk (the row lock gave it a transaction id), a flush that keeps nothing and costs
    /// more than the rest of the cycle. An error means the ROLLBACK did not run (the server
    /// stops a request at its first failed statement) or its answer was lost; the
    /// connection is closed, and the server rolls back.
    pub(crate) async fn free(
        &mut self,
        reset: Option<&str>,
    ) -> std::result::Result<(), sqlx::Error> {
        let Some(c) = self.conn.as_mut() else {
            return Err(sqlx::Error::PoolClosed);
        };
        let ended = match reset {
            Some(reset) => c.batch(&format!("{reset}; ROLLBACK")).await.map(drop),
            None => query("ROLLBACK").execute(&mut *c).await.map(drop),
        };
        match ended {
            Ok(()) => {
                self.return_to_pool();
                Ok(())
            }
            Err(e) => {
                self.close();
                Err(e)
            }
        }
    }

    /// Releases an advisory lock (the statement also resets the session) and returns the
    /// connection to the pool; whether this session held the lock. A session that did not,
    /// or that fails, is closed (which frees whatever it holds).
    pub(crate) async fn unlock(&mut self, unlock: &str, key: i32) -> bool {
        let Some(c) = self.conn.as_mut() else {
            return false;
        };
        let released = match query(unlock).bind(i64::from(key)).fetch_one(&mut *c).await {
            Ok(row) => row.int(0).is_ok_and(|held| held == 1),
            Err(_) => false,
        };
        if released {
            self.return_to_pool();
        } else {
            self.close();
        }
        released
    }

    /// Releases one advisory lock of a session that keeps others (a write whose downgraded
    /// read lives on), and keeps the session: whether this session held the lock. A session
    /// that fails is closed (which frees whatever it holds).
    pub(crate) async fn unlock_one(&mut self, unlock: &str, key: i32) -> bool {
        let Some(c) = self.conn.as_mut() else {
            return false;
        };
        match query(unlock).bind(i64::from(key)).fetch_one(&mut *c).await {
            Ok(row) => row.int(0).is_ok_and(|held| held == 1),
            Err(_) => {
                self.close();
                false
            }
        }
    }

    /// Renews the hold: sets the server-side lease again (which also proves the connection,
    /// and so the row lock, is alive).
    pub(crate) async fn renew(
        &mut self,
        statement: &str,
        ttl: Duration,
    ) -> std::result::Result<(), sqlx::Error> {
        let Some(c) = self.conn.as_mut() else {
            return Err(sqlx::Error::PoolClosed);
        };
        match query(statement).bind(server_seconds(ttl)).execute(c).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.close();
                Err(e)
            }
        }
    }

    /// [`renew`](Self::renew) to `ttl`, as a check of the connection like [`ping`](Self::ping):
    /// bounded by `limit` and cancel safe (a connection that does not answer in time is
    /// closed). `None`: the connection is gone already.
    async fn renew_within(
        &mut self,
        statement: &str,
        ttl: Duration,
        limit: Duration,
    ) -> Option<bool> {
        let mut flight = ClosedUnlessReturned(Some(self.conn.take()?));
        let answered = match flight.0.as_mut() {
            Some(c) => {
                let q = query(statement).bind(server_seconds(ttl));
                tokio::time::timeout(limit, q.execute(c)).await
            }
            None => return None,
        };
        match answered {
            Ok(Ok(_)) => {
                self.conn = flight.0.take();
                Some(true)
            }
            Ok(Err(_)) | Err(_) => Some(false),
        }
    }

    /// Whether the connection still answers (`None`: it is gone already, released or closed).
    /// A connection that does not answer is closed.
    ///
    /// Bounded by `limit`: a connection that does not answer in time (a partition) is closed
    /// too, so nothing waits on the hold's mutex for longer. Cancel safe: the connection is
    /// out of `self` while the ping is in flight and is closed, not reused, if the ping is
    /// dropped (a ping's unread answer would otherwise be read by the next statement).
    async fn ping(&mut self, limit: Duration) -> Option<bool> {
        let mut flight = ClosedUnlessReturned(Some(self.conn.take()?));
        let answered = match flight.0.as_mut() {
            Some(c) => tokio::time::timeout(limit, c.ping()).await,
            None => return None,
        };
        match answered {
            Ok(Ok(())) => {
                self.conn = flight.0.take();
                Some(true)
            }
            // Dropping `flight` closes the connection.
            Ok(Err(_)) | Err(_) => Some(false),
        }
    }

    fn close(&mut self) {
        if let Some(mut c) = self.conn.take() {
            self.closed = true;
            c.close_on_drop();
            drop_connection(c);
        }
    }

    /// Whether the connection was closed (broken, or not to be trusted), rather than given
    /// back clean (released) or not taken yet.
    fn was_closed(&self) -> bool {
        self.closed
    }
}

/// A connection taken out of a [`Pinned`] for one call: closed when dropped, unless the call
/// finished and put it back.
pub(crate) struct ClosedUnlessReturned(pub(crate) Option<Conn>);

impl Drop for ClosedUnlessReturned {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            c.close_on_drop();
            drop_connection(c);
        }
    }
}

/// Drops a pool connection; without a tokio runtime (which the pool needs to take it back) it
/// is leaked instead, and the server frees what it held when the process exits.
fn drop_connection(c: Conn) {
    if tokio::runtime::Handle::try_current().is_ok() {
        drop(c);
    } else {
        std::mem::forget(c);
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.close();
    }
}

/// The connection a for-update hold lives in, shared with its [`watch`]er.
pub(crate) type HoldingConnection = Arc<tokio::sync::Mutex<Pinned>>;

/// The end of a for-update hold's fixed lease (`None` for a watchdog lease), shared with its
/// [`watch`]er, which has the server enforce it; moved by `extend`.
pub(crate) type FixedEnd = Arc<std::sync::Mutex<Option<Instant>>>;

fn fixed_end(end: &FixedEnd) -> Option<Instant> {
    *end.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The backend side of a SQL hold.
#[derive(Debug)]
pub(crate) enum SqlHold {
    UniqueInsert(Attempt),
    Optimistic(Attempt, u64),
    /// The row lock of one connection's transaction, the hold's loss signal, and its fixed
    /// lease's end.
    ForUpdate(Attempt, HoldingConnection, HoldSignal, FixedEnd),
    /// A PostgreSQL advisory lock of one session, the hold's loss signal, its fixed lease's
    /// end, and which lock of the session it is.
    Advisory(
        Attempt,
        HoldingConnection,
        HoldSignal,
        FixedEnd,
        AdvisoryLock,
    ),
}

/// How often a for-update hold's connection is checked between renewals: a tenth of the
/// lease, from 100 ms to 1 s.
pub(crate) fn watch_period(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// How long a ping of a holding connection may take: the lease (at least 100 ms). A
/// connection slower than that is treated as gone, and closed.
///
/// Not shorter: closing the connection ends the hold on the server, so a ping cut off early
/// turns a slow but live connection (a loaded machine, a slow network) into a lost lock, as
/// stress runs showed with a third of the lease. A check slower than
/// [`suspend_after`] suspends the holds meanwhile (`is_held()` is false), so nothing is vouched
/// for by a connection that does not answer (the server may have ended the session behind a
/// network that no longer carries the reset).
fn ping_limit(lease: Duration) -> Duration {
    lease.max(Duration::from_millis(100))
}

/// After how long an unanswered check suspends the holds of its connection: a third of the
/// lease (a renewal period), at least 100 ms.
fn suspend_after(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(100))
}

/// The holds that live in one pinned connection, for its [`watch`]er: one, or (PostgreSQL
/// advisory) a write hold and the reads downgraded beside it on the same session. Their
/// loss signals, so that a session found dead marks every hold in it lost, and their
/// fixed leases' ends, so that the server-side lease covers the one that ends last.
#[derive(Debug, Default)]
pub(crate) struct SessionHolds(std::sync::Mutex<Members>);

#[derive(Debug, Default)]
struct Members {
    next_id: u64,
    holds: Vec<Member>,
    /// The session was put back or closed: no hold may join it any more.
    closed: bool,
}

#[derive(Debug)]
struct Member {
    id: u64,
    signal: HoldSignal,
    fixed: FixedEnd,
    lease: Duration,
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

impl SessionHolds {
    fn members(&self) -> std::sync::MutexGuard<'_, Members> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a hold; returns its id in this session, `None` once the session is closed.
    pub(crate) fn join(&self, signal: HoldSignal, fixed: FixedEnd, lease: Duration) -> Option<u64> {
        let mut m = self.members();
        if m.closed {
            return None;
        }
        let id = m.next_id;
        m.next_id += 1;
        m.holds.push(Member {
            id,
            signal,
            fixed,
            lease,
        });
        Some(id)
    }

    /// Removes hold `id` (released or dropped): how many holds are left, `None` if `id` was
    /// not (or no longer) one of them.
    pub(crate) fn leave(&self, id: u64) -> Option<usize> {
        let mut m = self.members();
        let before = m.holds.len();
        m.holds.retain(|h| h.id != id);
        (m.holds.len() < before).then_some(m.holds.len())
    }

    /// No hold may join any more (the session was put back, closed or is not watched).
    pub(crate) fn close(&self) {
        self.members().closed = true;
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.members().closed
    }

    /// Whether hold `id` is still in the session (not released, not dropped).
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.members().holds.iter().any(|h| h.id == id)
    }

    /// Marks every hold of the session suspended (its connection is slow to answer: the
    /// holds cannot be vouched for until it does) or vouched for again.
    fn suspend(&self, suspended: bool) {
        for h in &self.members().holds {
            h.signal.set_suspended(suspended);
        }
    }

    /// Marks every hold of the session lost (its connection is gone, and with it every lock
    /// its session held).
    pub(crate) fn lose(&self, reason: LossReason) {
        for h in &self.members().holds {
            h.signal.mark_lost(reason);
        }
    }

    fn need(&self) -> Need {
        let mut m = self.members();
        let live = m.holds.iter().filter(|h| !h.signal.is_lost());
        let mut last: Option<Instant> = None;
        let mut any = false;
        for h in live {
            any = true;
            match fixed_end(&h.fixed) {
                None => return Need::Ping,
                Some(end) => last = Some(last.map_or(end, |l| l.max(end))),
            }
        }
        let need = match last {
            Some(end) => Need::Until(end.saturating_duration_since(Instant::now())),
            None if any => Need::Ping,
            None => Need::Nothing,
        };
        if matches!(need, Need::Nothing) || matches!(need, Need::Until(left) if left.is_zero()) {
            // The watcher ends: no hold may join a session nobody watches (closed under the
            // same lock a joining hold takes).
            m.closed = true;
        }
        need
    }

    /// The server-side lease to set when hold `id` extends its own to `ttl`: at least what
    /// the other holds of the session still need (their fixed lease's rest, or their whole
    /// lease if a watchdog renews it).
    pub(crate) fn server_lease(&self, id: u64, ttl: Duration) -> Duration {
        let now = Instant::now();
        self.members()
            .holds
            .iter()
            .filter(|h| h.id != id && !h.signal.is_lost())
            .map(|h| fixed_end(&h.fixed).map_or(h.lease, |end| end.saturating_duration_since(now)))
            .fold(ttl, Duration::max)
    }
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
/// Under fixed leases the check sets the server-side lease to what is left of the one that
/// ends last instead of pinging, so a holder paused just before its end loses the lock at
/// that end (rounded up to the server's whole seconds), not a whole lease after its last
/// ping.
pub(crate) async fn watch(
    conn: Weak<tokio::sync::Mutex<Pinned>>,
    holds: Arc<SessionHolds>,
    lease: Duration,
    hold_timeout: String,
) {
    watch_until_over(conn, &holds, lease, hold_timeout).await;
    // An unwatched session takes no new hold (a downgrade then takes its read elsewhere).
    holds.close();
}

async fn watch_until_over(
    conn: Weak<tokio::sync::Mutex<Pinned>>,
    holds: &SessionHolds,
    lease: Duration,
    hold_timeout: String,
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
            let need = holds.need();
            let alive = match need {
                Need::Nothing => None,
                Need::Ping => c.ping(ping_limit(lease)).await,
                // Over: the guards report it and the keepers release; the server-side lease
                // set last ends it at most a second later if nobody can.
                Need::Until(left) if left.is_zero() => None,
                Need::Until(left) => c.renew_within(&hold_timeout, left, ping_limit(lease)).await,
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
                holds.suspend(true);
                let done = check.await;
                if done.0 == Some(true) {
                    holds.suspend(false);
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
                holds.lose(LossReason::ConnectionLost);
                return;
            }
            // The connection is gone: given back clean (the holds were released), or closed
            // (a give-back or a release that failed), which ends every hold still in it.
            (None, _) => {
                if closed {
                    holds.lose(LossReason::ConnectionLost);
                }
                return;
            }
        }
    }
}

/// A PostgreSQL advisory hold's lock: its key, its mode, and the session's holds it is one
/// of (with its id there).
#[derive(Debug)]
pub(crate) struct AdvisoryLock {
    pub(crate) key: i32,
    pub(crate) mode: AdvisoryMode,
    pub(crate) session: Arc<SessionHolds>,
    pub(crate) id: u64,
}

impl SqlHold {
    fn attempt(&self) -> &Attempt {
        match self {
            Self::UniqueInsert(a)
            | Self::Optimistic(a, _)
            | Self::ForUpdate(a, _, _, _)
            | Self::Advisory(a, _, _, _, _) => a,
        }
    }

    pub(crate) fn name(&self) -> &LockName {
        &self.attempt().name
    }
}

#[async_trait]
impl Hold for SqlHold {
    async fn release(&self) -> Result<()> {
        let a = self.attempt();
        let released = match self {
            Self::UniqueInsert(a) => retry_once(|| a.unique_release()).await?,
            Self::Optimistic(a, v) => retry_once(|| a.optimistic_release(Some(*v))).await?,
            Self::ForUpdate(a, conn, _, _) => {
                a.inner.forget_holder(&a.name, &a.owner);
                let reset = a.inner.sql.reset_hold_timeout.as_deref();
                conn.lock().await.free(reset).await.is_ok()
            }
            Self::Advisory(a, conn, _, _, lock) => {
                a.inner.forget_holder(&a.name, &a.owner);
                // To its end even if this future is dropped (it then finishes in a task of its
                // own), under the session's lock: a release dropped half-way (and run again in
                // the background) must not unlock twice, since advisory locks are counted per
                // session, and a second unlock would take another hold's lock.
                finish_if_dropped(lock.release(a, conn)).await
            }
        };
        if released {
            Ok(())
        } else {
            Err(Error::lock_lost(&a.name))
        }
    }

    /// For-update asks the holding connection (a ping): the row lock lives as long as it does.
    async fn verify(&self) -> Result<bool> {
        let (Self::ForUpdate(_, conn, signal, _) | Self::Advisory(_, conn, signal, _, _)) = self
        else {
            return Ok(true);
        };
        let limit = ping_limit(self.attempt().lease);
        let alive = conn.lock().await.ping(limit).await == Some(true);
        if !alive {
            signal.mark_lost(LossReason::ConnectionLost);
            if let Self::Advisory(_, _, _, _, lock) = self {
                lock.session.lose(LossReason::ConnectionLost);
                lock.session.close();
            }
        }
        Ok(alive)
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let a = self.attempt();
        let held = match self {
            Self::UniqueInsert(a) => a.unique_renew(ttl).await?,
            Self::Optimistic(a, v) => a.optimistic_renew(*v, ttl).await?,
            // The server keeps the row lock while the connection lives, and keeps the
            // connection while it is idle no longer than its wait_timeout.
            Self::ForUpdate(a, conn, signal, fixed) | Self::Advisory(a, conn, signal, fixed, _) => {
                // One lock of the connection across the renewal and the new end (see `watch`).
                let mut c = conn.lock().await;
                let sent = Instant::now();
                // A session shared with other holds keeps what they need too.
                let server = match self {
                    Self::Advisory(_, _, _, _, lock) => lock.session.server_lease(lock.id, ttl),
                    _ => ttl,
                };
                let alive = c.renew(a.inner.hold_timeout(), server).await.is_ok();
                if !alive {
                    signal.mark_lost(LossReason::ConnectionLost);
                    if let Self::Advisory(_, _, _, _, lock) = self {
                        lock.session.lose(LossReason::ConnectionLost);
                        lock.session.close();
                    }
                } else if let Some(end) = fixed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_mut()
                {
                    // The watcher holds the server to the new end.
                    *end = dlock_core::backend::later(sent, ttl);
                }
                drop(c);
                alive
            }
        };
        if held {
            Ok(())
        } else {
            Err(Error::lock_lost(&a.name))
        }
    }
}

impl Drop for SqlHold {
    fn drop(&mut self) {
        if let Self::ForUpdate(a, _, _, _) | Self::Advisory(a, _, _, _, _) = self {
            a.inner.forget_holder(&a.name, &a.owner);
        }
        if let Self::Advisory(a, conn, _, _, lock) = self
            && lock.session.contains(lock.id)
        {
            // Dropped unreleased: a lost guard (the core releases only live ones when they are
            // dropped), or no runtime. Another hold may keep the session alive, so the lock is
            // given back now (once: a release that ran meanwhile finds the hold gone). Without
            // a runtime the session ends when its last hold is dropped.
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(lock.release(a, conn));
                }
                Err(_) => {
                    let _ = lock.session.leave(lock.id);
                }
            }
        }
    }
}

impl AdvisoryLock {
    /// The release of this hold, to run in a task of its own (see [`release_advisory`]).
    fn release(
        &self,
        a: &Attempt,
        conn: &HoldingConnection,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        release_advisory(
            Arc::clone(&a.inner),
            Arc::clone(conn),
            Arc::clone(&self.session),
            self.id,
            self.key,
            self.mode,
        )
    }
}

/// Releases advisory hold `id` of a session: unlocks only its lock while other holds live in
/// the session; the last one puts the session back. Whether the session held the lock; a hold
/// released already (a release dropped half-way and run again) unlocks nothing and is `true`.
async fn release_advisory(
    inner: Arc<Inner>,
    conn: HoldingConnection,
    holds: Arc<SessionHolds>,
    id: u64,
    key: i32,
    mode: AdvisoryMode,
) -> bool {
    let s = &inner.sql;
    let mut c = conn.lock_owned().await;
    match holds.leave(id) {
        None => true,
        Some(0) => {
            holds.close();
            c.unlock(&s.advisory_unlock[mode.index()], key).await
        }
        Some(_) => {
            let released = c
                .unlock_one(&s.advisory_unlock_one[mode.index()], key)
                .await;
            if c.conn.is_none() {
                // The session broke: the other holds in it are gone too.
                holds.lose(LossReason::ConnectionLost);
                holds.close();
            }
            released
        }
    }
}

/// Runs an owner-checked call, once more after a retryable failure (a dropped connection fails
/// the first call on it). "Not ours" on the second try may mean the first one did it.
async fn retry_once<F, Fut>(call: F) -> Result<bool>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    match call().await {
        Err(e) if e.is_retryable() => call().await.map(|_| true),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_insert_tokens_never_truncate() {
        assert_eq!(unique_insert_token(1, 0), Some(1 << 20));
        assert_eq!(unique_insert_token(3, 5), Some((3 << 20) | 5));
        assert_eq!(
            unique_insert_token((1 << 44) - 1, (1 << 20) - 1),
            Some(u64::MAX)
        );
        assert_eq!(unique_insert_token(1 << 44, 0), None);
        assert_eq!(unique_insert_token(1, 1 << 20), None);
        assert_eq!(unique_insert_token(-1, 0), None);
        assert_eq!(unique_insert_token(1, -1), None);
    }

    #[test]
    fn optimistic_seeds_leave_room_and_never_overflow() {
        assert_eq!(seeded(0), Some(0));
        assert_eq!(seeded(3), Some(3 << 20));
        assert_eq!(seeded((1 << 43) - 1), Some(((1 << 43) - 1) << 20));
        assert_eq!(seeded(1 << 43), None);
        assert_eq!(seeded(-1), None);
        assert!(!seed_used_up(0));
        assert!(!seed_used_up((3 << 20) + 5));
        assert!(seed_used_up((1 << 20) - 1));
        assert!(seed_used_up((4 << 20) - 1));
        assert!(seed_used_up(i64::MAX));
    }

    #[test]
    fn server_lease_rounds_up_within_the_servers_range() {
        assert_eq!(server_seconds(Duration::ZERO), 1);
        assert_eq!(server_seconds(Duration::from_millis(800)), 1);
        assert_eq!(server_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(server_seconds(Duration::from_secs(30)), 30);
        assert_eq!(server_seconds(Duration::MAX), 31_536_000);
    }

    /// The for-update first try is not prepared: the name goes in as hexadecimal digits, so
    /// no name (quotes, backslashes, comment marks, any byte) can end its literal.
    #[test]
    fn a_first_try_spells_the_name_in_hex_digits() {
        use crate::config::Dialect;
        use crate::sql::Statements;

        let name = "a'; DROP TABLE t; -- \\ \" é";
        let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
        let pg = Statements::new(Dialect::Postgres, "dlock_t", false, "o");
        let batch = pg.lock_row_first_try(name.as_bytes(), 30);
        assert_eq!(
            batch,
            format!(
                "BEGIN; SET LOCAL idle_in_transaction_session_timeout = 30000; \
                 SELECT pg_backend_pid()::BIGINT, txid_current() FROM dlock_t_rows \
                 WHERE name = decode('{hex}', 'hex') FOR UPDATE NOWAIT"
            )
        );
        let my = Statements::new(Dialect::MySql, "dlock_t", true, "o");
        assert_eq!(
            my.lock_row_first_try(name.as_bytes(), 31_536_000),
            format!(
                "SET SESSION wait_timeout = 31536000; SELECT CONNECTION_ID(), 0 \
                 FROM dlock_t_rows WHERE name = X'{hex}' FOR UPDATE NOWAIT"
            )
        );
        // The longest lease still fits PostgreSQL's milliseconds.
        assert!(
            pg.lock_row_first_try(b"n", 31_536_000)
                .contains("idle_in_transaction_session_timeout = 2147483647;")
        );
    }

    /// A PostgreSQL for-update provider on tables of its own and a new name, or `None`
    /// without a server; and the helpers of the fence cases below.
    #[cfg(feature = "postgres")]
    async fn pg_for_update(table: &str) -> Option<(crate::SqlProvider, LockName)> {
        let url = dlock_conformance::service_url("DLOCK_POSTGRES_URL")?;
        let provider =
            crate::SqlProvider::connect(&format!("{url}?strategy=for-update&table={table}"))
                .await
                .expect("provider");
        let name = LockName::new(format!("{table}/{}", uuid::Uuid::new_v4())).expect("name");
        Some((provider, name))
    }

    /// A for-update grant of `name` through `provider`, with its attempt.
    #[cfg(feature = "postgres")]
    async fn pg_grant(
        provider: &crate::SqlProvider,
        name: &LockName,
        lease: Duration,
    ) -> (Attempt, Granted) {
        let a = Attempt {
            inner: Arc::clone(&provider.inner),
            name: name.clone(),
            owner: provider.inner.next_owner(),
            lease,
        };
        let granted = a
            .for_update(Deadline::after(Duration::from_secs(10)))
            .await
            .expect("try")
            .expect("the lock is free");
        (a, granted)
    }

    /// The fault: ends server session `pid`, and waits (up to 10 s, on the server) until it
    /// is gone, so its transaction is over. PostgreSQL 14+.
    #[cfg(feature = "postgres")]
    async fn pg_terminate(provider: &crate::SqlProvider, pid: i64) {
        let ended = query("SELECT pg_terminate_backend($1::INTEGER, 10000)::INTEGER")
            .bind(pid)
            .fetch_one(&provider.inner.pool)
            .await
            .expect("terminate")
            .int(0)
            .expect("answer");
        assert_eq!(ended, 1, "the holder's session did not end");
    }

    /// A for-update grant whose connection ends before its fencing token is taken gets no
    /// token (review M5: another holder may have taken the row and a token meanwhile, and a
    /// token above the real holder's must never be handed out). On PostgreSQL the statement
    /// that takes the token checks that the holder's transaction still runs; without that
    /// check this case gets a token for a grant that is gone. (PostgreSQL 14+: the wait for
    /// the end of the terminated session.)
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn a_grant_whose_connection_ended_gets_no_fencing_token()
    -> Result<(), Box<dyn std::error::Error>> {
        let Some((provider, name)) = pg_for_update("dlock_fence_held").await else {
            return Ok(());
        };
        let lease = Duration::from_secs(30);

        // A live grant gets its token.
        let (a, mut granted) = pg_grant(&provider, &name, lease).await;
        let first = a.fence_held(&mut granted, || lease).await.expect("fence");
        granted.conn.free(None).await?;

        // The granted connection is ended before the token is taken.
        let (b, mut granted) = pg_grant(&provider, &name, lease).await;
        pg_terminate(
            &provider,
            i64::try_from(granted.connection_id).expect("pid"),
        )
        .await;
        let refused = b.fence_held(&mut granted, || lease).await;
        assert!(
            refused.is_err(),
            "a grant whose connection ended got the token {refused:?}"
        );

        // The next holder gets the next token: the refused grant took none.
        let (c, mut granted) = pg_grant(&provider, &name, lease).await;
        let next = c.fence_held(&mut granted, || lease).await.expect("fence");
        assert_eq!(next, first + 1);
        granted.conn.free(None).await?;
        Ok(())
    }

    /// Review of the above (F1): the check of the holder at the start of the token's
    /// statement can go stale while that statement waits for the fence row (another
    /// token being taken): the holder may end meanwhile, and another holder take the row and
    /// its own token first. The statement asks again once it has the fence row. The fault:
    /// the fence row is held by an open transaction while the token is asked for, and the
    /// holder's session is ended during that wait. Without the second check the statement
    /// hands out a token above the real holder's.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn a_holder_that_ends_while_its_token_waits_gets_none()
    -> Result<(), Box<dyn std::error::Error>> {
        let Some((provider, name)) = pg_for_update("dlock_fence_wait").await else {
            return Ok(());
        };
        let inner = &provider.inner;
        let lease = Duration::from_secs(30);
        // The name's fence row exists.
        let (a, mut granted) = pg_grant(&provider, &name, lease).await;
        a.fence_held(&mut granted, || lease).await.expect("fence");
        granted.conn.free(None).await?;

        // Another token being taken holds the fence row.
        let mut blocker = inner.pool.acquire().await.expect("connection");
        query("BEGIN").execute(&mut blocker).await.expect("begin");
        query("UPDATE dlock_fence_wait_fence SET token = token WHERE name = $1")
            .bind(name.as_str().as_bytes())
            .execute(&mut blocker)
            .await
            .expect("lock the fence row");

        // The holder asks for its token; the statement waits for the fence row.
        let (_b, granted) = pg_grant(&provider, &name, lease).await;
        let mut fencer = inner.pool.acquire().await.expect("connection");
        query("SET lock_timeout = '60s'")
            .execute(&mut fencer)
            .await
            .expect("lock wait");
        let fencer_pid = query("SELECT pg_backend_pid()::BIGINT")
            .fetch_one(&mut fencer)
            .await
            .expect("pid")
            .int(0)
            .expect("pid");
        let statement = inner.sql.next_fence_held.clone();
        let key = name.as_str().as_bytes().to_vec();
        let (transaction, pid) = (
            granted.transaction,
            i64::try_from(granted.connection_id).expect("pid"),
        );
        let token = tokio::spawn(async move {
            let row = query(&statement)
                .bind(key.as_slice())
                .bind(transaction)
                .bind(pid)
                .fetch_optional(&mut fencer)
                .await;
            row.map(|r| r.map(|r| r.int(0)))
        });
        dlock_conformance::eventually(
            Duration::from_secs(10),
            "the token's statement waits for the fence row",
            || async {
                let waits =
                    query("SELECT COUNT(*) FROM pg_locks WHERE pid = $1::INTEGER AND NOT granted")
                        .bind(fencer_pid)
                        .fetch_one(&inner.pool)
                        .await
                        .map_err(|e| e.to_string())?
                        .int(0)
                        .map_err(|e| e.to_string())?;
                if waits > 0 {
                    Ok(())
                } else {
                    Err("not waiting yet".to_owned())
                }
            },
        )
        .await;

        // The holder's session ends while its token waits.
        pg_terminate(&provider, pid).await;
        query("COMMIT").execute(&mut blocker).await.expect("commit");
        let got = token.await.expect("task").expect("statement");
        assert!(
            got.is_none(),
            "a holder that ended while its token waited got the token {got:?}"
        );
        drop(granted);
        Ok(())
    }

    /// The kill of a dropped waiter may reach the server before the waiting statement does
    /// (the client wrote the statement, then its future was dropped): it then finds the
    /// session idle. A cancel of the statement (`KILL QUERY`, `pg_cancel_backend`) was lost
    /// there, and the statement that came next waited for the row its whole lock timeout, on
    /// a session nobody reads. Killing the connection leaves nothing to run it.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    async fn a_kill_before_its_statement_still_stops_it(url: &str, set_lock_wait: &str) {
        use dlock_core::{LockOptions, LockProvider};

        let provider = crate::SqlProvider::connect(&format!(
            "{url}?strategy=for-update&table=dlock_kill_first"
        ))
        .await
        .expect("provider");
        let inner = &provider.inner;
        let name = format!("kill-first/{}", uuid::Uuid::new_v4());
        let holder = provider
            .lock(&name, LockOptions::default())
            .expect("lock")
            .try_acquire(Duration::from_secs(5))
            .await
            .expect("acquire")
            .expect("a new name is free");
        let lock_pool = inner.lock_pool.as_ref().unwrap_or(&inner.pool);
        let mut waiter = lock_pool.acquire().await.expect("connection");
        query(set_lock_wait)
            .execute(&mut waiter)
            .await
            .expect("lock wait");
        let id = query(&inner.sql.connection_id)
            .fetch_one(&mut waiter)
            .await
            .expect("connection id")
            .int(0)
            .expect("id");
        let id = u64::try_from(id).expect("id");
        query(&inner.sql.kill_connection(id))
            .execute(&inner.pool)
            .await
            .expect("kill");
        let waited = query(&inner.sql.lock_row)
            .bind(name.as_bytes())
            .fetch_optional(&mut waiter)
            .await;
        waiter.close_on_drop();
        match waited {
            Err(e) => assert!(
                meaning(&e) != Meaning::Busy,
                "the statement after the kill waited for the held row: {e}"
            ),
            Ok(_) => panic!("the statement after the kill was granted a held row"),
        }
        holder.release().await.expect("release");
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn a_kill_before_its_statement_still_stops_it_on_postgres() {
        let Some(url) = dlock_conformance::service_url("DLOCK_POSTGRES_URL") else {
            return;
        };
        a_kill_before_its_statement_still_stops_it(&url, "SET lock_timeout = '3s'").await;
    }

    #[cfg(feature = "mysql")]
    #[tokio::test]
    async fn a_kill_before_its_statement_still_stops_it_on_mysql() {
        let Some(url) = dlock_conformance::service_url("DLOCK_MYSQL_URL") else {
            return;
        };
        a_kill_before_its_statement_still_stops_it(
            &url,
            "SET SESSION innodb_lock_wait_timeout = 3",
        )
        .await;
    }

    /// An acquirer that stops between its first try on a new name and the rollback after it
    /// (a process paused there, or cut off) must not keep other new names from being
    /// created. Under MySQL's default REPEATABLE READ, that try left a gap lock which
    /// blocked the first insert of every name sorting next to it, until the server dropped
    /// the connection (its default `wait_timeout` is 8 hours): this case's acquire of another
    /// new name then timed out.
    #[cfg(feature = "mysql")]
    #[tokio::test]
    async fn a_stalled_first_try_blocks_no_other_new_name() {
        use dlock_core::{LockOptions, LockProvider};

        let Some(url) = dlock_conformance::service_url("DLOCK_MYSQL_URL") else {
            return;
        };
        let provider =
            crate::SqlProvider::connect(&format!("{url}?strategy=for-update&table=dlock_stalled"))
                .await
                .expect("provider");
        let inner = &provider.inner;
        let prefix = format!("stalled/{}", uuid::Uuid::new_v4());
        // The stalled acquirer: its first try on a name without a row, on a connection of the
        // provider's own lock pool, and nothing after it.
        let lock_pool = inner.lock_pool.as_ref().expect("a for-update lock pool");
        let mut stalled = lock_pool.acquire().await.expect("connection");
        let stalled_name = format!("{prefix}/a");
        let found = query(&inner.sql.lock_row_nowait)
            .bind(stalled_name.as_bytes())
            .fetch_optional(&mut stalled)
            .await
            .expect("first try");
        assert!(found.is_none(), "the name has no row yet");
        // Another new name, sorting right after it.
        let other = provider
            .lock(&format!("{prefix}/b"), LockOptions::default())
            .expect("lock");
        let guard = other
            .try_acquire(Duration::from_secs(5))
            .await
            .expect("acquire");
        assert!(
            guard.is_some(),
            "a free new name was not acquired while another acquirer stalled next to it"
        );
        query("ROLLBACK")
            .execute(&mut stalled)
            .await
            .expect("rollback");
    }
}
