//! The provider: its pools and set-up (tables, checks of the server), the caches of names,
//! and the `LockProvider` implementation (handles and `describe`).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dlock_core::backend::{HandleInfo, Lock, ReadWriteLock};
use dlock_core::{
    Capabilities, DynLock, DynReadWriteLock, DynSemaphore, Error, LockKind, LockName, LockOptions,
    LockProvider, LockStatus, Result,
};

use crate::config::{self, Dialect, SqlConfig, Strategy};
use crate::db::{Pool, query};
use crate::error::from_sqlx;
use crate::handles::{SqlMutex, SqlReadWrite};
#[cfg(feature = "sqlite")]
use crate::mounts;
#[cfg(feature = "postgres")]
use crate::notify;
use crate::sql::Statements;
use crate::{db, error, strategies, wake};

/// The URL schemes this backend serves (with the features that enable them).
pub const SCHEMES: &[&str] = &[
    #[cfg(feature = "mysql")]
    "mysql",
    #[cfg(feature = "mysql")]
    "mariadb",
    #[cfg(feature = "sqlite")]
    "sqlite",
    #[cfg(feature = "postgres")]
    "postgres",
    #[cfg(feature = "postgres")]
    "postgresql",
];

/// The shortest lease this backend accepts.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// A client of one database: a connection pool (plus, for `for-update`, a pool of connections
/// that hold row locks), shared by every handle it creates. Cloning is cheap.
#[derive(Clone)]
pub struct SqlProvider {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    /// For-update only: connections with autocommit off, one per held or waiting lock.
    pub(crate) lock_pool: Option<Pool>,
    pub(crate) sql: Statements,
    pub(crate) dialect: Dialect,
    pub(crate) strategy: Strategy,
    pub(crate) backend: &'static str,
    client_id: String,
    ids: AtomicU64,
    pub(crate) store_id: String,
    /// Optimistic: the version last seen per name (saves the read before the claim).
    versions: Mutex<HashMap<LockName, i64>>,
    /// For-update and advisory: owner of each live hold → (name, server connection id).
    holders: Mutex<HashMap<String, (LockName, u64)>>,
    /// Advisory: the key of each name seen (a name's key never changes).
    keys: Mutex<HashMap<LockName, i32>>,
    /// PostgreSQL unique-insert and optimistic: the waiters woken by release notifications.
    #[cfg(feature = "postgres")]
    wakeups: Option<Arc<notify::Wakeups>>,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Remembers `value` for `name` in a per-name cache, which starts afresh past 10,000 names.
fn remember<V>(cache: &Mutex<HashMap<LockName, V>>, name: &LockName, value: V) {
    let mut cache = guard(cache);
    if cache.len() > 10_000 {
        cache.clear();
    }
    cache.insert(name.clone(), value);
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlProvider")
            .field("store", &self.store_id)
            .finish()
    }
}

impl fmt::Debug for SqlProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

