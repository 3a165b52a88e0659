#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

mod config;
mod error;
mod handles;
mod sql;
mod strategies;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dlock_core::backend::{HandleInfo, Lock};
use dlock_core::{
    Capabilities, DynLock, DynReadWriteLock, DynSemaphore, Error, LockKind, LockName, LockOptions,
    LockProvider, LockStatus, Result,
};
use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, Executor};

pub use crate::config::{Dialect, SqlConfig, Strategy};
use crate::error::from_sqlx;
use crate::handles::SqlMutex;
use crate::sql::Statements;

/// The URL schemes this backend serves (with the features that enable them).
pub const SCHEMES: &[&str] = &[
    #[cfg(feature = "mysql")]
    "mysql",
    #[cfg(feature = "mysql")]
    "mariadb",
    #[cfg(feature = "sqlite")]
    "sqlite",
];

/// The shortest lease this backend accepts.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// A client of one database: a connection pool (plus, for `for-update`, a pool of connections
/// that hold row locks), shared by every handle it creates. Cloning is cheap.
#[derive(Clone)]
pub struct SqlProvider {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: AnyPool,
    /// For-update only: connections with autocommit off, one per held or waiting lock.
    pub(crate) lock_pool: Option<AnyPool>,
    pub(crate) sql: Statements,
    pub(crate) dialect: Dialect,
    pub(crate) strategy: Strategy,
    pub(crate) backend: &'static str,
    client_id: String,
    ids: AtomicU64,
    pub(crate) store_id: String,
    /// Optimistic: the version last seen per name (saves the read before the claim).
    versions: Mutex<HashMap<LockName, i64>>,
    /// For-update: owner of each live hold → (name, server connection id).
    holders: Mutex<HashMap<String, (LockName, u64)>>,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
        let mut versions = guard(&self.versions);
        if versions.len() > 10_000 {
            versions.clear();
        }
        versions.insert(name.clone(), version);
    }

    pub(crate) async fn create_row(&self, name: &LockName) -> Result<()> {
        // A plain SELECT reads without locking; INSERT IGNORE would wait for a holder's lock.
        let exists = sqlx::query(&self.sql.row_exists)
            .bind(name.as_str().as_bytes())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| from_sqlx(self.backend, "look for the lock row", e))?;
        if exists.is_some() {
            return Ok(());
        }
        sqlx::query(&self.sql.insert_row)
            .bind(name.as_str().as_bytes())
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx(self.backend, "create the lock row", e))?;
        Ok(())
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
        install_default_drivers();
        let backend = match config.dialect {
            Dialect::MySql => "mysql",
            Dialect::Sqlite => "sqlite",
        };
        let enabled = match config.dialect {
            Dialect::MySql => cfg!(feature = "mysql"),
            Dialect::Sqlite => cfg!(feature = "sqlite"),
        };
        if !enabled {
            return Err(Error::config(format!(
                "dlock-sql was built without its `{backend}` feature"
            )));
        }
        if config.table.is_empty()
            || config.table.len() > 40
            || !config
                .table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(Error::config(format!(
                "table={:?}: a table prefix is 1 to 40 of [A-Za-z0-9_]",
                config.table
            )));
        }
        if config.dialect == Dialect::Sqlite && config.strategy == Strategy::ForUpdate {
            return Err(Error::unsupported("sqlite", "the for-update strategy"));
        }
        let sqlite = config.dialect == Dialect::Sqlite;
        if sqlite {
            create_parent_dir(&config)?;
        }
        let what = format!("connect to {}", config.url);
        let busy_ms = i64::try_from(config.busy_timeout.as_millis()).unwrap_or(5000);
        // No ping on every checkout: a dead connection shows as a statement error, which is
        // retried (and for a hold, reported as a loss); the ping would double each cycle's
        // round trips.
        let pool = AnyPoolOptions::new()
            .max_connections(config.pool)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if sqlite {
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute(format!("PRAGMA busy_timeout = {busy_ms}").as_str())
                            .await?;
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                    } else {
                        // Short statements only: one that waits on a row lock longer than this
                        // is answered as busy and retried by the caller.
                        conn.execute("SET SESSION innodb_lock_wait_timeout = 2")
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect(config.url.expose().as_str())
            .await
            .map_err(|e| from_sqlx(backend, &what, e))?;
        let sql = Statements::new(config.dialect, &config.table);
        for ddl in &sql.ddl {
            pool.execute(ddl.as_str())
                .await
                .map_err(|e| from_sqlx(backend, "create dlock's tables", e))?;
        }
        let lock_pool = if config.strategy == Strategy::ForUpdate {
            Some(
                AnyPoolOptions::new()
                    .max_connections(config.pool)
                    .test_before_acquire(false)
                    .acquire_timeout(Duration::from_secs(10))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            // Every SELECT … FOR UPDATE opens a transaction that COMMIT ends; a
                            // blocked one gives up after 5 s and is tried again.
                            conn.execute("SET autocommit = 0").await?;
                            conn.execute("SET SESSION innodb_lock_wait_timeout = 5")
                                .await?;
                            Ok(())
                        })
                    })
                    .connect(config.url.expose().as_str())
                    .await
                    .map_err(|e| from_sqlx(backend, &what, e))?,
            )
        } else {
            None
        };
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                lock_pool,
                sql,
                dialect: config.dialect,
                strategy: config.strategy,
                backend,
                client_id: uuid::Uuid::new_v4().to_string(),
                ids: AtomicU64::new(0),
                store_id: config.store_id(),
                versions: Mutex::new(HashMap::new()),
                holders: Mutex::new(HashMap::new()),
            }),
        })
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
        use sqlx::Row;
        let status = match self.inner.strategy {
            Strategy::UniqueInsert => {
                let row = sqlx::query(&s.describe_hold)
                    .bind(key)
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(err)?;
                match row {
                    Some(row) => {
                        let owner: String = row.try_get(0).map_err(err)?;
                        let id: i64 = row.try_get(1).map_err(err)?;
                        let takeovers: i64 = row.try_get(2).map_err(err)?;
                        let left: i64 = row.try_get(3).map_err(err)?;
                        let token = (u64::try_from(id).unwrap_or(0) << 20)
                            | u64::try_from(takeovers).unwrap_or(0);
                        status(left > 0, Some(owner), left, Some(token))
                    }
                    None => LockStatus::free(None),
                }
            }
            Strategy::Optimistic => {
                let row = sqlx::query(&s.describe_version)
                    .bind(key)
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(err)?;
                match row {
                    Some(row) => {
                        let owner: String = row.try_get(0).map_err(err)?;
                        let version: i64 = row.try_get(1).map_err(err)?;
                        let left: i64 = row.try_get(2).map_err(err)?;
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
            Strategy::ForUpdate => {
                let row = sqlx::query(&s.describe_fence)
                    .bind(key)
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(err)?;
                let token = match row {
                    Some(row) => u64::try_from(row.try_get::<i64, _>(0).map_err(err)?).ok(),
                    None => None,
                };
                // Whether a row lock is held cannot be read without taking it: try NOWAIT.
                let lock = self.lock(name.as_str(), LockOptions::default())?;
                let held = match lock.try_acquire(Duration::ZERO).await? {
                    Some(g) => {
                        let _ = g.release().await;
                        false
                    }
                    None => true,
                };
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

/// Creates the directory of a SQLite file (the driver creates the file, not its directory).
///
/// The URL holds the path percent-encoded (a space is `%20`), and sqlx decodes it: so must
/// this, or `/home/Jane Doe/...` would get a directory named `Jane%20Doe` (review M3).
fn create_parent_dir(config: &SqlConfig) -> Result<()> {
    let text = config.url.expose().as_str();
    let encoded = text
        .strip_prefix("sqlite://")
        .unwrap_or(text)
        .split('?')
        .next()
        .unwrap_or_default();
    let path = percent_decode(encoded).ok_or_else(|| {
        Error::config(format!(
            "the SQLite path {encoded:?} is not valid UTF-8 once decoded"
        ))
    })?;
    if let Some(dir) = std::path::Path::new(&path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
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

/// Decodes `%XX` escapes (as sqlx does for SQLite paths); `None` if the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                let value = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
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
        caps.read_write = false;
        caps.semaphore = false;
        caps.connection_bound = self.inner.strategy == Strategy::ForUpdate;
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
        let raw = SqlMutex {
            inner: Arc::clone(&self.inner),
        };
        Ok(Arc::new(Lock::new(info, raw)))
    }

    fn read_write_lock(&self, name: &str, _options: LockOptions) -> Result<DynReadWriteLock> {
        LockName::new(name)?;
        Err(Error::unsupported(
            self.inner.backend,
            "read-write locks (a reader count with writer exclusion needs more than one row per \
             name; not offered by the SQL strategies yet)",
        ))
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

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn percent_decoding_matches_the_driver() {
        assert_eq!(
            percent_decode("/home/Jane%20Doe/x.db").unwrap(),
            "/home/Jane Doe/x.db"
        );
        assert_eq!(
            percent_decode("/home/jos%C3%A9/x.db").unwrap(),
            "/home/josé/x.db"
        );
        assert_eq!(percent_decode("/a%2/b%zz%").unwrap(), "/a%2/b%zz%");
        assert!(percent_decode("/bad%FF").is_none());
    }
}
