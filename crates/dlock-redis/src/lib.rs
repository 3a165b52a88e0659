#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

mod acquire;
mod config;
mod conn;
mod error;
mod handles;
mod pubsub;
mod scripts;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_core::backend::{
    Backoff, HandleInfo, HoldSignal, Lock, ReadWriteLock, Semaphore, from_now,
};
use dlock_core::{
    Capabilities, DynLock, DynReadWriteLock, DynSemaphore, Error, LockName, LockOptions,
    LockProvider, LossReason, Result,
};
use tokio::time::Instant;

use crate::acquire::Acquisition;
pub use crate::config::{DEFAULT_SENTINEL_PORT, PubSubMode, RedisConfig, SentinelConfig};
use crate::conn::Conn;
use crate::handles::{RedisMutex, RedisReadWrite, RedisSemaphore};
use crate::pubsub::Subscriptions;
use crate::scripts::Keys;

/// The two scripts of an uncontended mutex cycle, for measuring the raw floor of a cycle
/// (`dlock bench` runs them with plain redis-rs). Not API-stable.
#[doc(hidden)]
pub mod raw {
    /// Acquire: KEYS `name`, `redisson_lock_token:{name}`; ARGV lease ms, field.
    pub fn lock_script() -> &'static redis::Script {
        &crate::scripts::LOCK
    }

    /// Release: KEYS `name`, `redisson_lock__channel:{name}`; ARGV `0`, lease ms, field,
    /// `publish`.
    pub fn unlock_script() -> &'static redis::Script {
        &crate::scripts::UNLOCK
    }
}

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["redis", "rediss", "redis+sentinel"];

pub(crate) const BACKEND: &str = "redis";

/// The shortest lease this backend accepts (Redis expires keys with millisecond precision;
/// shorter leases would expire before a renewal could reach the server).
pub const MIN_LEASE: Duration = Duration::from_millis(30);

/// Redisson's default fair-lock wait: how long a queued waiter has to take its turn before
/// the others skip it.
pub const DEFAULT_FAIR_WAIT: Duration = Duration::from_secs(300);

/// A client of one Redis server or cluster: two connections (commands, subscriptions) shared
/// by every handle it creates. Cloning is cheap.
#[derive(Clone)]
pub struct RedisProvider {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) subs: Arc<Subscriptions>,
    /// Redisson's client id: a fresh v4 UUID per client.
    pub(crate) client_id: String,
    pub(crate) store_id: String,
    pub(crate) fair_wait: Duration,
    /// Replicas that must acknowledge a grant (`?wait_replicas=`), and how long to wait.
    pub(crate) wait_replicas: u32,
    pub(crate) wait_timeout: Duration,
    holds: AtomicU64,
    /// Every live hold of this provider, checked after a disconnection.
    live: Mutex<HashMap<u64, (Weak<Acquisition>, HoldSignal)>>,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisProvider")
            .field("store", &self.store_id)
            .field("client_id", &self.client_id)
            .finish()
    }
}

impl fmt::Debug for RedisProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

impl Inner {
    /// Registers a live hold, to be checked after a disconnection; returns its id.
    pub(crate) fn register(&self, acq: &Arc<Acquisition>, signal: &HoldSignal) -> u64 {
        let id = self.holds.fetch_add(1, Ordering::Relaxed) + 1;
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, (Arc::downgrade(acq), signal.clone()));
        id
    }

    fn is_registered(&self, id: u64) -> bool {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&id)
    }

    fn has_holds(&self) -> bool {
        !self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// After a disconnection (a restart without persistence, a flush, a failover may have
    /// taken holds away): once the server answers again, asks it about every live hold in one
    /// round trip each, and reports the missing ones lost at once, instead of at their next
    /// renewal (ttl/3 away) or, for fixed leases, at their lease end (review M1).
    async fn check_holds(&self) {
        let mut pause = Backoff::new(Duration::from_millis(50), acquire::OUTAGE_PAUSE_MAX);
        let give_up = from_now(CHECK_WINDOW);
        loop {
            let holds: Vec<(u64, Arc<Acquisition>, HoldSignal)> = self
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .filter_map(|(id, (acq, signal))| Some((*id, acq.upgrade()?, signal.clone())))
                .collect();
            let mut unreachable = false;
            for (id, acq, signal) in holds {
                match acq.still_held().await {
                    Ok(true) => {}
                    // Released meanwhile (a release unregisters first): not a loss.
                    Ok(false) if !self.is_registered(id) => {}
                    Ok(false) => {
                        if signal.mark_lost(LossReason::Gone) {
                            tracing::warn!(lock = %acq.name, "redis hold gone after a disconnection");
                        }
                    }
                    Err(e) if e.is_retryable() => {
                        unreachable = true;
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(lock = %acq.name, error = %e, "could not check a hold");
                    }
                }
            }
            if !unreachable || Instant::now() >= give_up {
                return;
            }
            pause.wait().await;
        }
    }

    /// A fresh hash field for one hold: `<client uuid>:<hold id>` (Redisson's
    /// `<client uuid>:<thread id>`).
    pub(crate) fn next_field(&self) -> String {
        let id = self.holds.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}:{id}", self.client_id)
    }
}

