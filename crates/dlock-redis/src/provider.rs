//! The provider: a client of one Redis server, cluster or Sentinel-watched master, and the
//! core's [`RawProvider`] over it (the core adds the checks every backend shares).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Mutex, ProviderMeta, RawProvider};
use dlock_core::{Capabilities, Error, LockKind, LockName, LockOptions, LockStatus, Result};
use redis::Value;

use crate::call::{Call, text};
use crate::config::{PubSubMode, RedisConfig};
use crate::conn::Conn;
use crate::consts::{BACKEND, MIN_LEASE};
use crate::election::{RedisElection, RedisProposals};
use crate::error::unexpected;
use crate::keys::{Keys, bookkeeping_key, hash_tag};
use crate::mutex::RedisMutex;
use crate::pubsub::Subscriptions;
use crate::rwlock::RedisReadWrite;
use crate::scripts::DESCRIBE;
use crate::semaphore::RedisSemaphore;
use crate::shared::{Inner, watch_disconnects};

/// A client of one Redis server or cluster: two connections (commands, subscriptions) shared
/// by every handle it creates. Cloning is cheap.
#[derive(Clone)]
pub struct RedisProvider {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
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
        // Before the subscription connection, whose RESP3 handshake an old server would refuse
        // with an error that does not say why.
        conn.check_version(&config.store_id()).await?;
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
        let meta = ProviderMeta::new(capabilities, config.store_id());
        let inner = Arc::new(Inner::new(conn, subs, meta, &config));
        inner.replicas.ask(&inner.conn).await;
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

    /// Under Sentinel, the address (`host:port`) of the master this provider sends its calls
    /// to: the one the Sentinels named when it connected, and after each failover the new
    /// one (they are asked every second, and after every call that failed as if the master
    /// moved). `None` on a single server or a cluster.
    pub fn sentinel_master(&self) -> Option<String> {
        self.inner.conn.sentinel_master()
    }

    /// Pub/sub messages delivered to this provider so far.
    pub fn messages_delivered(&self) -> u64 {
        self.inner.subs.delivered()
    }

    /// Refuses a name whose keys the layout cannot keep apart from other names' keys, or, in
    /// a cluster, in one slot.
    fn check_name(&self, name: &LockName) -> Result<()> {
        let key_name = self.key_name(name);
        if let Some(whose) = bookkeeping_key(&key_name) {
            return Err(Error::invalid_name(
                name,
                format!(
                    "it is the key where the lock layout keeps {whose}, so the two would \
                     overwrite each other (in Redisson too)"
                ),
            ));
        }
        if self.inner.conn.is_cluster()
            && key_name.contains(['{', '}'])
            && hash_tag(&key_name).is_none()
        {
            return Err(Error::invalid_name(
                name,
                "in a Redis Cluster a name with `{` or `}` needs a non-empty {hash \
                 tag}, or its keys would fall in different slots",
            ));
        }
        Ok(())
    }

    /// The keys of `name` (under the key prefix), shared by every acquisition of its handle.
    fn keys(&self, name: &LockName) -> Arc<Keys> {
        Arc::new(Keys::new(&self.key_name(name)))
    }

    /// The name `name`'s keys derive from: the key prefix and the name.
    fn key_name(&self, name: &LockName) -> String {
        format!("{}{}", self.inner.key_prefix, name.as_str())
    }
}

impl RawProvider for RedisProvider {
    type Mutex = RedisMutex;
    type ReadWrite = RedisReadWrite;
    type Semaphore = RedisSemaphore;
    type Election = RedisElection;

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
            keys: self.keys(name),
        })
    }

    fn raw_election(&self, name: &LockName, options: &LockOptions) -> Result<RedisElection> {
        let mutex = self.raw_lock(name, options)?;
        let proposals = RedisProposals::new(Arc::clone(&self.inner), Arc::clone(&mutex.keys));
        Ok(RedisElection::new(mutex, proposals))
    }

    fn raw_read_write(&self, name: &LockName, _options: &LockOptions) -> Result<RedisReadWrite> {
        Ok(RedisReadWrite {
            inner: Arc::clone(&self.inner),
            keys: self.keys(name),
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
            keys: self.keys(name),
        })
    }

    /// What Redis stores for `name`: whether a mutex, fair, read or write hold is there, the
    /// holders' hash fields (Redisson's `<client uuid>:<thread id>`), the remaining PTTL and
    /// the last fencing token.
    async fn raw_describe(&self, name: &LockName) -> Result<LockStatus> {
        self.check_name(name)?;
        let keys = Keys::new(&self.key_name(name));
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
