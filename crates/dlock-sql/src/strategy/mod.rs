//! The strategies behind one trait: each keeps its statements per dialect and its caches, and
//! makes one attempt at a time for the wait loop ([`crate::wait`]).
//!
//! | strategy | module | how a lock is held | how a waiter waits |
//! | --- | --- | --- | --- |
//! | unique-insert | [`unique_insert`] | a row per held lock, with a lease | polls (woken by releases) |
//! | optimistic | [`optimistic`] | a claimed version of the name's row, with a lease | polls (woken by releases) |
//! | for-update | [`for_update`] (MySQL), [`advisory`] (PostgreSQL) | a row lock of a pinned MySQL connection's transaction; on PostgreSQL an advisory lock | on the row lock, the advisory lock |
//! | advisory | [`advisory`] | an advisory lock of a pinned PostgreSQL session | on the advisory lock |
//! | get-lock | [`get_lock`] | a named lock (`GET_LOCK`) of a pinned MySQL session | in `GET_LOCK` |
//!
//! The row strategies share [`rows`] (the attempt on one connection, undone if dropped, the
//! hold of an owner-checked row, and their [`LockStrategy`]) and [`prune`] (the deletion of
//! rows nobody has held for a while); the pinned ones share
//! [`crate::pinned`] (the connection is the lease, and their holds' check and renewal).
//!
//! The provider makes its strategy once ([`build`]); past its set-up (the checks of the server,
//! the capabilities), nothing asks which strategy it is.
//! The two features only one strategy has reach it through the trait: locks in the caller's
//! transaction ([`LockStrategy::for_update`]) and read-write locks
//! ([`LockStrategy::advisory`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Deadline, Hold, HoldSignal, Mutex};
use dlock_core::{Error, LockKind, LockName, LockStatus, Result, async_trait};
use tokio::time::Instant;

use crate::Inner;
use crate::config::{Dialect, Strategy};
use crate::db::{Row, query};
use crate::sql::Tables;

pub(crate) mod advisory;
pub(crate) mod for_update;
pub(crate) mod get_lock;
pub(crate) mod optimistic;
pub(crate) mod prune;
pub(crate) mod rows;
pub(crate) mod unique_insert;

pub(crate) use crate::attempt::{Attempt, CONNECT_GRACE};
pub(crate) use advisory::Advisory;
pub(crate) use for_update::ForUpdate;

/// The low bits of a fencing token that count within a row: unique-insert tokens are the
/// row's AUTO_INCREMENT id in the high bits (it only grows, across deletes and restarts) and
/// the takeovers of that row in the low bits; optimistic versions are a seed (an
/// AUTO_INCREMENT number) in the high bits and the claims since the row got it in the low
/// bits.
pub(crate) const TAKEOVER_BITS: u32 = 20;

/// One way of keeping locks in the database.
#[async_trait]
pub(crate) trait LockStrategy: fmt::Debug + Send + Sync + 'static {
    /// One attempt of `attempt`'s owner to take its lock exclusively, until `deadline`: the
    /// pinned strategies wait on the server, the row strategies try once. `Ok(None)`: the
    /// database answered that the lock is held.
    ///
    /// Cancel safe: dropped at any await, it leaves nothing behind on the server.
    async fn try_lock(
        self: Arc<Self>,
        attempt: Attempt,
        deadline: Deadline,
    ) -> Result<Option<Grant>>;

    /// What the database records about `name`.
    async fn describe(&self, name: &LockName) -> Result<LockStatus>;

    /// Work on the tables once they exist, before the first lock.
    async fn prepare(&self) -> Result<()> {
        Ok(())
    }

    /// The server connection id that holds `name` for this provider, if it holds it (pinned
    /// strategies).
    fn holder_connection_id(&self, name: &str) -> Option<u64> {
        let _ = name;
        None
    }

    /// This strategy as for-update (for locks in the caller's transaction).
    #[cfg(feature = "mysql")]
    fn for_update(self: Arc<Self>) -> Option<Arc<ForUpdate>> {
        None
    }

    /// This strategy as advisory (for read-write locks).
    fn advisory(self: Arc<Self>) -> Option<Arc<Advisory>> {
        None
    }
}