/// How long after a disconnection the holds are checked for, while the server is away.
const CHECK_WINDOW: Duration = Duration::from_secs(120);

/// Checks the provider's holds after every disconnection, until the provider is dropped.
/// While holds are live, the subscription connection is also pinged every 10 s: a connection
/// that broke with nothing to send would otherwise stay broken (the manager reconnects only
/// when used) and report no further disconnection.
async fn watch_disconnects(inner: Weak<Inner>, disconnects: Arc<tokio::sync::Notify>) {
    loop {
        // Wake now and then to notice a dropped provider, and to ping.
        let told = tokio::time::timeout(Duration::from_secs(10), disconnects.notified()).await;
        let Some(inner) = inner.upgrade() else { return };
        if told.is_ok() || (inner.has_holds() && inner.subs.ping().await.is_err()) {
            inner.check_holds().await;
        }
    }
}

impl RedisProvider {
    /// Connects to the server (or cluster) a `redis://` / `rediss://` URL names.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad URL, [`Error::Connection`] if the server cannot be reached
    /// (the message names the address, never the password).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(RedisConfig::from_url(url)?).await
    }

    /// Connects through a client the application already built (its address, credentials,
    /// TLS and TCP settings), with the default options; see [`RedisConfig::from_client`] to
    /// change them. Opens dlock's own two connections from it.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn from_client(client: &redis::Client) -> Result<Self> {
        Self::connect_with(RedisConfig::from_client(client)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with(config: RedisConfig) -> Result<Self> {
        let config = config.checked()?;
        let conn =
            Conn::connect(&config, None::<Arc<fn(redis::PushInfo) -> Result<(), ()>>>).await?;
        // The command connection decided sharded or classic (probing the cluster once); the
        // subscription connection follows it, so releases and waiters never disagree.
        let mut sub_config = config.clone();
        if config.cluster {
            sub_config.pubsub = if conn.sharded() {
                PubSubMode::Sharded
            } else {
                PubSubMode::Classic
            };
        }
        let subs = Subscriptions::connect(&sub_config).await?;
        let disconnects = subs.disconnects();
        let inner = Arc::new(Inner {
            conn,
            subs,
            client_id: uuid::Uuid::new_v4().to_string(),
            store_id: config.store_id(),
            fair_wait: config.fair_wait,
            wait_replicas: config.wait_replicas,
            wait_timeout: config.response_timeout / 2,
            holds: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
        });
        tokio::spawn(watch_disconnects(Arc::downgrade(&inner), disconnects));
        Ok(Self { inner })
    }

    /// Redisson's client id of this provider: the first part of its hash fields.
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }

    /// Channels this provider is subscribed to right now (all waiters share one connection).
    pub fn subscriptions(&self) -> usize {
        self.inner.subs.subscribed()
    }

    /// Pub/sub messages delivered to this provider so far.
    pub fn messages_delivered(&self) -> u64 {
        self.inner.subs.delivered()
    }

    /// What Redis stores for `name` (see [`LockProvider::describe`]): whether a mutex, fair,
    /// read or write hold is there, the holders' hash fields (Redisson's
    /// `<client uuid>:<thread id>`), the remaining PTTL and the last fencing token.
    async fn describe_name(&self, name: &str) -> Result<dlock_core::LockStatus> {
        let (_, keys) = self.name(name)?;
        let mut invocation = scripts::DESCRIBE.prepare_invoke();
        invocation.key(&keys.name).key(&keys.token);
        let reply: redis::Value = self.inner.conn.script("describe", &invocation).await?;
        let redis::Value::Array(items) = reply else {
            return Err(error::unexpected("describe", reply));
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => {
                Some(s.clone())
            }
            _ => None,
        };
        let kind = items.first().and_then(text).unwrap_or_default();
        let pttl = match items.get(1) {
            Some(redis::Value::Int(ms)) if *ms > 0 => {
                Some(Duration::from_millis(u64::try_from(*ms).unwrap_or(0)))
            }
            _ => None,
        };
        let token = items.get(2).and_then(text).and_then(|t| t.parse().ok());
        let fields: Vec<String> = match items.get(3) {
            Some(redis::Value::Array(fields)) => fields.iter().filter_map(text).collect(),
            _ => Vec::new(),
        };
        let holders: Vec<String> = fields.into_iter().filter(|f| f != "mode").collect();
        if kind != "hash" || holders.is_empty() {
            return Ok(dlock_core::LockStatus::free(token));
        }
        // A write hold keeps `mode = write` while its owner also reads (a downgrade): the lock
        // is exclusive until the write hold ends.
        let lock_kind = match items.get(4).and_then(text).as_deref() {
            Some("write") => dlock_core::LockKind::Write,
            Some(_) => dlock_core::LockKind::Read,
            None => dlock_core::LockKind::Mutex,
        };
        Ok(dlock_core::LockStatus::held_by(lock_kind, holders)
            .with_remaining(pttl)
            .with_last_token(token))
    }

    fn info(&self, name: LockName, options: LockOptions) -> HandleInfo {
        HandleInfo::new(BACKEND, self.inner.store_id.as_str(), name, options)
    }

    fn name(&self, name: &str) -> Result<(LockName, Arc<Keys>)> {
        let name = LockName::new(name)?;
        if let Some(whose) = scripts::bookkeeping_key(name.as_str()) {
            return Err(Error::InvalidName {
                name: name.to_string(),
                reason: format!(
                    "it is the key where the lock layout keeps {whose}, so the two would \
                     overwrite each other (in Redisson too)"
                ),
            });
        }
        if self.inner.conn.is_cluster()
            && name.as_str().contains(['{', '}'])
            && scripts::hash_tag(name.as_str()).is_none()
        {
            return Err(Error::InvalidName {
                name: name.to_string(),
                reason: "in a Redis Cluster a name with `{` or `}` needs a non-empty {hash \
                         tag}, or its keys would fall in different slots"
                    .into(),
            });
        }
        // Shared by every acquisition of the handle (cloning ten keys per acquisition showed).
        let keys = Arc::new(Keys::new(name.as_str()));
        Ok((name, keys))
    }
}