impl Inner {
    /// A fresh owner for one acquisition: `<client uuid>:<n>`.
    pub(crate) fn next_owner(&self) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}:{n}", self.client_id)
    }

    pub(crate) fn cached_version(&self, name: &LockName) -> Option<i64> {
        guard(&self.versions).get(name).copied()
    }

    pub(crate) fn cache_version(&self, name: &LockName, version: i64) {
        remember(&self.versions, name, version);
    }

    pub(crate) fn cached_key(&self, name: &LockName) -> Option<i32> {
        guard(&self.keys).get(name).copied()
    }

    pub(crate) fn cache_key(&self, name: &LockName, key: i32) {
        remember(&self.keys, name, key);
    }

    pub(crate) fn forget_key(&self, name: &LockName) {
        guard(&self.keys).remove(name);
    }

    /// The statement that sets a held lock's server-side lease (`?`: seconds): the session's
    /// idle timeout for an advisory lock, the transaction's for a row lock.
    pub(crate) fn hold_timeout(&self) -> &str {
        if self.strategy == Strategy::Advisory {
            &self.sql.advisory_hold_timeout
        } else {
            &self.sql.hold_timeout
        }
    }

    pub(crate) async fn create_row(&self, name: &LockName) -> Result<()> {
        // A plain SELECT reads without locking; INSERT IGNORE would wait for a holder's lock.
        let exists = query(&self.sql.row_exists)
            .bind(name.as_str().as_bytes())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| from_sqlx(self.backend, "look for the lock row", e))?;
        if exists.is_some() {
            return Ok(());
        }
        query(&self.sql.insert_row)
            .bind(name.as_str().as_bytes())
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx(self.backend, "create the lock row", e))?;
        Ok(())
    }

    /// The wake-up of `name`'s waiters in this process, for the strategies whose waiters
    /// poll: a release in this process (or, on PostgreSQL, one announced by `NOTIFY`) wakes
    /// one at once. `None` where the server queues the waiters (`for-update`, `advisory`).
    pub(crate) fn wakeup(&self, name: &LockName) -> Option<wake::Waiting> {
        if self.strategy.pins_connections() {
            return None;
        }
        let waiting = wake::register(&self.store_id, name.as_str());
        // Releases are announced on PostgreSQL: listen from the first wait on.
        #[cfg(feature = "postgres")]
        if let Some(w) = &self.wakeups {
            w.listen();
        }
        Some(waiting)
    }

    /// A waiter of this provider waits on (each pass of its wait after the first): on
    /// PostgreSQL the release listener notes it, and starts again if its task ended with the
    /// runtime it ran on.
    pub(crate) fn still_waiting(&self) {
        #[cfg(feature = "postgres")]
        if let Some(w) = &self.wakeups {
            w.listen();
        }
    }

    /// A place behind `name`'s waiters in this process, if it has any (see [`Self::wakeup`]).
    pub(crate) fn queue_behind(&self, name: &LockName) -> Option<wake::Waiting> {
        if self.strategy.pins_connections() {
            return None;
        }
        let behind = wake::join(&self.store_id, name.as_str());
        // The waiters ahead may be another provider's on the same store: this one listens
        // too, or its waiters would only poll once that provider is gone.
        #[cfg(feature = "postgres")]
        if behind.is_some()
            && let Some(w) = &self.wakeups
        {
            w.listen();
        }
        behind
    }

    /// Wakes a waiter of `name` in this process after a release.
    pub(crate) fn released(&self, name: &LockName) {
        wake::wake(&self.store_id, name.as_str());
    }

    pub(crate) fn remember_holder(&self, owner: &str, name: &LockName, connection: u64) {
        guard(&self.holders).insert(owner.to_owned(), (name.clone(), connection));
    }

    pub(crate) fn forget_holder(&self, _name: &LockName, owner: &str) {
        guard(&self.holders).remove(owner);
    }
}

