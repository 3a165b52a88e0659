//! For-update locks taken inside a transaction the caller owns: the lock and the data commit
//! or roll back together.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, FencingToken, LockName, Result};
#[cfg(feature = "mysql")]
use sqlx::MySqlConnection;
#[cfg(feature = "postgres")]
use sqlx::PgConnection;

#[cfg(feature = "postgres")]
use crate::config::Strategy;
use crate::db::query;
use crate::error::{Meaning, meaning};
use crate::{Dialect, SqlProvider};
#[cfg(feature = "mysql")]
use crate::{
    db::On,
    error::{from_sqlx, mysql_deadlock},
    pinned::server_seconds,
    strategy::ForUpdate,
};

/// A for-update lock held by the caller's transaction (see [`SqlProvider::lock_in`]).
///
/// It is the transaction's lock (a row lock on MySQL/MariaDB, a transaction-level advisory
/// lock on PostgreSQL): it ends when the transaction commits or rolls back (or its connection
/// closes), and dropping this value changes nothing. There is no lease to
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
    /// and a rollback or a crash of the client ends both at once (after a partition nothing of
    /// the transaction commits, and the server keeps the row until it drops the connection:
    /// its `wait_timeout`, which is the application's to set). It excludes the plain
    /// `for-update` locks of providers on the same tables, and they exclude it.
    ///
    /// The provider must use the `for-update` strategy (its tables are the ones locked).
    /// `conn` is the transaction's connection (`&mut tx` for a `sqlx::Transaction`); the
    /// wait is the locking statement's own (MariaDB's `SET STATEMENT`, MySQL's `SET_VAR`
    /// hint): the session's `innodb_lock_wait_timeout` is never changed, so a `lock_in`
    /// dropped half-way leaves the connection's settings as they were.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use dlock_sql::{SqlConfig, SqlProvider};
    /// let url = "mysql://app@db.internal/shop?strategy=for-update&pool=4";
    /// let pool = sqlx::MySqlPool::connect("mysql://app@db.internal/shop").await?;
    /// let locks = SqlProvider::from_pool(pool.clone(), &SqlConfig::from_url(url)?).await?;
    ///
    /// let mut tx = pool.begin().await?;
    /// if let Some(lock) = locks.lock_in(&mut tx, "invoices/42", Duration::from_secs(5)).await? {
    ///     // A fenced write in the same transaction: it also refuses a token older than the
    ///     // one already stored, should another writer ever bypass the lock.
    ///     sqlx::query("UPDATE invoices SET state = 'paid', fence = ? WHERE id = 42 AND fence < ?")
    ///         .bind(lock.token().get())
    ///         .bind(lock.token().get())
    ///         .execute(&mut *tx)
    ///         .await?;
    ///     tx.commit().await?; // the lock ends with the transaction
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] unless the provider is MySQL/MariaDB with `for-update` (for
    /// PostgreSQL see `lock_in_pg`, feature `postgres`);
    /// [`Error::InvalidArgument`] if `conn` has no open transaction (the row lock would end
    /// with the statement) or `name` is not a valid lock name; [`Error::Backend`] or
    /// [`Error::Connection`] for a failed statement (the transaction may then be unusable, as
    /// for any failed statement); a non-retryable [`Error::Backend`] if the transaction ended
    /// (its connection killed, say) before its fencing token was taken: no token is handed
    /// out that a later holder's could be below. An error after the row was granted (its
    /// token could not be taken) leaves the row locked by the transaction, without a token:
    /// roll the transaction back, or call `lock_in` again in it (the row lock is the
    /// transaction's, so it is granted at once).
    ///
    /// # Cancel safety
    ///
    /// Dropped while it waits, it leaves the session's settings as they were, but the locking
    /// statement runs on: sqlx hands its answer to the connection's next query, and if the
    /// row was granted meanwhile the transaction holds it without a fencing token. Roll the
    /// transaction back after a dropped `lock_in`.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub async fn lock_in(
        &self,
        conn: &mut MySqlConnection,
        name: &str,
        wait: Duration,
    ) -> Result<Option<TxLock>> {
        // sqlx's own count of the transactions it opened on the connection, and on MariaDB the
        // server's word too (`@@in_transaction`, which MySQL lacks): a deadlock or an implicit
        // commit may have ended the transaction behind sqlx's back, and a locking read
        // outside one would hold nothing.
        let in_tx = sqlx::Connection::is_in_transaction(&*conn);
        let (name, fu) = self.in_transaction(name, in_tx)?;
        let backend = self.inner.backend;
        let err = |what| self.inner.err(what);
        let session = query(if fu.sql.mariadb {
            "SELECT @@in_transaction, @@innodb_rollback_on_timeout"
        } else {
            "SELECT 1, @@innodb_rollback_on_timeout"
        })
        .fetch_one(&mut *conn)
        .await
        .map_err(err("read the session"))?;
        if session.int(0).map_err(err("read the session"))? == 0 {
            return Err(not_in_transaction());
        }
        let rollback_on_timeout = session.int(1).map_err(err("read the session"))? != 0;
        // The row must exist before the transaction reads it: a locking read of a missing row
        // takes a gap lock, which would block its creation until the transaction ends. It is
        // created outside the transaction (committed at once, so other holders see it).
        fu.create_row(self.inner.beside_the_callers(), &name)
            .await?;
        // The wait is the statement's own (the session's setting is never touched, so a
        // lock_in dropped half-way leaves the caller's connection as it was).
        let statement = if wait.is_zero() {
            fu.sql.lock_row_nowait.clone()
        } else {
            fu.sql.lock_row_within(server_seconds(wait))
        };
        let locked = lock_row(backend, &name, &statement, &mut *conn).await;
        // The server rolled the caller's whole transaction back: a retry on it would run in
        // autocommit and lock nothing, so this is for the caller to handle, never to retry.
        let locked = match locked {
            Err(RowError::Deadlock(e)) => Err(rolled_back(backend, &name, "a deadlock", e)),
            // A lock wait that ran out (1205) ends the whole transaction under
            // innodb_rollback_on_timeout; MySQL's NOWAIT refusal (3572) only its statement,
            // while MariaDB answers NOWAIT with 1205 too.
            Ok(false) if rollback_on_timeout && (fu.sql.mariadb || !wait.is_zero()) => {
                Err(Error::backend_failed(
                    backend,
                    format!(
                        "lock {name:?} stayed busy, and the server rolled back the caller's whole \
                     transaction (innodb_rollback_on_timeout is on): begin a new one"
                    ),
                    false,
                ))
            }
            other => other.map_err(|e| e.into_error(backend, &name)),
        };
        if !locked? {
            return Ok(None);
        }
        let token = fu
            .next_fence(self.inner.beside_the_callers(), &name)
            .await?;
        // The token was taken on another connection: only a transaction that still holds the
        // row after it was may have it (one that ended before could see a later holder take
        // the lock with a lower token). A statement on the caller's connection says so; a
        // transaction cannot end between the two without a statement of its own, except with
        // its connection.
        let alive = query(if fu.sql.mariadb {
            "SELECT @@in_transaction"
        } else {
            "SELECT 1"
        })
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| ended(backend, &name, Some(e)))?;
        if alive.int(0).map_err(|e| ended(backend, &name, Some(e)))? != 1 {
            return Err(ended(backend, &name, None));
        }
        Ok(Some(TxLock {
            name,
            token: FencingToken::new(token),
        }))
    }

    /// Takes the `for-update` lock `name` inside the caller's open PostgreSQL transaction,
    /// waiting up to `wait` (`Duration::ZERO` does not wait). `Ok(None)` if another holder
    /// kept it that long. As [`lock_in`](Self::lock_in) for MySQL, the lock is the
    /// transaction's and ends with it; it excludes the plain `for-update` locks of providers
    /// on the same tables, and they exclude it. It is a transaction-level advisory lock on the
    /// name's key (`pg_advisory_xact_lock`), as plain for-update holds on PostgreSQL are
    /// session-level ones; it adds no transaction id of its own. The transaction must be READ
    /// COMMITTED (PostgreSQL's default): under REPEATABLE READ or SERIALIZABLE its snapshot
    /// was taken before the lock was granted (at its first statement, this call's at the
    /// latest), so it would read what the lock protects as it was before the last holder's
    /// writes. Unlike InnoDB's row locks, the lock ends with a rollback to a savepoint taken
    /// before it (a nested sqlx transaction dropped, say) while the transaction goes on.
    ///
    /// The lock is tried inside a savepoint, so a lock that stays busy (PostgreSQL ends such
    /// a statement with an error, which would abort the whole transaction) leaves the caller's
    /// transaction usable. The wait is a transaction-local `lock_timeout`, put back after it.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use dlock_sql::{SqlConfig, SqlProvider};
    /// let url = "postgres://app@db.internal/shop?strategy=for-update&pool=4";
    /// let pool = sqlx::PgPool::connect("postgres://app@db.internal/shop").await?;
    /// let locks = SqlProvider::from_pool(pool.clone(), &SqlConfig::from_url(url)?).await?;
    ///
    /// let mut tx = pool.begin().await?;
    /// if let Some(lock) = locks.lock_in_pg(&mut tx, "invoices/42", Duration::from_secs(5)).await? {
    ///     // A fenced write in the same transaction.
    ///     let token = i64::try_from(lock.token().get())?;
    ///     sqlx::query("UPDATE invoices SET state = 'paid', fence = $1 WHERE id = 42 AND fence < $1")
    ///         .bind(token)
    ///         .execute(&mut *tx)
    ///         .await?;
    ///     tx.commit().await?; // the lock ends with the transaction
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] unless the provider is PostgreSQL with `for-update`;
    /// [`Error::InvalidArgument`] if `conn` has no open transaction (begun through sqlx), its
    /// transaction is REPEATABLE READ or SERIALIZABLE, or `name` is not a valid lock name; [`Error::Backend`] or [`Error::Connection`] for a
    /// failed statement (the transaction may then be unusable, as for any failed statement);
    /// a non-retryable [`Error::Backend`] if the transaction ended before its fencing token
    /// was taken (a token that could not be taken leaves the transaction without the
    /// lock).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped while it waits, it leaves the caller's transaction inside its
    /// savepoint, with the locking statement's answer still to come (the lock may then be
    /// held without a fencing token, or the transaction aborted by a lock timeout). Roll
    /// the transaction back after a dropped `lock_in_pg`.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn lock_in_pg(
        &self,
        conn: &mut PgConnection,
        name: &str,
        wait: Duration,
    ) -> Result<Option<TxLock>> {
        let in_tx = sqlx::Connection::is_in_transaction(&*conn);
        let name = LockName::new(name)?;
        let advisory = match Arc::clone(&self.strategy).advisory() {
            Some(a) if self.inner.strategy == Strategy::ForUpdate => a,
            _ => return Err(self.not_for_update(Dialect::Postgres)),
        };
        if !in_tx {
            return Err(not_in_transaction());
        }
        let backend = self.inner.backend;
        let err = |what| self.inner.err(what);
        let beside = self.inner.beside_the_callers();
        let session = query(
            "SELECT current_setting('lock_timeout'), current_setting('transaction_isolation'), \
             current_database()::TEXT",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(err("read the session"))?;
        let previous = session.text(0).map_err(err("read the session"))?;
        let isolation = session.text(1).map_err(err("read the session"))?;
        // Advisory locks exclude each other within one database only.
        let database = session.text(2).map_err(err("read the session"))?;
        let ours = advisory.database(beside).await?;
        if database != ours {
            return Err(Error::invalid_argument(
                "conn",
                format!(
                    "the transaction is on database {database:?}, the provider's locks on \
                     {ours:?}: a lock taken there would exclude none of them"
                ),
            ));
        }
        if matches!(isolation.as_str(), "repeatable read" | "serializable") {
            return Err(Error::invalid_argument(
                "conn",
                format!(
                    "lock {name:?} in a {isolation} transaction: its snapshot was taken before \
                     the lock could be granted, so it would read what the lock protects as it \
                     was before the last holder's writes. Take the lock in a READ COMMITTED \
                     transaction"
                ),
            ));
        }
        // The key is read (or given) beside the caller's transaction, committed at once.
        let key = advisory.key_on(beside, &name).await?;
        let (lock, try_lock) = advisory.in_transaction_sql();
        query("SAVEPOINT dlock_lock_in")
            .execute(&mut *conn)
            .await
            .map_err(err("open a savepoint"))?;
        // Inside the savepoint a lock timeout or a deadlock aborts only the savepoint, which
        // is rolled back below: the caller's transaction goes on, and a retry can help.
        let locked = if wait.is_zero() {
            match query(try_lock)
                .bind(i64::from(key))
                .fetch_one(&mut *conn)
                .await
            {
                Ok(row) => row.int(0).map(|got| got != 0).map_err(err("lock")),
                Err(e) => Err(err("lock")(e)),
            }
        } else {
            let ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
            let waited =
                match query("SELECT set_config('lock_timeout', LEAST($1, 2147483647)::TEXT, true)")
                    .bind(ms.max(1))
                    .execute(&mut *conn)
                    .await
                {
                    Ok(_) => query(lock).bind(i64::from(key)).execute(&mut *conn).await,
                    Err(e) => Err(e),
                };
            match waited {
                Ok(_) => Ok(true),
                Err(e) if meaning(&e) == Meaning::Busy => Ok(false),
                Err(e) => Err(err("lock")(e)),
            }
        };
        // Granted, the fencing token is taken (on another connection) while the savepoint is
        // open: releasing it after the token proves that the transaction still held the lock
        // when the token was taken (one that ended before could see a later holder take the
        // lock with a lower token), and a token that could not be taken rolls the lock back
        // with the savepoint.
        let token = match locked {
            Ok(true) => {
                let restored = query("SELECT set_config('lock_timeout', $1, true)")
                    .bind(previous.as_str())
                    .execute(&mut *conn)
                    .await
                    .map_err(err("restore the lock wait"));
                match restored {
                    Ok(_) => advisory.next_token(beside, &name, key).await.map(Some),
                    Err(e) => Err(e),
                }
            }
            Ok(false) => Ok(None),
            Err(e) => Err(e),
        };
        if !matches!(token, Ok(Some(_))) {
            // Busy, failed, or without a token: PostgreSQL may have aborted the savepoint;
            // rolling back to it makes the transaction usable again and undoes the lock wait
            // and the lock (a transaction's advisory lock taken in a savepoint ends with it).
            query("ROLLBACK TO SAVEPOINT dlock_lock_in")
                .execute(&mut *conn)
                .await
                .map_err(err("roll back to the savepoint"))?;
        }
        let released = query("RELEASE SAVEPOINT dlock_lock_in")
            .execute(&mut *conn)
            .await;
        match (token?, released) {
            (Some(token), Ok(_)) => Ok(Some(TxLock {
                name,
                token: FencingToken::new(token),
            })),
            (Some(_), Err(e)) => Err(ended(backend, &name, Some(e))),
            (None, released) => released.map(|_| None).map_err(err("release the savepoint")),
        }
    }

    /// What a lock in the caller's MySQL transaction starts from, checked in this order: a
    /// valid name, the provider's for-update strategy on MySQL, and a connection inside a
    /// transaction (`in_transaction`).
    #[cfg(feature = "mysql")]
    fn in_transaction(
        &self,
        name: &str,
        in_transaction: bool,
    ) -> Result<(LockName, Arc<ForUpdate>)> {
        let name = LockName::new(name)?;
        let fu = match Arc::clone(&self.strategy).for_update() {
            Some(fu) if self.inner.dialect == Dialect::MySql => fu,
            _ => return Err(self.not_for_update(Dialect::MySql)),
        };
        if !in_transaction {
            return Err(not_in_transaction());
        }
        Ok((name, fu))
    }

    /// The error of a lock in the caller's transaction on a provider that is not for-update
    /// on `dialect`.
    fn not_for_update(&self, dialect: Dialect) -> Error {
        Error::unsupported(
            self.inner.backend,
            format!(
                "locks in the caller's transaction without the for-update strategy on \
                 {dialect:?} (connect with ?strategy=for-update)"
            ),
        )
    }
}

