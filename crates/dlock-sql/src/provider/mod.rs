//! The provider: a client of one database with one strategy, the core's [`RawProvider`] over
//! it (the core adds the checks every backend shares), and what every strategy of it shares
//! ([`Inner`]: the pools, the owners of its acquisitions, the wake-ups of its waiters).
//!
//! - [`open`]: making a provider (from a URL or the application's pool), the checks of the
//!   server and the set-up of the tables.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::backend::{NoPrimitive, ProviderMeta, RawProvider};
use dlock_core::{Error, LockName, LockOptions, LockStatus, Result};

use crate::config::{Dialect, Strategy};
use crate::db::Pool;
use crate::election::{ElectionSql, SqlElection, SqlProposals};
use crate::error::from_sqlx;
use crate::handles::{SqlMutex, SqlReadWrite};
use crate::strategy::LockStrategy;
use crate::wait::WakeSources;

mod open;

/// The URL schemes this backend serves (with the features that enable them).
pub const SCHEMES: &[&str] = &[
    #[cfg(feature = "mysql")]
    "mysql",
    #[cfg(feature = "mysql")]
    "mariadb",
    #[cfg(feature = "_sqlite")]
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
    pub(crate) strategy: Arc<dyn LockStrategy>,
    meta: ProviderMeta,
    elections: Arc<ElectionSql>,
}

/// What every strategy of a provider shares: its database and how to name an acquisition.
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    /// For the pinned strategies only: connections with autocommit off, one per held or
    /// waiting lock.
    pub(crate) lock_pool: Option<Pool>,
    /// For `for-update` on the application's pool: connections of the provider's own for the
    /// statements `lock_in` makes beside the caller's transaction (the lock's row, its token),
    /// which must never wait for a connection of the caller's pool.
    #[cfg_attr(not(any(feature = "mysql", feature = "postgres")), allow(dead_code))]
    pub(crate) beside: Option<Pool>,
    pub(crate) dialect: Dialect,
    pub(crate) strategy: Strategy,
    pub(crate) backend: &'static str,
    pub(crate) store_id: String,
    /// Where this provider's waiters are woken from.
    pub(crate) wakes: WakeSources,
    client_id: String,
    ids: AtomicU64,
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
    /// The pool of the statements a `lock_in` makes beside the caller's transaction.
    #[cfg(any(feature = "mysql", feature = "postgres"))]
    pub(crate) fn beside_the_callers(&self) -> &Pool {
        self.beside.as_ref().unwrap_or(&self.pool)
    }

    /// A fresh owner for one acquisition: `<client uuid>:<n>`.
    pub(crate) fn next_owner(&self) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}:{n}", self.client_id)
    }

    /// The error of a statement that failed while doing `what`.
    pub(crate) fn err(&self, what: &'static str) -> impl Fn(sqlx::Error) -> Error + Copy + use<> {
        let backend = self.backend;
        move |e| from_sqlx(backend, what, e)
    }

    /// Wakes a waiter of `name` in this process after a release.
    pub(crate) fn released(&self, name: &LockName) {
        self.wakes.released(name);
    }
}

impl SqlProvider {
    /// How many release notifications this provider's listener received (PostgreSQL
    /// `unique-insert` and `optimistic`; 0 elsewhere). For tests and diagnostics.
    #[doc(hidden)]
    pub fn release_notifications(&self) -> u64 {
        #[cfg(feature = "postgres")]
        if let Some(w) = self.inner.wakes.listener() {
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
        if let Some(w) = self.inner.wakes.listener() {
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
        self.strategy.holder_connection_id(name)
    }
}

impl RawProvider for SqlProvider {
    type Mutex = SqlMutex;
    type ReadWrite = SqlReadWrite;
    type Semaphore = NoPrimitive;
    type Election = SqlElection;

    fn meta(&self) -> &ProviderMeta {
        &self.meta
    }

    fn raw_lock(&self, _name: &LockName, _options: &LockOptions) -> Result<SqlMutex> {
        Ok(SqlMutex::new(
            Arc::clone(&self.inner),
            Arc::clone(&self.strategy),
        ))
    }

    fn raw_read_write(&self, _name: &LockName, _options: &LockOptions) -> Result<SqlReadWrite> {
        match Arc::clone(&self.strategy).advisory() {
            Some(advisory) => Ok(SqlReadWrite::new(Arc::clone(&self.inner), advisory)),
            None => Err(Error::unsupported(
                self.inner.backend,
                "read-write locks on the row strategies (a reader count with writer exclusion \
                 needs more than one row per name; PostgreSQL's `advisory` strategy has them)",
            )),
        }
    }

    fn raw_election(&self, name: &LockName, options: &LockOptions) -> Result<SqlElection> {
        let proposals = SqlProposals {
            strategy: Arc::clone(&self.strategy),
            inner: Arc::clone(&self.inner),
            sql: Arc::clone(&self.elections),
            name: name.clone(),
        };
        Ok(SqlElection::new(self.raw_lock(name, options)?, proposals))
    }

    async fn raw_describe(&self, name: &LockName) -> Result<LockStatus> {
        self.strategy.describe(name).await
    }
}
