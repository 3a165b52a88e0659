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

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::{
    Capabilities, DynLock, DynReadWriteLock, DynSemaphore, Error, LockName, LockOptions,
    LockProvider, Result,
};

pub use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::handles::{RedisLock, RedisReadWriteLock, RedisSemaphore};
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
pub const SCHEMES: &[&str] = &["redis", "rediss"];

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
    holds: AtomicU64,
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
    /// A fresh hash field for one hold: `<client uuid>:<hold id>` (Redisson's
    /// `<client uuid>:<thread id>`).
    pub(crate) fn next_field(&self) -> String {
        let id = self.holds.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}:{id}", self.client_id)
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

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with(config: RedisConfig) -> Result<Self> {
        let conn =
            Conn::connect(&config, None::<Arc<fn(redis::PushInfo) -> Result<(), ()>>>).await?;
        let subs = Subscriptions::connect(&config).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                subs,
                client_id: uuid::Uuid::new_v4().to_string(),
                store_id: config.store_id(),
                fair_wait: config.fair_wait,
                holds: AtomicU64::new(0),
            }),
        })
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

    /// What Redis stores for `name`: whether a mutex, fair, read or write hold is there, the
    /// holder's hash field (Redisson's `<client uuid>:<thread id>`), the remaining PTTL and the
    /// last fencing token.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], or a connection error.
    pub async fn describe(&self, name: &str) -> Result<dlock_core::LockStatus> {
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
        let owner = match items.get(3) {
            Some(redis::Value::Array(fields)) => {
                fields.iter().filter_map(text).find(|f| f != "mode")
            }
            _ => None,
        };
        let held = kind == "hash" && owner.is_some();
        Ok(dlock_core::LockStatus::new(
            held,
            owner,
            pttl.filter(|_| held),
            token,
        ))
    }

    fn name(&self, name: &str) -> Result<(LockName, Keys)> {
        let name = LockName::new(name)?;
        if self.inner.conn.is_cluster()
            && name.as_str().contains('{')
            && scripts::hash_tag(name.as_str()).is_none()
        {
            return Err(Error::InvalidName {
                name: name.to_string(),
                reason: "in a Redis Cluster a name with `{` needs a non-empty {hash tag}, or \
                         its keys would fall in different slots"
                    .into(),
            });
        }
        let keys = Keys::new(name.as_str());
        Ok((name, keys))
    }
}

impl LockProvider for RedisProvider {
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
        Ok(Arc::new(RedisLock::new(
            Arc::clone(&self.inner),
            name,
            keys,
            options,
        )))
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
        Ok(Arc::new(RedisReadWriteLock::new(
            Arc::clone(&self.inner),
            name,
            keys,
            options,
        )))
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
        Ok(Arc::new(RedisSemaphore::new(
            Arc::clone(&self.inner),
            name,
            keys,
            permits,
            options,
        )))
    }
}
