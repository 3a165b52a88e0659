//! The three strategies: one attempt each, and the holds they produce.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, Hold, LockName, Result, async_trait};
use sqlx::any::AnyRow;
use sqlx::pool::PoolConnection;
use sqlx::{Any, Row};
use tokio::time::Instant;

use crate::Inner;
use crate::error::{Meaning, from_sqlx, meaning};

/// Tokens of the unique-insert strategy: the row's AUTO_INCREMENT id in the high bits (it only
/// grows, across deletes and restarts), the number of takeovers of that row in the low bits.
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

    // ------------------------------------------------------------ unique-insert

    /// INSERT the hold; on a duplicate, take an expired row over with a conditional UPDATE.
    pub(crate) async fn unique_insert(&self) -> Result<Option<u64>> {
        let s = &self.inner.sql;
        let insert = sqlx::query(&s.insert_hold)
            .bind(self.key())
            .bind(&self.owner)
            .bind(ms(self.lease));
        // MySQL hands the AUTO_INCREMENT id back with the INSERT; SQLite through RETURNING.
        let inserted = match self.inner.dialect {
            crate::Dialect::MySql => insert
                .execute(&self.inner.pool)
                .await
                .map(|done| done.last_insert_id()),
            crate::Dialect::Sqlite => insert
                .fetch_one(&self.inner.pool)
                .await
                .and_then(|row| row.try_get::<i64, _>(0))
                .map(Some),
        };
        match inserted {
            Ok(Some(id)) => return Ok(Some(token(id, 0))),
            Ok(None) => return Err(self.missing_id()),
            Err(e) if meaning(&e) == Meaning::Duplicate => {}
            Err(e) => return Err(self.err("acquire")(e)),
        }
        let taken = sqlx::query(&s.take_over_hold)
            .bind(&self.owner)
            .bind(ms(self.lease))
            .bind(self.key())
            .execute(&self.inner.pool)
            .await
            .map_err(self.err("take over"))?;
        if taken.rows_affected() != 1 {
            return Ok(None);
        }
        let row = sqlx::query(&s.select_hold_token)
            .bind(self.key())
            .bind(&self.owner)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(self.err("read the token"))?;
        let Some(row) = row else {
            // Taken over from us already (our lease was shorter than the round trip).
            return Ok(None);
        };
        let id: i64 = row.try_get(0).map_err(self.err("read the token"))?;
        let takeovers: i64 = row.try_get(1).map_err(self.err("read the token"))?;
        if takeovers >= 1 << TAKEOVER_BITS {
            return Err(Error::Backend {
                backend: self.inner.backend,
                message: format!(
                    "lock {:?} was taken over 2^20 times without a release; its tokens would run out: delete its row to start afresh",
                    self.name
                ),
                retryable: false,
                source: None,
            });
        }
        Ok(Some(token(id, takeovers)))
    }

    pub(crate) async fn unique_release(&self) -> Result<bool> {
        let done = sqlx::query(&self.inner.sql.delete_hold)
            .bind(self.key())
            .bind(&self.owner)
            .execute(&self.inner.pool)
            .await
            .map_err(self.err("release"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn unique_renew(&self, ttl: Duration) -> Result<bool> {
        let done = sqlx::query(&self.inner.sql.renew_hold)
            .bind(ms(ttl))
            .bind(self.key())
            .bind(&self.owner)
            .execute(&self.inner.pool)
            .await
            .map_err(self.err("renew"))?;
        Ok(done.rows_affected() == 1)
    }

    // ------------------------------------------------------------ optimistic

    /// `UPDATE … WHERE version = ?` with the version last seen for this name; on a miss, read
    /// the current version (creating the row on first use) and try once more.
    pub(crate) async fn optimistic(&self) -> Result<Option<u64>> {
        let cached = self.inner.cached_version(&self.name);
        if let Some(version) = cached
            && let Some(token) = self.claim(version).await?
        {
            return Ok(Some(token));
        }
        let s = &self.inner.sql;
        let mut row = sqlx::query(&s.select_version)
            .bind(self.key())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(self.err("read the version"))?;
        if row.is_none() {
            sqlx::query(&s.insert_version)
                .bind(self.key())
                .execute(&self.inner.pool)
                .await
                .map_err(self.err("create the row"))?;
            row = sqlx::query(&s.select_version)
                .bind(self.key())
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(self.err("read the version"))?;
        }
        let Some(row) = row else { return Ok(None) };
        let version: i64 = row.try_get(0).map_err(self.err("read the version"))?;
        self.inner.cache_version(&self.name, version);
        if cached == Some(version) {
            return Ok(None); // the claim above already failed on this very version
        }
        self.claim(version).await
    }

    async fn claim(&self, version: i64) -> Result<Option<u64>> {
        let q = sqlx::query(&self.inner.sql.claim_version)
            .bind(&self.owner)
            .bind(ms(self.lease))
            .bind(self.key())
            .bind(version);
        let next = match self.inner.dialect {
            crate::Dialect::MySql => {
                let done = q
                    .execute(&self.inner.pool)
                    .await
                    .map_err(self.err("acquire"))?;
                if done.rows_affected() != 1 {
                    None
                } else {
                    Some(done.last_insert_id().ok_or_else(|| self.missing_id())?)
                }
            }
            crate::Dialect::Sqlite => {
                let row: Option<AnyRow> = q
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(self.err("acquire"))?;
                match row {
                    Some(row) => Some(row.try_get::<i64, _>(0).map_err(self.err("acquire"))?),
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
        let s = &self.inner.sql;
        let done = match version {
            Some(v) => {
                sqlx::query(&s.release_version)
                    .bind(self.key())
                    .bind(&self.owner)
                    .bind(i64::try_from(v).unwrap_or(i64::MAX))
                    .execute(&self.inner.pool)
                    .await
            }
            None => {
                sqlx::query(&s.release_version_by_owner)
                    .bind(self.key())
                    .bind(&self.owner)
                    .execute(&self.inner.pool)
                    .await
            }
        }
        .map_err(self.err("release"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn optimistic_renew(&self, version: u64, ttl: Duration) -> Result<bool> {
        let done = sqlx::query(&self.inner.sql.renew_version)
            .bind(ms(ttl))
            .bind(self.key())
            .bind(&self.owner)
            .bind(i64::try_from(version).unwrap_or(i64::MAX))
            .execute(&self.inner.pool)
            .await
            .map_err(self.err("renew"))?;
        Ok(done.rows_affected() == 1)
    }

    // ------------------------------------------------------------ for-update

    /// Takes the row lock on a dedicated connection (the row is created on first use), waiting until
    /// `deadline`; returns the connection holding it and the server's id for it.
    pub(crate) async fn for_update(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Option<(Pinned, u64)>> {
        let Some(lock_pool) = &self.inner.lock_pool else {
            return Err(Error::unsupported(
                self.inner.backend,
                "the for-update strategy",
            ));
        };
        let s = &self.inner.sql;
        // Each held or waiting lock pins a connection; waiting for one respects the deadline,
        // with a grace to open one, so that even a zero wait makes its one attempt.
        let pooled = match deadline {
            None => lock_pool.acquire().await,
            Some(d) => match tokio::time::timeout_at(
                d.max(Instant::now() + CONNECT_GRACE),
                lock_pool.acquire(),
            )
            .await
            {
                Ok(c) => c,
                Err(_) => return Ok(None),
            },
        };
        let mut conn = Pinned(Some(pooled.map_err(self.err("connect"))?));
        loop {
            let now = Instant::now();
            let left = deadline.map(|d| d.saturating_duration_since(now));
            let statement = match left {
                None => &s.lock_row,
                Some(left) if left >= Duration::from_secs(1) => {
                    sqlx::query(&s.lock_wait_timeout)
                        .bind(i64::try_from(left.as_secs()).unwrap_or(50).min(50))
                        .execute(&mut **conn.get()?)
                        .await
                        .map_err(self.err("set the lock wait"))?;
                    &s.lock_row
                }
                Some(_) => &s.lock_row_nowait,
            };
            let locked = sqlx::query(statement)
                .bind(self.key())
                .fetch_optional(&mut **conn.get()?)
                .await;
            match locked {
                Ok(Some(row)) => {
                    let id: i64 = row.try_get(0).map_err(self.err("lock"))?;
                    return Ok(Some((conn, u64::try_from(id).unwrap_or(0))));
                }
                Ok(None) => {
                    // First use of the name (or its row was deleted by hand): end the
                    // transaction (its gap lock would block the insert), create the row, retry.
                    // The row is only inserted when missing: INSERT IGNORE on an existing row
                    // waits for the holder's row lock.
                    conn.rollback().await;
                    self.inner.create_row(&self.name).await?;
                }
                Err(e) if meaning(&e) == Meaning::Busy => {
                    conn.rollback().await;
                    let now = Instant::now();
                    match deadline {
                        Some(d) if now >= d => {
                            conn.return_to_pool();
                            return Ok(None);
                        }
                        Some(d) if d - now < Duration::from_secs(1) => {
                            // Sub-second remainder: poll NOWAIT with a short pause.
                            tokio::time::sleep((d - now).min(Duration::from_millis(20))).await;
                        }
                        _ => {}
                    }
                }
                Err(e) => return Err(self.err("lock")(e)),
            }
        }
    }

    /// The next fencing token of this name, committed on its own (a holder that dies cannot
    /// take its token back).
    pub(crate) async fn next_fence(&self) -> Result<u64> {
        let q = sqlx::query(&self.inner.sql.next_fence).bind(self.key());
        let v = match self.inner.dialect {
            crate::Dialect::MySql => {
                let done = q
                    .execute(&self.inner.pool)
                    .await
                    .map_err(self.err("fence"))?;
                done.last_insert_id().ok_or_else(|| self.missing_id())?
            }
            crate::Dialect::Sqlite => {
                let row = q
                    .fetch_one(&self.inner.pool)
                    .await
                    .map_err(self.err("fence"))?;
                row.try_get::<i64, _>(0).map_err(self.err("fence"))?
            }
        };
        Ok(u64::try_from(v).unwrap_or(0))
    }
}

fn token(id: i64, takeovers: i64) -> u64 {
    (u64::try_from(id).unwrap_or(0) << TAKEOVER_BITS) | u64::try_from(takeovers).unwrap_or(0)
}

/// A connection that must not go back to the pool with a lock or an open transaction: dropped
/// without [`Pinned::into_pool`], it is closed (the server then rolls back and releases).
#[derive(Debug)]
pub(crate) struct Pinned(Option<PoolConnection<Any>>);

impl Pinned {
    fn get(&mut self) -> Result<&mut PoolConnection<Any>> {
        self.0.as_mut().ok_or_else(|| Error::Backend {
            backend: "mysql",
            message: "the holding connection is gone".into(),
            retryable: false,
            source: None,
        })
    }

    async fn rollback(&mut self) {
        if let Some(c) = self.0.as_mut()
            && sqlx::query("ROLLBACK").execute(&mut **c).await.is_err()
        {
            self.close();
        }
    }

    /// Returns a clean connection (no transaction open) to the pool.
    fn return_to_pool(&mut self) {
        if let Some(c) = self.0.take() {
            drop_connection(c);
        }
    }

    /// Commits (releasing the row lock) and returns the connection to the pool.
    pub(crate) async fn commit(&mut self) -> std::result::Result<(), sqlx::Error> {
        let Some(c) = self.0.as_mut() else {
            return Err(sqlx::Error::PoolClosed);
        };
        match sqlx::query("COMMIT").execute(&mut **c).await {
            Ok(_) => {
                drop(self.0.take());
                Ok(())
            }
            Err(e) => {
                self.close();
                Err(e)
            }
        }
    }

    /// Checks the connection (and so the hold) is alive.
    pub(crate) async fn ping(&mut self) -> std::result::Result<(), sqlx::Error> {
        let Some(c) = self.0.as_mut() else {
            return Err(sqlx::Error::PoolClosed);
        };
        match sqlx::query("SELECT 1").execute(&mut **c).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.close();
                Err(e)
            }
        }
    }

    fn close(&mut self) {
        if let Some(mut c) = self.0.take() {
            c.close_on_drop();
            drop_connection(c);
        }
    }
}

/// Drops a pool connection; without a tokio runtime (which the pool needs to take it back) it
/// is leaked instead, and the server frees what it held when the process exits.
fn drop_connection(c: PoolConnection<Any>) {
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

/// The backend side of a SQL hold.
#[derive(Debug)]
pub(crate) enum SqlHold {
    UniqueInsert(Attempt),
    Optimistic(Attempt, u64),
    ForUpdate(Attempt, tokio::sync::Mutex<Pinned>),
}

impl SqlHold {
    fn attempt(&self) -> &Attempt {
        match self {
            Self::UniqueInsert(a) | Self::Optimistic(a, _) | Self::ForUpdate(a, _) => a,
        }
    }
}

#[async_trait]
impl Hold for SqlHold {
    async fn release(&self) -> Result<()> {
        let a = self.attempt();
        let released = match self {
            Self::UniqueInsert(a) => retry_once(|| a.unique_release()).await?,
            Self::Optimistic(a, v) => retry_once(|| a.optimistic_release(Some(*v))).await?,
            Self::ForUpdate(a, conn) => {
                a.inner.forget_holder(&a.name, &a.owner);
                conn.lock().await.commit().await.is_ok()
            }
        };
        if released {
            Ok(())
        } else {
            Err(Error::lock_lost(&a.name))
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let a = self.attempt();
        let held = match self {
            Self::UniqueInsert(a) => a.unique_renew(ttl).await?,
            Self::Optimistic(a, v) => a.optimistic_renew(*v, ttl).await?,
            // The server keeps the row lock as long as the connection lives.
            Self::ForUpdate(_, conn) => conn.lock().await.ping().await.is_ok(),
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
        if let Self::ForUpdate(a, _) = self {
            a.inner.forget_holder(&a.name, &a.owner);
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