impl SqlProvider {
    /// Connects to the database a `mysql://`, `mariadb://` or `sqlite://` URL names and creates
    /// dlock's tables if they are missing.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad URL, [`Error::Unsupported`] for `for-update` on SQLite,
    /// [`Error::Connection`] if the database cannot be reached (the message never shows the
    /// password), [`Error::Backend`] if the tables cannot be created.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(SqlConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with(config: SqlConfig) -> Result<Self> {
        let backend = backend_name(config.dialect);
        let enabled = match config.dialect {
            Dialect::MySql => cfg!(feature = "mysql"),
            Dialect::Sqlite => cfg!(feature = "sqlite"),
            Dialect::Postgres => cfg!(feature = "postgres"),
        };
        if !enabled {
            return Err(Error::config(format!(
                "dlock-sql was built without its `{backend}` feature"
            )));
        }
        config::check_table(&config.table)?;
        if config.dialect == Dialect::Sqlite && config.strategy == Strategy::ForUpdate {
            return Err(Error::unsupported("sqlite", "the for-update strategy"));
        }
        if config.dialect == Dialect::Sqlite {
            create_parent_dir(&config)?;
        }
        let what = format!("connect to {}", config.url);
        let (pool, lock_pool) = db::connect(&config)
            .await
            .map_err(|e| from_sqlx(backend, &what, e))?;
        Self::start(
            pool,
            lock_pool,
            config.dialect,
            config.strategy,
            &config.table,
            config.store_id(),
        )
        .await
    }

    /// A provider on a MySQL/MariaDB pool the application already has (see
    /// [`from_sqlite_pool`](Self::from_sqlite_pool) for SQLite), with dlock's tables named
    /// `<table>_…`; they are created if missing.
    ///
    /// The statements of `unique-insert` and `optimistic` run on the pool's connections, so a
    /// lock costs no connection of its own. `for-update` pins a connection per held or waiting
    /// lock, with autocommit off: those come from a second pool of `lock_pool_size`
    /// connections that dlock opens with the same connect options (your pool's connections
    /// are never left with a transaction open). Leases are computed on the server's clock in
    /// the session's time zone: keep sqlx's default, UTC.
    ///
    /// ```no_run
    /// # async fn demo() -> dlock_core::Result<()> {
    /// use dlock_sql::{SqlProvider, Strategy};
    /// let pool = sqlx::MySqlPool::connect("mysql://app@db.internal/shop").await.expect("pool");
    /// let locks = SqlProvider::from_mysql_pool(pool, Strategy::UniqueInsert, "dlock", 8).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad table prefix, [`Error::Connection`] if the second pool
    /// cannot connect, [`Error::Backend`] if the tables cannot be created.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub async fn from_mysql_pool(
        pool: sqlx::MySqlPool,
        strategy: Strategy,
        table: &str,
        lock_pool_size: u32,
    ) -> Result<Self> {
        config::check_table(table)?;
        let options = (*pool.connect_options()).clone();
        let store = format!(
            "mysql://{}:{}/{}#{table}/{strategy}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or_default()
        );
        let lock_pool = if strategy.pins_connections() {
            Some(
                db::mysql_pool(lock_pool_size.max(1), options, db::MYSQL_LOCKS)
                    .await
                    .map_err(|e| from_sqlx("mysql", "open the for-update pool", e))?,
            )
        } else {
            None
        };
        Self::start(
            Pool::theirs(db::Driver::MySql(pool)),
            lock_pool,
            Dialect::MySql,
            strategy,
            table,
            store,
        )
        .await
    }

    /// A provider on a SQLite pool the application already has, with dlock's tables named
    /// `<table>_…`; they are created if missing. `for-update` is not offered on SQLite.
    ///
    /// dlock's statements wait for SQLite's write lock as long as the pool's `busy_timeout`
    /// allows (sqlx's default: 5 s). The database is switched to WAL mode, as dlock does for
    /// the files it opens by URL (a setting the file keeps): in sqlx's default rollback-journal
    /// mode a reader blocks every writer, and renewals of short leases failed under load.
    ///
    /// ```no_run
    /// # async fn demo() -> dlock_core::Result<()> {
    /// use dlock_sql::{SqlProvider, Strategy};
    /// use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
    /// let options = SqliteConnectOptions::new().filename("app.db").create_if_missing(true);
    /// let pool = SqlitePool::connect_with(options).await.expect("pool");
    /// let locks = SqlProvider::from_sqlite_pool(pool, Strategy::Optimistic, "dlock").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad table prefix, [`Error::Unsupported`] for `for-update`,
    /// [`Error::Backend`] if the tables cannot be created.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub async fn from_sqlite_pool(
        pool: sqlx::SqlitePool,
        strategy: Strategy,
        table: &str,
    ) -> Result<Self> {
        config::check_table(table)?;
        if strategy == Strategy::ForUpdate {
            return Err(Error::unsupported("sqlite", "the for-update strategy"));
        }
        mounts::warn_if_shared(pool.connect_options().get_filename());
        let store = format!(
            "sqlite://{}#{table}/{strategy}",
            pool.connect_options().get_filename().display()
        );
        let pool = Pool::theirs(db::Driver::Sqlite(pool));
        setup(
            &pool,
            "sqlite",
            "switch the database to WAL mode",
            "PRAGMA journal_mode = WAL",
        )
        .await?;
        Self::start(pool, None, Dialect::Sqlite, strategy, table, store).await
    }

    /// A provider on a PostgreSQL pool the application already has, with dlock's tables named
    /// `<table>_…`; they are created if missing. As [`from_mysql_pool`](Self::from_mysql_pool):
    /// `for-update` opens a second pool of `lock_pool_size` connections with the same options.
    ///
    /// ```no_run
    /// # async fn demo() -> dlock_core::Result<()> {
    /// use dlock_sql::{SqlProvider, Strategy};
    /// let pool = sqlx::PgPool::connect("postgres://app@db.internal/shop").await.expect("pool");
    /// let locks = SqlProvider::from_pg_pool(pool, Strategy::UniqueInsert, "dlock", 8).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_mysql_pool`](Self::from_mysql_pool).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn from_pg_pool(
        pool: sqlx::PgPool,
        strategy: Strategy,
        table: &str,
        lock_pool_size: u32,
    ) -> Result<Self> {
        config::check_table(table)?;
        let options = (*pool.connect_options()).clone();
        let store = format!(
            "postgres://{}:{}/{}#{table}/{strategy}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or_default()
        );
        let lock_pool = if strategy.pins_connections() {
            Some(
                db::pg_pool(lock_pool_size.max(1), options, "5s")
                    .await
                    .map_err(|e| from_sqlx("postgres", "open the for-update pool", e))?,
            )
        } else {
            None
        };
        Self::start(
            Pool::theirs(db::Driver::Postgres(pool)),
            lock_pool,
            Dialect::Postgres,
            strategy,
            table,
            store,
        )
        .await
    }

    /// Creates the tables and the provider around its pools.
    async fn start(
        pool: Pool,
        lock_pool: Option<Pool>,
        dialect: Dialect,
        strategy: Strategy,
        table: &str,
        store_id: String,
    ) -> Result<Self> {
        let backend = backend_name(dialect);
        config::check_advisory(dialect, strategy)?;
        if strategy == Strategy::Advisory {
            check_advisory_server(&pool).await?;
        }
        let mariadb = match dialect {
            Dialect::MySql => {
                let row = query("SELECT VERSION()")
                    .fetch_one(&pool)
                    .await
                    .map_err(|e| from_sqlx(backend, "read the server version", e))?;
                let version = row
                    .text(0)
                    .map_err(|e| from_sqlx(backend, "read the server version", e))?;
                check_server_version(&version)?
            }
            Dialect::Sqlite | Dialect::Postgres => false,
        };
        let sql = Statements::new(dialect, table, mariadb, &wake::origin(&store_id));
        for ddl in &sql.ddl {
            setup(&pool, backend, "create dlock's tables", ddl).await?;
        }
        check_strategy(&pool, &sql, backend, strategy, table).await?;
        // Releases of the polling strategies are announced on PostgreSQL (for-update waiters
        // wait on the row lock itself).
        #[cfg(feature = "postgres")]
        let wakeups = match (pool.driver(), strategy) {
            (db::Driver::Postgres(p), Strategy::UniqueInsert | Strategy::Optimistic) => {
                Some(notify::Wakeups::new(
                    (*p.connect_options()).clone(),
                    notify::channel(table),
                    store_id.clone(),
                    notify::LISTEN_IDLE,
                ))
            }
            _ => None,
        };
        let provider = Self {
            inner: Arc::new(Inner {
                pool,
                lock_pool,
                sql,
                dialect,
                strategy,
                backend,
                client_id: uuid::Uuid::new_v4().to_string(),
                ids: AtomicU64::new(0),
                store_id,
                versions: Mutex::new(HashMap::new()),
                holders: Mutex::new(HashMap::new()),
                keys: Mutex::new(HashMap::new()),
                #[cfg(feature = "postgres")]
                wakeups,
            }),
        };
        if strategy == Strategy::Optimistic {
            provider.raise_seeds().await?;
        }
        Ok(provider)
    }

    /// Optimistic: keeps the seed counter above every row's versions, so a row created later
    /// (after one was deleted) starts above them. Tables of an older dlock counted versions from
    /// 0, past 2^20 for a busy name, with no seed behind them.
    async fn raise_seeds(&self) -> Result<()> {
        let inner = &self.inner;
        let err = |e| from_sqlx(inner.backend, "read the highest version", e);
        let mut conn = inner.pool.acquire().await.map_err(err)?;
        let max = query(&inner.sql.max_version)
            .fetch_one(&mut conn)
            .await
            .and_then(|row| row.int(0))
            .map_err(err)?;
        if max >= 1 << 20 {
            strategies::seed_above(inner, &mut conn, max).await?;
        }
        conn.done();
        Ok(())
    }

    /// How many release notifications this provider's listener received (PostgreSQL
    /// `unique-insert` and `optimistic`; 0 elsewhere). For tests and diagnostics.
    #[doc(hidden)]
    pub fn release_notifications(&self) -> u64 {
        #[cfg(feature = "postgres")]
        if let Some(w) = &self.inner.wakeups {
            return w.received();
        }
        0
    }

    /// Whether this provider listens for release notifications (PostgreSQL `unique-insert`
    /// and `optimistic`, from the first wait of one of its waiters on until nobody in the
    /// process has waited on its tables for about a minute; `false` elsewhere).
    /// For tests and diagnostics.
    #[doc(hidden)]
    pub fn listens_for_releases(&self) -> bool {
        #[cfg(feature = "postgres")]
        if let Some(w) = &self.inner.wakeups {
            return w.listening();
        }
        false
    }

    /// The strategy of this provider.
    pub fn strategy(&self) -> Strategy {
        self.inner.strategy
    }

    /// The dialect of this provider.
    pub fn dialect(&self) -> Dialect {
        self.inner.dialect
    }

    /// For `for-update`: the server connection id that holds `name` for this provider, if it
    /// holds it (e.g. to watch or `KILL` it).
    pub fn holder_connection_id(&self, name: &str) -> Option<u64> {
        guard(&self.inner.holders)
            .values()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, id)| *id)
    }

    /// What the database records about `name` (see [`LockProvider::describe`]).
    async fn describe_name(&self, name: &str) -> Result<LockStatus> {
        let name = LockName::new(name)?;
        let key = name.as_str().as_bytes();
        let s = &self.inner.sql;
        let backend = self.inner.backend;
        let err = |e| from_sqlx(backend, "describe", e);
        let status = match self.inner.strategy {
            Strategy::UniqueInsert => {
                let row = query(&s.describe_hold)
                    .bind(key)
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(err)?;
                match row {
                    Some(row) => {
                        let owner = row.text(0).map_err(err)?;
                        let id = row.int(1).map_err(err)?;
                        let takeovers = row.int(2).map_err(err)?;
                        let left = row.int(3).map_err(err)?;
                        // A row out of tokens has none to show (its next holder starts a
                        // new row), never a truncated one.
                        let token = strategies::unique_insert_token(id, takeovers);
                        status(left > 0, Some(owner), left, token)
                    }
                    None => LockStatus::free(None),
                }
            }
            Strategy::Optimistic => {
                let row = query(&s.describe_version)
                    .bind(key)
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(err)?;
                match row {
                    Some(row) => {
                        let owner = row.text(0).map_err(err)?;
                        let version = row.int(1).map_err(err)?;
                        let left = row.int(2).map_err(err)?;
                        let held = !owner.is_empty() && left > 0;
                        status(
                            held,
                            held.then_some(owner),
                            left,
                            u64::try_from(version).ok().filter(|v| *v > 0),
                        )
                    }
                    None => LockStatus::free(None),
                }
            }
            Strategy::Advisory => {
                let token = match query(&s.advisory_token)
                    .bind(key)
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(err)?
                {
                    Some(row) => u64::try_from(row.int(0).map_err(err)?)
                        .ok()
                        .filter(|t| *t > 0),
                    None => None,
                };
                let held = match self.inner.cached_key(&name) {
                    Some(k) => Some(k),
                    None => match query(&s.advisory_key)
                        .bind(key)
                        .fetch_optional(&self.inner.pool)
                        .await
                        .map_err(err)?
                    {
                        Some(row) => i32::try_from(row.int(0).map_err(err)?).ok(),
                        None => None,
                    },
                };
                // Who holds it is the lock manager's to say (pg_locks), without taking it.
                let (holds, shared) = match held {
                    Some(k) => {
                        let row = query(&s.advisory_holders)
                            .bind(i64::from(k))
                            .fetch_one(&self.inner.pool)
                            .await
                            .map_err(err)?;
                        (row.int(0).map_err(err)?, row.int(1).map_err(err)?)
                    }
                    None => (0, 0),
                };
                // Only shared locks: readers. An exclusive one is a mutex's or a writer's
                // (the server cannot tell them apart), said the mutex's way.
                let kind = if holds > 0 && shared == holds {
                    LockKind::Read
                } else {
                    LockKind::Mutex
                };
                if holds > 0 {
                    LockStatus::held_by(kind, Vec::new()).with_last_token(token)
                } else {
                    LockStatus::free(token)
                }
            }
            Strategy::ForUpdate => {
                let row = query(&s.describe_fence)
                    .bind(key)
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(err)?;
                let token = match row {
                    Some(row) => u64::try_from(row.int(0).map_err(err)?).ok(),
                    None => None,
                };
                let held = self.row_locked(&name).await?;
                if held {
                    LockStatus::held_by(LockKind::Mutex, Vec::new()).with_last_token(token)
                } else {
                    LockStatus::free(token)
                }
            }
        };
        Ok(status)
    }
}