fn not_in_transaction() -> Error {
    Error::invalid_argument(
        "conn",
        "a lock in the caller's transaction needs a connection inside a transaction \
         (pool.begin()): without one the lock would end with its statement",
    )
}

#[cfg(feature = "mysql")]
/// Why a lock of a row in the caller's transaction failed.
enum RowError {
    /// The transaction does not see the lock's row.
    Missing,
    /// MySQL's deadlock answer, which rolled back the caller's whole transaction.
    Deadlock(sqlx::Error),
    /// Anything else.
    Other(Error),
}

#[cfg(feature = "mysql")]
impl RowError {
    /// The error as any other statement's: a deadlock is then contention (retryable), a
    /// missing row one deleted by hand.
    fn into_error(self, backend: &'static str, name: &LockName) -> Error {
        match self {
            Self::Missing => vanished(backend, name),
            Self::Deadlock(e) => from_sqlx(backend, "lock", e),
            Self::Other(e) => e,
        }
    }
}

#[cfg(feature = "mysql")]
/// Locks `name`'s row with `statement` on the caller's connection: whether it was granted
/// (`false`: busy at the end of the wait).
async fn lock_row<'c>(
    backend: &'static str,
    name: &LockName,
    statement: &str,
    conn: impl Into<On<'c>>,
) -> std::result::Result<bool, RowError> {
    match query(statement)
        .bind(name.as_str().as_bytes())
        .fetch_optional(conn)
        .await
    {
        Ok(Some(_)) => Ok(true),
        Ok(None) => Err(RowError::Missing),
        Err(e) if meaning(&e) == Meaning::Busy => Ok(false),
        Err(e) if mysql_deadlock(&e) => Err(RowError::Deadlock(e)),
        Err(e) => Err(RowError::Other(from_sqlx(backend, "lock", e))),
    }
}

