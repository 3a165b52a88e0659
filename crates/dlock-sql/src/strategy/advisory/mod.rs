//! advisory (PostgreSQL 14+): a pinned session holds `pg_advisory_lock` on the key the name
//! is given once in `<prefix>_names` (never a hash, so two names never share one); readers
//! share it, a writer or a mutex takes it alone. The fencing token is taken in the granting
//! statement; the session's `idle_session_timeout` is the lease.

use std::sync::Arc;

use dlock_core::backend::{Deadline, cleanup, finish_if_dropped, later};
use dlock_core::{Error, LockKind, LockName, LockStatus, LossReason, Result, async_trait};
use tokio::time::Instant;

use super::{Attempt, Grant, LockStrategy, NameCache, missing_id, read_row};
use crate::Inner;
use crate::db::{Conn, Pool, query};
use crate::error::{Meaning, meaning};
use crate::pinned::session::Membership;
use crate::pinned::{
    Held, HoldingConnection, Pinned, PinnedHold, Pinning, Release, Session, Waits, server_seconds,
    server_wait,
};
use crate::sql::{AdvisoryMode, AdvisorySql, Tables};

mod downgrade;

pub(crate) use downgrade::WriteSession;

/// The advisory strategy of one provider.
#[derive(Debug)]
pub(crate) struct Advisory {
    sql: AdvisorySql,
    pinning: Pinning,
    /// The key of each name seen (a name's key never changes).
    keys: NameCache<i32>,
    /// The database the keys are in, once asked (locks in the caller's transaction must be
    /// taken in it).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    database: std::sync::OnceLock<String>,
}

/// An advisory lock just granted: its hold, its token, and when the granting statement was
/// sent (the lease runs from there).
#[derive(Debug)]
pub(crate) struct AdvisoryGrant {
    pub(crate) hold: AdvisoryHold,
    pub(crate) token: u64,
    pub(crate) sent: Instant,
}

impl AdvisoryGrant {
    pub(crate) fn into_grant(self) -> Grant {
        let signal = self.hold.pinned.signal.clone();
        Grant {
            hold: Arc::new(self.hold),
            token: self.token,
            sent: self.sent,
            signal: Some(signal),
        }
    }
}

/// An advisory hold: one lock of its session (a session may hold a write and the reads
/// downgraded beside it).
pub(crate) type AdvisoryHold = Held<Unlock>;

/// An advisory hold is given back by unlocking its key in `mode`.
#[derive(Debug)]
pub(crate) struct Unlock {
    strategy: Arc<Advisory>,
    key: i32,
    mode: AdvisoryMode,
}

#[async_trait]
impl LockStrategy for Advisory {
    async fn try_lock(
        self: Arc<Self>,
        attempt: Attempt,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        let granted = self
            .acquire(attempt, deadline, AdvisoryMode::Exclusive)
            .await?;
        Ok(granted.map(AdvisoryGrant::into_grant))
    }

    async fn describe(&self, name: &LockName) -> Result<LockStatus> {
        let s = &self.sql;
        let err = self.pinning.inner.err("describe");
        let token = match read_row(&self.pinning.inner, &s.token, name, "describe").await? {
            Some(row) => u64::try_from(row.int(0).map_err(err)?)
                .ok()
                .filter(|t| *t > 0),
            None => None,
        };
        let held = match self.keys.get(name) {
            Some(k) => Some(k),
            None => match read_row(&self.pinning.inner, &s.key, name, "describe").await? {
                Some(row) => i32::try_from(row.int(0).map_err(err)?).ok(),
                None => None,
            },
        };
        // Who holds it is the lock manager's to say (pg_locks), without taking it.
        let (holds, shared) = match held {
            Some(k) => {
                let row = query(&s.holders)
                    .bind(i64::from(k))
                    .fetch_one(&self.pinning.inner.pool)
                    .await
                    .map_err(err)?;
                (row.int(0).map_err(err)?, row.int(1).map_err(err)?)
            }
            None => (0, 0),
        };
        // Only shared locks: readers. An exclusive one is a mutex's or a writer's (the
        // server cannot tell them apart), said the mutex's way.
        let kind = if holds > 0 && shared == holds {
            LockKind::Read
        } else {
            LockKind::Mutex
        };
        if holds > 0 {
            Ok(LockStatus::held_by(kind, Vec::new()).with_last_token(token))
        } else {
            Ok(LockStatus::free(token))
        }
    }