impl SqlProvider {
    /// For-update: whether some connection holds `name`'s row lock, asked with a shared lock
    /// that does not wait, in a transaction rolled back at once: it never takes the lock (a
    /// plain try would) nor bumps the fence.
    async fn row_locked(&self, name: &LockName) -> Result<bool> {
        let backend = self.inner.backend;
        let Some(lock_pool) = &self.inner.lock_pool else {
            return Ok(false);
        };
        let conn = lock_pool
            .acquire()
            .await
            .map_err(|e| from_sqlx(backend, "connect", e))?;
        // Between the question (which opens a transaction) and its ROLLBACK, a dropped call
        // closes the connection: it must not go back to the pool inside that transaction.
        let mut flight = strategies::ClosedUnlessReturned(None);
        let conn = flight.0.insert(conn);
        let asked = query(&self.inner.sql.row_locked)
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

/// Creates the directory of a SQLite file (the driver creates the file, not its directory).
fn create_parent_dir(config: &SqlConfig) -> Result<()> {
    let path = config.sqlite_path()?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::Config {
            message: format!(
                "cannot create the directory {} for the SQLite file: {e}",
                dir.display()
            ),
            source: Some(Box::new(e)),
        })?;
    }
    Ok(())
}

/// Refuses a server on which fencing tokens could go backwards; says whether it is MariaDB.
///
/// The tokens come from `AUTO_INCREMENT` counters and counter rows: a server that resets
/// `AUTO_INCREMENT` on restart (MySQL before 8.0, MariaDB before 10.2.4) could hand out a
/// token twice, and `for-update` needs `NOWAIT` (MySQL 8.0, MariaDB 10.3).
fn check_server_version(version: &str) -> Result<bool> {
    let mariadb = version.contains("MariaDB");
    // MariaDB may prefix its version with "5.5.5-" for old replication clients.
    let numbers = if mariadb {
        version.strip_prefix("5.5.5-").unwrap_or(version)
    } else {
        version
    };
    let mut parts = numbers
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    let (floor, name) = if mariadb {
        ((10, 3), "MariaDB 10.3")
    } else {
        ((8, 0), "MySQL 8.0")
    };
    if (major, minor) < floor {
        return Err(Error::unsupported(
            "mysql",
            format!(
                "server version {version:?}: dlock needs {name} or later (older servers reset \
                 AUTO_INCREMENT on restart, so fencing tokens could repeat)"
            ),
        ));
    }
    Ok(mariadb)
}

