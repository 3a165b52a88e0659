//! The provider: a client of one Redis server, cluster or Sentinel-watched master, and the
//! core's [`RawProvider`] over it (the core adds the checks every backend shares).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::backend::{Mutex, ProviderMeta, RawProvider};
use dlock_core::{Capabilities, Error, LockKind, LockName, LockOptions, LockStatus, Result};
use redis::Value;

use crate::call::Call;
use crate::config::{PubSubMode, RedisConfig};
use crate::conn::{Conn, text};
use crate::error::unexpected;
use crate::holds::{Holds, watch_disconnects};
use crate::keys::{Keys, bookkeeping_key, hash_tag};
use crate::mutex::RedisMutex;
use crate::pubsub::Subscriptions;
use crate::rwlock::RedisReadWrite;
use crate::scripts::DESCRIBE;
use crate::semaphore::RedisSemaphore;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["redis", "rediss", "redis+sentinel"];

pub(crate) const BACKEND: &str = "redis";

/// The shortest lease this backend accepts (Redis expires keys with millisecond precision;
/// shorter leases would expire before a renewal could reach the server).
pub const MIN_LEASE: Duration = Duration::from_millis(30);

/// A client of one Redis server or cluster: two connections (commands, subscriptions) shared
/// by every handle it creates. Cloning is cheap.
#[derive(Clone)]
pub struct RedisProvider {
    inner: Arc<Inner>,
}

/// What the handles of one provider share.
pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) subs: Arc<Subscriptions>,
    /// Redisson's client id: a fresh v4 UUID per client.
    pub(crate) client_id: String,
    pub(crate) meta: ProviderMeta,
    pub(crate) fair_wait: Duration,
    /// Replicas that must acknowledge a grant (`?wait_replicas=`), and how long to wait.
    pub(crate) wait_replicas: u32,
    pub(crate) wait_timeout: Duration,
    /// Every live hold of this provider, checked after a disconnection.
    pub(crate) holds: Holds,
    /// The last hold id given out, for hash fields.
    hold_ids: AtomicU64,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisProvider")
            .field("store", &self.meta.store_id)
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
        let id = self.hold_ids.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}:{id}", self.client_id)
    }

    /// The command releases announce themselves with: `spublish` where wake-ups use sharded
    /// pub/sub, else `publish`.
    pub(crate) fn publish(&self) -> &'static str {
        if self.conn.sharded() {
            "spublish"
        } else {
            "publish"
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
        let mut capabilities = Capabilities::all(BACKEND);
        capabilities.min_lease = MIN_LEASE;
        let inner = Arc::new(Inner {
            conn,
            subs,
            client_id: uuid::Uuid::new_v4().to_string(),
            meta: ProviderMeta::new(capabilities, config.store_id()),
            fair_wait: config.fair_wait,
            wait_replicas: config.wait_replicas,
            wait_timeout: config.response_timeout / 2,
            holds: Holds::new(),
            hold_ids: AtomicU64::new(0),
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

    /// Refuses a name whose keys the layout cannot keep apart from other names' keys, or, in
    /// a cluster, in one slot.
    fn check_name(&self, name: &LockName) -> Result<()> {
        if let Some(whose) = bookkeeping_key(name.as_str()) {
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
            && hash_tag(name.as_str()).is_none()
        {
            return Err(Error::InvalidName {
                name: name.to_string(),
                reason: "in a Redis Cluster a name with `{` or `}` needs a non-empty {hash \
                         tag}, or its keys would fall in different slots"
                    .into(),
            });
        }
        Ok(())
    }

    /// The keys of `name`, shared by every acquisition of its handle.
    fn keys(name: &LockName) -> Arc<Keys> {
        Arc::new(Keys::new(name.as_str()))
    }
}

#[dlock_core::async_trait]
impl RawProvider for RedisProvider {
    type Mutex = RedisMutex;
    type ReadWrite = RedisReadWrite;
    type Semaphore = RedisSemaphore;

    fn meta(&self) -> &ProviderMeta {
        &self.inner.meta
    }

    fn check(&self, name: &LockName, kind: LockKind, options: &LockOptions) -> Result<()> {
        self.check_name(name)?;
        match kind {
            LockKind::Write if options.fair => Err(Error::unsupported(
                BACKEND,
                "fair read-write locks (Redisson has none to be compatible with)",
            )),
            LockKind::Permit if options.fair => Err(Error::unsupported(
                BACKEND,
                "fair semaphores (Redisson has none to be compatible with)",
            )),
            _ => Ok(()),
        }
    }

    fn raw_lock(&self, name: &LockName, _options: &LockOptions) -> Result<RedisMutex> {
        Ok(RedisMutex {
            inner: Arc::clone(&self.inner),
            keys: Self::keys(name),
        })
    }

    fn raw_read_write(&self, name: &LockName, _options: &LockOptions) -> Result<RedisReadWrite> {
        Ok(RedisReadWrite {
            inner: Arc::clone(&self.inner),
            keys: Self::keys(name),
            write_field: Mutex::new(None),
        })
    }

    fn raw_semaphore(
        &self,
        name: &LockName,
        _permits: u32,
        _options: &LockOptions,
    ) -> Result<RedisSemaphore> {
        Ok(RedisSemaphore {
            inner: Arc::clone(&self.inner),
            keys: Self::keys(name),
        })
    }

    /// What Redis stores for `name`: whether a mutex, fair, read or write hold is there, the
    /// holders' hash fields (Redisson's `<client uuid>:<thread id>`), the remaining PTTL and
    /// the last fencing token.
    async fn raw_describe(&self, name: &LockName) -> Result<LockStatus> {
        self.check_name(name)?;
        let keys = Keys::new(name.as_str());
        let call = Call::new("describe", &DESCRIBE)
            .key(&keys.name)
            .key(&keys.token);
        let reply = self.inner.call(&call).await?;
        let Value::Array(items) = reply else {
            return Err(unexpected("describe", reply));
        };
        let kind = items.first().and_then(text).unwrap_or_default();
        let pttl = match items.get(1) {
            Some(Value::Int(ms)) if *ms > 0 => {
                Some(Duration::from_millis(u64::try_from(*ms).unwrap_or(0)))
            }
            _ => None,
        };
        let token = items.get(2).and_then(text).and_then(|t| t.parse().ok());
        let fields: Vec<String> = match items.get(3) {
            Some(Value::Array(fields)) => fields.iter().filter_map(text).collect(),
            _ => Vec::new(),
        };
        let holders: Vec<String> = fields.into_iter().filter(|f| f != "mode").collect();
        if kind != "hash" || holders.is_empty() {
            return Ok(LockStatus::free(token));
        }
        // A write hold keeps `mode = write` while its owner also reads (a downgrade): the lock
        // is exclusive until the write hold ends.
        let lock_kind = match items.get(4).and_then(text).as_deref() {
            Some("write") => LockKind::Write,
            Some(_) => LockKind::Read,
            None => LockKind::Mutex,
        };
        Ok(LockStatus::held_by(lock_kind, holders)
            .with_remaining(pttl)
            .with_last_token(token))
    }
}