    fn holder_connection_id(&self, name: &str) -> Option<u64> {
        self.pinning.holder_connection_id(name)
    }

    fn advisory(self: Arc<Self>) -> Option<Arc<Advisory>> {
        Some(self)
    }
}

#[async_trait]
impl Release for Unlock {
    async fn release(&self, hold: &PinnedHold) -> bool {
        // To its end even if this future is dropped (it then finishes in a task of its own),
        // under the session's lock: a release dropped half-way (and run again in the
        // background) must not unlock twice, since advisory locks are counted per session,
        // and a second unlock would take another hold's lock.
        finish_if_dropped(self.task(hold)).await
    }

    fn dropped(&self, hold: &PinnedHold) {
        if !hold.membership.is_member() {
            return;
        }
        // Dropped unreleased: a lost guard (the core releases only live ones when they are
        // dropped), or no runtime. Another hold may keep the session alive, so the lock is
        // given back now (once: a release that ran meanwhile finds the hold gone). Without a
        // runtime the session ends when its last hold is dropped.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(cleanup(self.task(hold)))),
            Err(_) => {
                let _ = hold.session.leave(&hold.membership);
            }
        }
    }
}

impl Unlock {
    /// The release of `hold`, to run in a task of its own (see [`release`]).
    fn task(&self, hold: &PinnedHold) -> impl Future<Output = bool> + Send + 'static {
        release(
            Arc::clone(&self.strategy),
            Arc::clone(&hold.conn),
            hold.session.clone(),
            Arc::clone(&hold.membership),
            self.key,
            self.mode,
        )
    }
}

/// Releases the advisory hold of `membership` in `session`: unlocks only its lock while
/// other holds live in the session; the last one puts the session back. Whether the session
/// held the lock; a hold released already (a release dropped half-way and run again)
/// unlocks nothing and is `true`.
async fn release(
    strategy: Arc<Advisory>,
    conn: HoldingConnection,
    session: Session,
    membership: Arc<Membership>,
    key: i32,
    mode: AdvisoryMode,
) -> bool {
    let s = &strategy.sql;
    let mut c = conn.lock_owned().await;
    match session.leave(&membership) {
        None => true,
        Some(0) => {
            session.close();
            c.unlock(&s.unlock[mode.index()], key).await
        }
        Some(_) => {
            let released = c.unlock_one(&s.unlock_one[mode.index()], key).await;
            if c.is_gone() {
                // The session broke: the other holds in it are gone too.
                session.lose(LossReason::ConnectionLost);
            }
            released
        }
    }
}

impl Advisory {
    pub(crate) fn new(inner: Arc<Inner>, tables: Tables<'_>) -> Self {
        let sql = AdvisorySql::new(tables);
        let pinning = Pinning::new(inner, &sql.hold_timeout);
        Self {
            sql,
            pinning,
            keys: NameCache::new(),
            database: std::sync::OnceLock::new(),
        }
    }

    /// The advisory key of `name`: its number in `<prefix>_names`, given on first use.
    async fn key(&self, name: &LockName) -> Result<i32> {
        self.key_on(&self.pinning.inner.pool, name).await
    }

