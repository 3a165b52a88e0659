//! For-update locks taken inside a transaction the caller owns: the lock and the data commit
//! or roll back together.

use std::time::Duration;

use dlock_core::{Error, FencingToken, LockName, Result};
use sqlx::MySqlConnection;

use crate::db::query;
use crate::error::{Meaning, from_sqlx, meaning};
use crate::strategies::{Attempt, server_seconds};
use crate::{SqlProvider, Strategy};

/// A for-update lock held by the caller's transaction (see [`SqlProvider::lock_in`]).
///
/// It is the transaction's row lock: it ends when the transaction commits or rolls back (or
/// its connection closes), and dropping this value changes nothing. There is no lease to
/// renew and nothing to release.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "the fencing token is the reason to take the lock in the transaction"]
pub struct TxLock {
    name: LockName,
    token: FencingToken,
}

impl TxLock {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The fencing token: larger than that of every earlier holder of the name, whether it
    /// held through [`SqlProvider::lock_in`] or a plain `for-update` lock. It is committed on
    /// its own, so it never repeats, even if the transaction rolls back.
    pub fn token(&self) -> FencingToken {
        self.token
    }
}

impl SqlProvider {
    /// Takes the `for-update` lock `name` inside the caller's open MySQL/MariaDB transaction,
    /// waiting up to `wait` (rounded up to whole seconds; `Duration::ZERO` does not wait).
    /// `Ok(None)` if another holder kept it that long.
    ///
    /// This is the strongest lock a SQL database offers: the row lock lives in the same
    /// transaction as the data it protects, so the writes commit only while the lock is held,
    /// and a crash, a partition or a rollback ends both at once. It excludes the plain
    /// `for-update` locks of providers on the same tables, and they exclude it.
    ///
    /// The provider must use the `for-update` strategy (its tables are the ones locked).
    /// `conn` is the transaction's connection (`&mut tx` for a `sqlx::Transaction`); the
    /// session's `innodb_lock_wait_timeout` is set for the wait and put back after it.
    ///
    /// ```no_run
    /// # async fn demo() -> dlock_core::Result<()> {
    /// use std::time::Duration;
    /// use dlock_sql::{SqlProvider, Strategy};
    /// let pool = sqlx::MySqlPool::connect("mysql://app@db.internal/shop").await.expect("pool");
    /// let locks = SqlProvider::from_mysql_pool(pool.clone(), Strategy::ForUpdate, "dlock", 4).await?;
    ///
    /// let mut tx = pool.begin().await.expect("begin");
    /// if let Some(lock) = locks.lock_in(&mut tx, "invoices/42", Duration::from_secs(5)).await? {
    ///     // A fenced write in the same transaction: it also refuses a token older than the
    ///     // one already stored, should another writer ever bypass the lock.
    ///     sqlx::query("UPDATE invoices SET state = 'paid', fence = ? WHERE id = 42 AND fence < ?")
    ///         .bind(lock.token().get())
    ///         .bind(lock.token().get())
    ///         .execute(&mut *tx)
    ///         .await
    ///         .expect("update");
    ///     tx.commit().await.expect("commit"); // the lock ends with the transaction
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] unless the provider is MySQL/MariaDB with `for-update`;
    /// [`Error::InvalidArgument`] if `conn` has no open transaction (the row lock would end
    /// with the statement) or `name` is not a valid lock name; [`Error::Backend`] or
    /// [`Error::Connection`] for a failed statement (the transaction may then be unusable, as
    /// for any failed statement).
    pub async fn lock_in(
        &self,
        conn: &mut MySqlConnection,
        name: &str,
        wait: Duration,
    ) -> Result<Option<TxLock>> {
        let name = LockName::new(name)?;
        let inner = &self.inner;
        if inner.strategy != Strategy::ForUpdate || inner.dialect != crate::Dialect::MySql {
            return Err(Error::unsupported(
                inner.backend,
                "locks in the caller's transaction without the for-update strategy on MySQL \
                 (connect with ?strategy=for-update)",
            ));
        }
        let backend = inner.backend;
        let err = |what: &'static str| move |e| from_sqlx(backend, what, e);
        let session = query("SELECT @@in_transaction, @@innodb_lock_wait_timeout")
            .fetch_one(&mut *conn)
            .await
            .map_err(err("read the session"))?;
        if session.int(0).map_err(err("read the session"))? == 0 {
            return Err(Error::invalid_argument(
                "conn",
                "lock_in needs a connection inside a transaction (pool.begin()): without one \
                 the row lock would end with its statement",
            ));
        }
        let previous = session.int(1).map_err(err("read the session"))?;
        // The row must exist before the transaction reads it: a locking read of a missing row
        // takes a gap lock, which would block its creation until the transaction ends. It is
        // created outside the transaction (committed at once, so other holders see it).
        inner.create_row(&name).await?;
        let key = name.as_str().as_bytes();
        let statement = if wait.is_zero() {
            &inner.sql.lock_row_nowait
        } else {
            &inner.sql.lock_row
        };
        if !wait.is_zero() {
            query("SET SESSION innodb_lock_wait_timeout = ?")
                .bind(server_seconds(wait))
                .execute(&mut *conn)
                .await
                .map_err(err("set the lock wait"))?;
        }
        let locked = match query(statement).bind(key).fetch_optional(&mut *conn).await {
            Ok(Some(_)) => Ok(true),
            Ok(None) => Err(Error::Backend {
                backend,
                message: format!("the row of lock {name:?} vanished (deleted by hand?)"),
                retryable: true,
                source: None,
            }),
            Err(e) if meaning(&e) == Meaning::Busy => Ok(false),
            Err(e) => Err(from_sqlx(backend, "lock", e)),
        };
        if !wait.is_zero() {
            query("SET SESSION innodb_lock_wait_timeout = ?")
                .bind(previous)
                .execute(&mut *conn)
                .await
                .map_err(err("restore the lock wait"))?;
        }
        if !locked? {
            return Ok(None);
        }
        let attempt = Attempt {
            inner: std::sync::Arc::clone(inner),
            name: name.clone(),
            owner: String::new(),
            lease: wait,
        };
        let token = attempt.next_fence().await?;
        Ok(Some(TxLock {
            name,
            token: FencingToken::new(token),
        }))
    }
}
