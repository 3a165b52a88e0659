//! The provider: connecting, handles by name, and `describe`.

use std::fmt;
use std::sync::Arc;

use dlock_core::backend::{HandleInfo, Lock};
use dlock_core::{
    Capabilities, DynLock, DynReadWriteLock, DynSemaphore, Error, LockKind, LockName, LockOptions,
    LockProvider, LockStatus, Result,
};
use etcd_client::{GetOptions, SortOrder, SortTarget};

use crate::config::EtcdConfig;
use crate::error::from_etcd;
use crate::mutex::EtcdMutex;
use crate::session::{EtcdStats, Session};
use crate::{BACKEND, MIN_LEASE};

/// A client of one etcd cluster: one lease shared by every handle it creates. Cloning is
/// cheap (the clones share the client and the lease).
#[derive(Clone)]
pub struct EtcdProvider {
    session: Arc<Session>,
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
        Ok(Self {
            session: Session::connect(config).await?,
        })
    }

    /// A provider on a client the application already has (its endpoints, credentials and
    /// channel settings); `config` gives the prefix and the lease time-to-live (its
    /// endpoints only name the store in [`LockProvider::store_id`]).
    ///
    /// # Errors
    ///
    /// [`Error::Connection`] or [`Error::Backend`] if the lease cannot be granted.
    pub async fn from_client(client: etcd_client::Client, config: EtcdConfig) -> Result<Self> {
        Ok(Self {
            session: Session::start(config, client).await?,
        })
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

    fn info(&self, name: LockName, options: LockOptions) -> HandleInfo {
        HandleInfo::new(BACKEND, self.session.store_id.as_str(), name, options)
    }
}

#[dlock_core::async_trait]
impl LockProvider for EtcdProvider {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::all(BACKEND);
        caps.read_write = false;
        caps.semaphore = false;
        caps.min_lease = MIN_LEASE;
        caps
    }

    fn store_id(&self) -> &str {
        &self.session.store_id
    }

    fn lock(&self, name: &str, options: LockOptions) -> Result<DynLock> {
        let name = LockName::new(name)?;
        self.capabilities().check(&options)?;
        let raw = EtcdMutex {
            session: Arc::clone(&self.session),
            lock_name: self.session.config.lock_name(&name),
        };
        Ok(Arc::new(Lock::new(self.info(name, options), raw)))
    }

    fn read_write_lock(&self, name: &str, _options: LockOptions) -> Result<DynReadWriteLock> {
        LockName::new(name)?;
        Err(Error::unsupported(
            BACKEND,
            "read-write locks (etcd's lock recipe has no shared mode; not built yet)",
        ))
    }

    fn semaphore(&self, name: &str, _permits: u32, _options: LockOptions) -> Result<DynSemaphore> {
        LockName::new(name)?;
        Err(Error::unsupported(
            BACKEND,
            "semaphores (etcd has no semaphore recipe of its own; not built yet)",
        ))
    }

    /// The holder is the key with the lowest create revision under the lock's name; its
    /// create revision is its fencing token. No remaining time: holds live as long as their
    /// provider's lease.
    async fn describe(&self, name: &str) -> Result<LockStatus> {
        let name = LockName::new(name)?;
        let range = format!("{}/", self.session.config.lock_name(&name));
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        self.session.count_get();
        let resp = self
            .session
            .client()
            .get(range.as_str(), Some(options))
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