/// The advisory strategy's server-side lease is `idle_session_timeout`, which PostgreSQL 14
/// brought: an older server is refused (a paused holder would keep its lock for ever).
async fn check_advisory_server(pool: &Pool) -> Result<()> {
    let err = |e| from_sqlx("postgres", "read the server version", e);
    let version = query("SELECT current_setting('server_version_num')::BIGINT")
        .fetch_one(pool)
        .await
        .and_then(|row| row.int(0))
        .map_err(err)?;
    if version < 140_000 {
        return Err(Error::unsupported(
            "postgres",
            format!(
                "the advisory strategy on server version {version}: it needs PostgreSQL 14 or \
                 later (idle_session_timeout is the lease); use for-update"
            ),
        ));
    }
    Ok(())
}

/// The backend name errors and handles carry.
fn backend_name(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::MySql => "mysql",
        Dialect::Sqlite => "sqlite",
        Dialect::Postgres => "postgres",
    }
}

fn status(held: bool, owner: Option<String>, left_ms: i64, token: Option<u64>) -> LockStatus {
    if !held {
        return LockStatus::free(token);
    }
    LockStatus::held_by(LockKind::Mutex, owner.into_iter().collect())
        .with_remaining(Some(Duration::from_millis(
            u64::try_from(left_ms).unwrap_or(0),
        )))
        .with_last_token(token)
}

