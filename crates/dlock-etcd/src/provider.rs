//! The provider: connecting, the raw mutex by name, and `describe`.

use std::fmt;
use std::sync::Arc;

#[cfg(doc)]
use dlock_core::{Error, LockProvider};

use dlock_core::backend::{NoPrimitive, ProviderMeta, RawProvider};
use dlock_core::{Capabilities, LockKind, LockName, LockOptions, LockStatus, Result};

use crate::config::EtcdConfig;
use crate::election::EtcdElection;
use crate::error::from_etcd;
use crate::keys::{first_created, range};
use crate::mutex::EtcdMutex;
use crate::session::Session;
use crate::stats::EtcdStats;
use crate::{BACKEND, MIN_LEASE};

/// A client of one etcd cluster: one lease shared by every handle it creates. Cloning is
/// cheap (the clones share the client and the lease).
#[derive(Clone)]
pub struct EtcdProvider {
    session: Arc<Session>,
    meta: ProviderMeta,
}

impl fmt::Debug for EtcdProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.session, f)
    }
}

impl EtcdProvider {
    /// Connects to the cluster an `etcd://` URL names and grants the provider's lease.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad URL, [`Error::Connection`] if no member answers (the
    /// message names the addresses, never the password), [`Error::Backend`] if the server
    /// refuses the credentials or the lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: at worst a lease granted for the dropped future expires on its own.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(EtcdConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    ///
    /// # Cancel safety
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with(config: EtcdConfig) -> Result<Self> {
        Ok(Self::over(crate::keepalive::connect(config).await?))
    }

    /// A provider on a client the application already has (its endpoints, credentials and
    /// channel settings); `config` gives the prefix and the lease time-to-live (its
    /// endpoints only name the store in [`LockProvider::store_id`]).
    ///
    /// Give the client what [`connect`](Self::connect) gives its own: HTTP/2 keep-alive
    /// (`ConnectOptions::with_keep_alive`, no more often than the server's
    /// `--grpc-keepalive-min-time`, 5 s by default) and `with_require_leader(true)`. Without them a waiter whose watch rides a connection gone
    /// silent learns of a release only when its wait ends, one time-to-live later.
    ///
    /// # Errors
    ///
    /// [`Error::Connection`] or [`Error::Backend`] if the lease cannot be granted.
    pub async fn from_client(client: etcd_client::Client, config: EtcdConfig) -> Result<Self> {
        Ok(Self::over(crate::keepalive::start(config, client).await?))
    }

    fn over(session: Arc<Session>) -> Self {
        let mut caps = Capabilities::all(BACKEND);
        caps.read_write = false;
        caps.semaphore = false;
        caps.min_lease = MIN_LEASE;
        Self {
            meta: ProviderMeta::new(caps, Arc::clone(&session.store_id)),
            session,
        }
    }

    /// The configuration this provider was opened with.
    pub fn config(&self) -> &EtcdConfig {
        &self.session.config
    }

    /// The client (a cheap clone).
    pub fn client(&self) -> etcd_client::Client {
        self.session.client()
    }

    /// The id of the provider's live lease, if one is live (after the lease ended, until a
    /// new one is granted, there is none).
    pub fn lease_id(&self) -> Option<i64> {
        self.session.lease_now()
    }

    /// The server calls this provider has made so far, and its waiters' wake-ups.
    pub fn stats(&self) -> EtcdStats {
        self.session.stats()
    }

    /// Holds of this provider that are live.
    pub fn live_holds(&self) -> usize {
        self.session.live_holds()
    }
}

impl RawProvider for EtcdProvider {
    type Mutex = EtcdMutex;
    type ReadWrite = NoPrimitive;
    type Semaphore = NoPrimitive;
    type Election = EtcdElection;

    fn meta(&self) -> &ProviderMeta {
        &self.meta
    }

    /// The margin of a hold (drift allowance, lock-delay) must fit the lease's time to live:
    /// keep-alives vouch for it, not for the handle's lease.
    fn check(&self, _: &LockName, _: LockKind, options: &LockOptions) -> Result<()> {
        self.meta
            .capabilities
            .check_session_span(options, self.session.config.lease_ttl)
    }

    fn raw_lock(&self, name: &LockName, _options: &LockOptions) -> Result<EtcdMutex> {
        Ok(EtcdMutex {
            session: Arc::clone(&self.session),
            lock_name: self.session.config.lock_name(name),
        })
    }

    fn raw_election(&self, name: &LockName, options: &LockOptions) -> Result<EtcdElection> {
        Ok(EtcdElection {
            mutex: self.raw_lock(name, options)?,
        })
    }

    /// The holder is the key with the lowest create revision under the lock's name; its
    /// create revision is its fencing token. No remaining time: holds live as long as their
    /// provider's lease.
    async fn raw_describe(&self, name: &LockName) -> Result<LockStatus> {
        let range = range(&self.session.config.lock_name(name));
        self.session.counters.count(|s| &mut s.gets);
        let mut client = self.session.client();
        let resp = self
            .session
            .bounded(client.get(range.as_str(), Some(first_created())))
            .await
            .map_err(|e| from_etcd(&format!("read {range}"), e))?;
        let Some(holder) = resp.kvs().first() else {
            return Ok(LockStatus::free(None));
        };
        let key = String::from_utf8_lossy(holder.key()).into_owned();
        let token = u64::try_from(holder.create_revision()).ok();
        Ok(LockStatus::held_by(LockKind::Mutex, vec![key]).with_last_token(token))
    }
}