    /// [`key`](Self::key), asked on `pool`'s connections.
    pub(crate) async fn key_on(&self, pool: &Pool, name: &LockName) -> Result<i32> {
        if let Some(key) = self.keys.get(name) {
            return Ok(key);
        }
        let s = &self.sql;
        let inner = &self.pinning.inner;
        let bytes = name.as_str().as_bytes();
        let read = || async {
            let row = query(&s.key)
                .bind(bytes)
                .fetch_optional(pool)
                .await
                .map_err(inner.err("read the advisory key"))?;
            match row {
                Some(row) => row
                    .int(0)
                    .map(Some)
                    .map_err(inner.err("read the advisory key")),
                None => Ok(None),
            }
        };
        let id = match read().await? {
            Some(id) => id,
            None => {
                query(&s.new_key)
                    .bind(bytes)
                    .bind(bytes)
                    .execute(pool)
                    .await
                    .map_err(inner.err("give the name an advisory key"))?;
                read()
                    .await?
                    .ok_or_else(|| missing_id(inner.backend, name))?
            }
        };
        let key = i32::try_from(id).map_err(|_| missing_id(inner.backend, name))?;
        self.keys.remember(name, key);
        Ok(key)
    }

    /// The next fencing token of `name` (advisory key `key`), taken on `pool` and committed
    /// on its own: a lock in the caller's transaction takes its token this way, so that a
    /// rollback of the transaction cannot take it back.
    #[cfg(feature = "postgres")]
    pub(crate) async fn next_token(&self, pool: &Pool, name: &LockName, key: i32) -> Result<u64> {
        let inner = &self.pinning.inner;
        let row = query(&self.sql.next_token)
            .bind(i64::from(key))
            .fetch_optional(pool)
            .await
            .map_err(inner.err("fence"))?;
        let Some(row) = row else {
            // The name's row was deleted by hand.
            return Err(self.key_gone(name));
        };
        let token = row.int(0).map_err(inner.err("fence"))?;
        u64::try_from(token).map_err(|_| missing_id(inner.backend, name))
    }

    /// The name of the database the locks are in, asked once on `pool`.
    #[cfg(feature = "postgres")]
    pub(crate) async fn database(&self, pool: &Pool) -> Result<&str> {
        if let Some(name) = self.database.get() {
            return Ok(name);
        }
        let err = self.pinning.inner.err("read the database's name");
        let name = query("SELECT current_database()::TEXT")
            .fetch_one(pool)
            .await
            .map_err(err)?
            .text(0)
            .map_err(err)?;
        Ok(self.database.get_or_init(|| name))
    }

    /// The statements of locks in the caller's transaction: (wait for the key's lock, try
    /// it without waiting).
    #[cfg(feature = "postgres")]
    pub(crate) fn in_transaction_sql(&self) -> (&str, &str) {
        (&self.sql.xact_lock, &self.sql.try_xact_lock)
    }

    /// The key of `name` vanished (its row was deleted by hand): it gets a key again on its
    /// next grant, and this attempt fails, retryably.
    fn key_gone(&self, name: &LockName) -> Error {
        self.keys.forget(name);
        Error::backend_failed(
            self.pinning.inner.backend,
            format!("the advisory key of {:?} vanished", name.as_str()),
            true,
        )
    }