#[dlock_core::async_trait]
impl LockProvider for SqlProvider {
    async fn describe(&self, name: &str) -> Result<LockStatus> {
        self.describe_name(name).await
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::all(self.inner.backend);
        caps.fair = false;
        // Readers share an advisory lock on PostgreSQL; the row strategies have one holder per
        // row.
        caps.read_write = self.inner.strategy == Strategy::Advisory;
        caps.semaphore = false;
        caps.connection_bound = self.inner.strategy.pins_connections();
        caps.min_lease = MIN_LEASE;
        caps
    }

    fn store_id(&self) -> &str {
        &self.inner.store_id
    }

    fn lock(&self, name: &str, options: LockOptions) -> Result<DynLock> {
        let name = LockName::new(name)?;
        self.capabilities().check(&options)?;
        let info = HandleInfo::new(
            self.inner.backend,
            self.inner.store_id.as_str(),
            name,
            options,
        );
        let raw = SqlMutex::new(Arc::clone(&self.inner));
        Ok(Arc::new(Lock::new(info, raw)))
    }

    fn read_write_lock(&self, name: &str, options: LockOptions) -> Result<DynReadWriteLock> {
        let name = LockName::new(name)?;
        if self.inner.strategy != Strategy::Advisory {
            return Err(Error::unsupported(
                self.inner.backend,
                "read-write locks on the row strategies (a reader count with writer exclusion \
                 needs more than one row per name; PostgreSQL's `advisory` strategy has them)",
            ));
        }
        self.capabilities().check(&options)?;
        let info = HandleInfo::new(
            self.inner.backend,
            self.inner.store_id.as_str(),
            name,
            options,
        );
        Ok(Arc::new(ReadWriteLock::new(
            info,
            SqlReadWrite::new(Arc::clone(&self.inner)),
        )))
    }