/// The strategy `kind` on `inner`'s database, with its statements for `tables`; the row
/// strategies delete the rows of names nobody has held for `prune_after`.
///
/// for-update on PostgreSQL is held as an advisory lock of the session, outside any
/// transaction: a PostgreSQL row lock needs a transaction id, and a transaction id held open
/// keeps `VACUUM` from removing any row version that dies after it, in every table of the
/// database, for as long as the lock is held. Locks in the caller's transaction
/// ([`crate::SqlProvider::lock_in_pg`]) take the same key with a transaction-level advisory
/// lock.
pub(crate) fn build(
    kind: Strategy,
    inner: &Arc<Inner>,
    tables: Tables<'_>,
    prune_after: Option<Duration>,
) -> Arc<dyn LockStrategy> {
    let inner = Arc::clone(inner);
    match kind {
        Strategy::UniqueInsert => {
            Arc::new(unique_insert::UniqueInsert::new(inner, tables, prune_after))
        }
        Strategy::Optimistic => Arc::new(optimistic::Optimistic::new(inner, tables, prune_after)),
        Strategy::ForUpdate if inner.dialect == Dialect::Postgres => {
            Arc::new(Advisory::new(inner, tables))
        }
        Strategy::ForUpdate => Arc::new(ForUpdate::new(inner, tables)),
        Strategy::Advisory => Arc::new(Advisory::new(inner, tables)),
        Strategy::GetLock => Arc::new(get_lock::GetLock::new(inner, tables)),
    }
}

/// A lock just granted: the backend's hold, its fencing token, when the statement that the
/// store granted was sent (the lease runs from there), and the loss signal of a hold whose
/// backend reports losses itself.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) hold: Arc<dyn Hold>,
    pub(crate) token: u64,
    pub(crate) sent: Instant,
    pub(crate) signal: Option<HoldSignal>,
}

/// The row that `statement` reads about `name` (its one argument) on the pool, if there is
/// one; a failure is an error about `what`.
pub(crate) async fn read_row(
    inner: &Inner,
    statement: &str,
    name: &LockName,
    what: &'static str,
) -> Result<Option<Row>> {
    query(statement)
        .bind(name.as_str().as_bytes())
        .fetch_optional(&inner.pool)
        .await
        .map_err(inner.err(what))
}

/// The driver gave no id where the statement always produces one.
pub(crate) fn missing_id(backend: &'static str, name: &LockName) -> Error {
    unusable(backend, format!("the database returned no id for {name:?}"))
}

/// The database answered with what dlock cannot use (a missing id, a number past what a
/// fencing token holds): a backend error that trying again does not mend.
pub(crate) fn unusable(backend: &'static str, message: impl fmt::Display) -> Error {
    Error::backend_failed(backend, message, false)
}

/// A duration in whole milliseconds, at least 1, as the lease statements bind it.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// A lock a row strategy's row shows: free, or held by `owner` for `left_ms` more.
pub(crate) fn status(
    held: bool,
    owner: Option<String>,
    left_ms: i64,
    token: Option<u64>,
) -> LockStatus {
    if !held {
        return LockStatus::free(token);
    }
    LockStatus::held_by(LockKind::Mutex, owner.into_iter().collect())
        .with_remaining(Some(Duration::from_millis(
            u64::try_from(left_ms).unwrap_or(0),
        )))
        .with_last_token(token)
}

/// A value remembered per name (a version seen, an advisory key), which starts afresh past
/// 10,000 names.
#[derive(Debug)]
pub(crate) struct NameCache<V>(Mutex<HashMap<LockName, V>>);

impl<V: Copy> NameCache<V> {
    pub(crate) fn new() -> Self {
        Self(Mutex::new(HashMap::new()))
    }

    pub(crate) fn get(&self, name: &LockName) -> Option<V> {
        self.0.lock().get(name).copied()
    }

    pub(crate) fn remember(&self, name: &LockName, value: V) {
        let mut cache = self.0.lock();
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(name.clone(), value);
    }

    pub(crate) fn forget(&self, name: &LockName) {
        self.0.lock().remove(name);
    }
}
