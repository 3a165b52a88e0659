//! The provider: one session per ensemble, shared by every handle it makes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{ProviderMeta, RawProvider};
use dlock_core::{Capabilities, LockKind, LockName, LockOptions, LockStatus, Result};

use crate::BACKEND;
use crate::config::ZkConfig;
use crate::election::ZkElection;
use crate::error::from_zk;
use crate::kinds::LOCK_MARKERS;
use crate::mutex::ZkMutex;
use crate::nodes::{self, READ, WRITE};
use crate::rwlock::ZkReadWrite;
use crate::semaphore::ZkSemaphore;
use crate::session::{Session, ZkStats};

/// The shortest lease this backend accepts. ZooKeeper keeps a hold for as long as the session
/// lives; the lease only bounds how long a client vouches for it between checks, and each
/// check is a server call.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// A client of one ZooKeeper ensemble: one session shared by every handle it creates.
/// Cloning is cheap (the clones share the session).
#[derive(Clone)]
pub struct ZkProvider {
    session: Arc<Session>,
    meta: ProviderMeta,
}

impl fmt::Debug for ZkProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.session, f)
    }
}

impl ZkProvider {
    /// Connects to the ensemble a `zk://` URL names and opens the session.
    ///
    /// # Errors
    ///
    /// [`Error::Config`](dlock_core::Error::Config) for a bad URL,
    /// [`Error::Connection`](dlock_core::Error::Connection) if no server answers (the message
    /// names the addresses, never the password), [`Error::Backend`](dlock_core::Error::Backend)
    /// if the server refuses the session or the credentials.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: at worst a session the server opened for the dropped future expires on
    /// its own.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(ZkConfig::from_url(url)?).await
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
    pub async fn connect_with(config: ZkConfig) -> Result<Self> {
        let session = Session::connect(config).await?;
        let mut capabilities = Capabilities::all(BACKEND);
        capabilities.min_lease = MIN_LEASE;
        let meta = ProviderMeta::new(capabilities, session.store_id.as_str());
        Ok(Self { session, meta })
    }

    /// The configuration this provider was opened with.
    pub fn config(&self) -> &ZkConfig {
        &self.session.config
    }

    /// The znode path lock `name` lives at on the server (see the crate docs for the mapping).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](dlock_core::Error::InvalidName) for a name that is not a valid
    /// [`LockName`].
    pub fn lock_path(&self, name: &str) -> Result<String> {
        self.session.config.lock_path(name)
    }

    /// The client of the current session (a cheap clone). After a session expiry the provider
    /// opens a new session, and this returns its client.
    pub fn client(&self) -> zookeeper_client::Client {
        self.session.client()
    }

    /// The id of the current session.
    pub fn session_id(&self) -> i64 {
        self.session.client().session_id().0
    }

    /// The server calls this provider has made so far, and its waiters' wake-ups.
    pub fn stats(&self) -> ZkStats {
        self.session.stats()
    }

    /// Waiters woken by a watch so far. One release wakes one waiter (readers excepted), so
    /// after `n` handoffs between waiters this has grown by `n`.
    pub fn wakeups(&self) -> u64 {
        self.session.stats().wakeups
    }

    /// Holds of this provider that are live right now (released and lost ones excluded).
    pub fn live_holds(&self) -> usize {
        self.session.live_holds()
    }

    /// The znode path of `name`, under the chroot.
    fn path(&self, name: &LockName) -> String {
        nodes::lock_path(&self.session.config.chroot, name)
    }
}

impl RawProvider for ZkProvider {
    type Mutex = ZkMutex;
    type ReadWrite = ZkReadWrite;
    type Semaphore = ZkSemaphore;
    type Election = ZkElection;

    fn meta(&self) -> &ProviderMeta {
        &self.meta
    }

    /// The margin of a hold (drift allowance, lock-delay) must fit the session: renewals
    /// vouch for a session timeout, not a lease.
    fn check(&self, _: &LockName, _: LockKind, options: &LockOptions) -> Result<()> {
        self.meta
            .capabilities
            .check_session_span(options, self.session.session_timeout())
    }

    fn raw_lock(&self, name: &LockName, _: &LockOptions) -> Result<ZkMutex> {
        Ok(ZkMutex::new(&self.session, self.path(name)))
    }

    fn raw_read_write(&self, name: &LockName, _: &LockOptions) -> Result<ZkReadWrite> {
        Ok(ZkReadWrite::new(&self.session, self.path(name)))
    }

    fn raw_semaphore(&self, name: &LockName, _: u32, _: &LockOptions) -> Result<ZkSemaphore> {
        Ok(ZkSemaphore::new(&self.session, self.path(name)))
    }

    fn raw_election(&self, name: &LockName, _: &LockOptions) -> Result<ZkElection> {
        Ok(ZkElection::new(&self.session, self.path(name)))
    }

    /// What the server records about lock `name`: whether a mutex, a writer or readers hold
    /// it, which nodes, and the first holder's creation zxid (its fencing token). ZooKeeper
    /// leases are sessions, so no remaining time is reported.
    async fn raw_describe(&self, name: &LockName) -> Result<LockStatus> {
        let path = self.path(name);
        let sorted = nodes::contenders(self.session.list(&path).await?, LOCK_MARKERS);
        let Some(first) = sorted.first() else {
            return Ok(LockStatus::free(None));
        };
        let (kind, holders) = if nodes::sequence(&first.node, READ).is_some() {
            let readers = sorted.iter().take_while(|c| !c.writer);
            (LockKind::Read, readers.map(|c| c.node.clone()).collect())
        } else if nodes::sequence(&first.node, WRITE).is_some() {
            (LockKind::Write, vec![first.node.clone()])
        } else {
            (LockKind::Mutex, vec![first.node.clone()])
        };
        let node = format!("{path}/{}", first.node);
        let token = match self.session.retrying(|| self.session.exists(&node)).await {
            Ok(stat) => stat.and_then(|s| u64::try_from(s.czxid).ok()),
            Err(e) => return Err(from_zk(&format!("stat {node}"), e)),
        };
        Ok(LockStatus::held_by(kind, holders).with_last_token(token))
    }
}