    fn semaphore(&self, name: &str, permits: u32, _options: LockOptions) -> Result<DynSemaphore> {
        LockName::new(name)?;
        if permits == 0 {
            return Err(Error::invalid_argument(
                "permits",
                "a semaphore needs at least one permit",
            ));
        }
        Err(Error::unsupported(
            self.inner.backend,
            "semaphores (N slot rows per name; not offered by the SQL strategies yet)",
        ))
    }
}

/// Records `strategy` for the tables `<table>_…` if none is recorded, and refuses a provider
/// whose strategy differs from the recorded one: two strategies on one set of tables keep
/// their holds in different tables, so they would not exclude each other (review M7).
async fn check_strategy(
    pool: &Pool,
    sql: &Statements,
    backend: &'static str,
    strategy: Strategy,
    table: &str,
) -> Result<()> {
    let give_up = dlock_core::backend::from_now(db::SETUP_PATIENCE);
    let mut pause = db::setup_pauses();
    let wanted = strategy.to_string();
    loop {
        let claimed = query(&sql.claim_strategy)
            .bind(wanted.as_str())
            .execute(pool)
            .await;
        let recorded = match claimed {
            Ok(_) => query(&sql.read_strategy).fetch_optional(pool).await,
            Err(e) => Err(e),
        };
        let recorded = match recorded {
            Ok(Some(row)) => row
                .text(0)
                .map_err(|e| from_sqlx(backend, "read the tables' strategy", e))?,
            Ok(None) => {
                return Err(Error::Backend {
                    backend,
                    message: format!("{table}_meta has no strategy after recording one"),
                    retryable: true,
                    source: None,
                });
            }
            Err(e) => {
                let e = from_sqlx(backend, "record the tables' strategy", e);
                if !e.is_retryable() || tokio::time::Instant::now() >= give_up {
                    return Err(e);
                }
                tokio::time::sleep(pause.next_pause()).await;
                continue;
            }
        };
        if recorded == wanted {
            return Ok(());
        }
        return Err(Error::config(format!(
            "the tables {table}_… serve the {recorded} strategy, and this provider asks for \
             {wanted}: two strategies on one set of tables do not exclude each other. Use \
             ?strategy={recorded} like the others, or another ?table= prefix"
        )));
    }
}