/// The error of a lock whose try ended the caller's transaction (`why`): not retryable, the
/// transaction is gone.
#[cfg(feature = "mysql")]
fn rolled_back(backend: &'static str, name: &LockName, why: &str, e: sqlx::Error) -> Error {
    let message = format!(
        "the server rolled back the caller's whole transaction on {why} while locking \
         {name:?}: begin a new transaction (a retry on this one would lock nothing): {e}"
    );
    Error::backend(backend, message, false, e)
}

#[cfg(feature = "mysql")]
fn vanished(backend: &'static str, name: &LockName) -> Error {
    Error::backend_failed(
        backend,
        format!("the row of lock {name:?} vanished (deleted by hand?)"),
        true,
    )
}

/// The error of a lock whose transaction ended (`e`: how its connection answered) before
/// its fencing token was known to be taken while it held the row: the token is not handed
/// out, and the transaction, if it goes on, must be rolled back.
fn ended(backend: &'static str, name: &LockName, e: Option<sqlx::Error>) -> Error {
    let message = format!(
        "the caller's transaction that was granted lock {name:?} did not outlive the \
         taking of its fencing token (its connection ended, or it was rolled back): the \
         lock may be someone else's now; begin a new transaction"
    );
    match e {
        Some(e) => Error::backend(backend, message, false, e),
        None => Error::backend_failed(backend, message, false),
    }
}