#[dlock_core::async_trait]
impl LockProvider for RedisProvider {
    async fn describe(&self, name: &str) -> Result<dlock_core::LockStatus> {
        self.describe_name(name).await
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::all(BACKEND);
        caps.min_lease = MIN_LEASE;
        caps
    }

    fn store_id(&self) -> &str {
        &self.inner.store_id
    }

    fn lock(&self, name: &str, options: LockOptions) -> Result<DynLock> {
        let (name, keys) = self.name(name)?;
        self.capabilities().check(&options)?;
        let raw = RedisMutex {
            inner: Arc::clone(&self.inner),
            keys,
        };
        Ok(Arc::new(Lock::new(self.info(name, options), raw)))
    }

    fn read_write_lock(&self, name: &str, options: LockOptions) -> Result<DynReadWriteLock> {
        let (name, keys) = self.name(name)?;
        self.capabilities().check(&options)?;
        if options.fair {
            return Err(Error::unsupported(
                BACKEND,
                "fair read-write locks (Redisson has none to be compatible with)",
            ));
        }
        let raw = RedisReadWrite {
            inner: Arc::clone(&self.inner),
            keys,
            write_field: std::sync::Mutex::new(None),
        };
        Ok(Arc::new(ReadWriteLock::new(self.info(name, options), raw)))
    }

    fn semaphore(&self, name: &str, permits: u32, options: LockOptions) -> Result<DynSemaphore> {
        let (name, keys) = self.name(name)?;
        let caps = self.capabilities();
        caps.check_permits(permits)?;
        caps.check(&options)?;
        if options.fair {
            return Err(Error::unsupported(
                BACKEND,
                "fair semaphores (Redisson has none to be compatible with)",
            ));
        }
        let raw = RedisSemaphore {
            inner: Arc::clone(&self.inner),
            keys,
        };
        Ok(Arc::new(Semaphore::new(
            self.info(name, options),
            permits,
            raw,
        )))
    }
}