    /// Takes the advisory lock of `attempt`'s name in `mode` on a session of its own,
    /// waiting until `deadline`, with its fencing token taken in the granting statement.
    ///
    /// The hold's lease is the server's: the session's `idle_session_timeout` is set with the
    /// grant (in the statement that takes the lock, or before a waiting one), so a holder
    /// that stops talking (paused, cut off) is disconnected and its lock freed. The session
    /// of a waiting statement is ended (`pg_terminate_backend` from another connection) if
    /// the acquisition is dropped: nothing it might have been granted outlives it.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        a: Attempt,
        deadline: Deadline,
        mode: AdvisoryMode,
    ) -> Result<Option<AdvisoryGrant>> {
        let key = self.key(&a.name).await?;
        let s = &self.sql;
        let mut conn = self.pinning.pin(&a.name, deadline).await?;
        let lease = server_seconds(a.ttl());
        let mut first = true;
        let mut lease_set = false;
        // Every try that does not wait reports the session's backend pid, so a waiting try
        // asks for it only on a session that has not tried yet.
        let mut waits = Waits::default();
        loop {
            let sent;
            // (token, pid) of a grant; `None` while the lock is busy.
            let granted = if let Some(wait) = server_wait(std::mem::take(&mut first), deadline) {
                lease_set = true;
                query(&s.wait)
                    .bind(wait)
                    .bind(lease)
                    .execute(conn.get()?)
                    .await
                    .map_err(self.pinning.inner.err("set the lock wait"))?;
                let lock = async |c: &mut Conn| {
                    query(&s.lock[mode.index()])
                        .bind(i64::from(key))
                        .fetch_one(c)
                        .await
                };
                let (pid, locked) = waits.run(&self.pinning, &mut conn, lock).await?;
                match locked {
                    Ok(row) => {
                        let token = row
                            .optional_int(0)
                            .map_err(self.pinning.inner.err("lock"))?;
                        // The statement may have waited long: the lease runs from after it
                        // (as the server's idle time does), not from when it was sent.
                        sent = self.pinning.start_lease(&mut conn, a.ttl()).await?;
                        Some((token, pid))
                    }
                    Err(e) => {
                        // The session may hold the lock all the same (a lock timeout at the
                        // moment of the grant, or the token's UPDATE failing after it): it is
                        // closed, never reused or returned to the pool.
                        conn.close();
                        if meaning(&e) != Meaning::Busy {
                            return Err(self.pinning.inner.err("lock")(e));
                        }
                        if deadline.has_passed() {
                            return Ok(None);
                        }
                        conn = self.pinning.pin(&a.name, deadline).await?;
                        waits.new_connection();
                        continue;
                    }
                }
            } else {
                sent = Instant::now();
                let row = query(&s.try_lock[mode.index()])
                    .bind(i64::from(key))
                    .bind(lease)
                    .fetch_one(conn.get()?)
                    .await
                    .map_err(self.pinning.inner.err("lock"))?;
                let pid =
                    u64::try_from(row.int(2).map_err(self.pinning.inner.err("lock"))?).unwrap_or(0);
                waits.session_is(pid);
                // The second column is the lease set on a grant, NULL while the lock is busy.
                if row.is_null(1).map_err(self.pinning.inner.err("lock"))? {
                    None
                } else {
                    Some((
                        row.optional_int(0)
                            .map_err(self.pinning.inner.err("lock"))?,
                        pid,
                    ))
                }
            };
            match granted {
                Some((Some(token), pid)) => {
                    let token = u64::try_from(token)
                        .map_err(|_| missing_id(self.pinning.inner.backend, &a.name))?;
                    return self.granted(conn, a, pid, key, mode, token, sent).map(Some);
                }
                Some((None, _)) => {
                    // Granted, but the name's row is gone (deleted by hand): no token to give.
                    // Closing the session frees the lock; the next try gives the name a key.
                    drop(conn);
                    return Err(self.key_gone(&a.name));
                }
                None => {}
            }
            if conn
                .busy(deadline, lease_set.then_some(s.reset.as_str()))
                .await
            {
                return Ok(None);
            }
        }
    }

    /// The hold of a session just granted the lock of `key` in `mode` (server session
    /// `pid`), with its token and when the granting statement was sent.
    #[allow(clippy::too_many_arguments)]
    fn granted(
        self: &Arc<Self>,
        conn: Pinned,
        a: Attempt,
        pid: u64,
        key: i32,
        mode: AdvisoryMode,
        token: u64,
        sent: Instant,
    ) -> Result<AdvisoryGrant> {
        let fixed_at = (!a.lease.is_watchdog()).then(|| later(sent, a.ttl()));
        let pinned = self.pinning.first_hold(conn, a, pid, fixed_at)?;
        Ok(AdvisoryGrant {
            hold: AdvisoryHold {
                pinned,
                how: Unlock {
                    strategy: Arc::clone(self),
                    key,
                    mode,
                },
            },
            token,
            sent,
        })
    }
}