/// Runs one statement that sets up dlock's tables, again while the database answers that it
/// is busy (for `db::SETUP_PATIENCE`) or that the table appeared meanwhile (twice):
/// - several applications opening one new SQLite file at once race to switch it to WAL and
///   create the tables; in rollback-journal mode SQLite answers a lock upgrade that would
///   deadlock with `SQLITE_BUSY` at once, without waiting for its busy timeout;
/// - two providers creating one PostgreSQL table at once: one of them fails on the catalog's
///   unique index although the statement says IF NOT EXISTS. The next try sees the table.
async fn setup(pool: &Pool, backend: &'static str, what: &str, sql: &str) -> Result<()> {
    let give_up = dlock_core::backend::from_now(db::SETUP_PATIENCE);
    let mut pause = db::setup_pauses();
    let mut duplicates = 0;
    loop {
        let e = match pool.raw(sql).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        // Another application creating the same tables at this moment: the next try finds them.
        let duplicate = error::created_meanwhile(&e);
        let e = from_sqlx(backend, what, e);
        let again = if duplicate {
            duplicates += 1;
            duplicates < 3
        } else {
            e.is_retryable() && tokio::time::Instant::now() < give_up
        };
        if !again {
            return Err(e);
        }
        tracing::debug!(error = %e, "setting up dlock's tables: trying again");
        tokio::time::sleep(pause.next_pause()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::check_server_version;

    #[test]
    fn servers_that_could_repeat_tokens_are_refused() {
        assert!(check_server_version("10.11.19-MariaDB-0+deb12u1").unwrap());
        assert!(!check_server_version("8.0.36").unwrap());
        assert!(!check_server_version("8.4.0-commercial").unwrap());
        assert!(check_server_version("5.5.5-10.3.39-MariaDB").unwrap());
        for old in [
            "5.7.44-log",
            "10.2.44-MariaDB",
            "5.5.5-10.1.48-MariaDB",
            "garbage",
        ] {
            let e = check_server_version(old).unwrap_err();
            assert!(
                matches!(e, dlock_core::Error::Unsupported { .. }),
                "{old}: {e}"
            );
        }
    }
}
