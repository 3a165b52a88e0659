#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

mod config;
mod error;
mod hold;
mod mutex;
mod nodes;
mod rwlock;
mod semaphore;
mod session;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{HandleInfo, Lock, ReadWriteLock, Semaphore};
use dlock_core::{
    Capabilities, DynLock, DynReadWriteLock, DynSemaphore, LockName, LockOptions, LockProvider,
    Result,
};

pub use crate::config::{DEFAULT_PORT, DEFAULT_SESSION_TIMEOUT, ZkConfig};
pub use crate::nodes::is_recipe_node;
pub use crate::session::ZkStats;
/// The client library, for [`ZkProvider::client`].
pub use zookeeper_client;

use crate::mutex::ZkMutex;
use crate::rwlock::ZkReadWrite;
use crate::semaphore::ZkSemaphore;
use crate::session::Session;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["zk"];

pub(crate) const BACKEND: &str = "zookeeper";

/// The shortest lease this backend accepts. ZooKeeper keeps a hold for as long as the session
/// lives; the lease only bounds how long a client vouches for it between checks, and each
/// check is a server call.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// A client of one ZooKeeper ensemble: one session shared by every handle it creates.
/// Cloning is cheap (the clones share the session).
#[derive(Clone)]
pub struct ZkProvider {
    session: Arc<Session>,
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
    /// [`Error::Config`] for a bad URL, [`Error::Connection`] if no server answers (the
    /// message names the addresses, never the password), [`Error::Backend`] if the server
    /// refuses the session or the credentials.
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
        Ok(Self {
            session: Session::connect(config).await?,
        })
    }

    /// The configuration this provider was opened with.
    pub fn config(&self) -> &ZkConfig {
        &self.session.config
    }

    /// The znode path lock `name` lives at on the server (see the crate docs for the mapping).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that is not a valid [`LockName`].
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

    /// What the server records about lock `name` (see [`LockProvider::describe`]): whether a
    /// mutex, a writer or readers hold it, which nodes, and the first holder's creation zxid
    /// (its fencing token). ZooKeeper leases are sessions, so no remaining time is reported.
    async fn describe_name(&self, name: &str) -> Result<dlock_core::LockStatus> {
        let path = self.lock_path(name)?;
        let children = match self.session.retrying(|| self.session.children(&path)).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => return Err(crate::error::from_zk(&format!("list {path}"), e)),
        };
        let sorted = nodes::contenders(children, hold::LOCK_MARKERS);
        let Some(first) = sorted.first() else {
            return Ok(dlock_core::LockStatus::free(None));
        };
        let (kind, holders) = if nodes::sequence(&first.node, nodes::READ).is_some() {
            let readers = sorted.iter().take_while(|c| !c.writer);
            let holders = readers.map(|c| c.node.clone()).collect();
            (dlock_core::LockKind::Read, holders)
        } else if nodes::sequence(&first.node, nodes::WRITE).is_some() {
            (dlock_core::LockKind::Write, vec![first.node.clone()])
        } else {
            (dlock_core::LockKind::Mutex, vec![first.node.clone()])
        };
        let node = format!("{path}/{}", first.node);
        let token = match self.session.retrying(|| self.session.exists(&node)).await {
            Ok(stat) => stat.and_then(|s| u64::try_from(s.czxid).ok()),
            Err(e) => return Err(crate::error::from_zk(&format!("stat {node}"), e)),
        };
        Ok(dlock_core::LockStatus::held_by(kind, holders).with_last_token(token))
    }

    /// Holds of this provider that are live right now (released and lost ones excluded).
    pub fn live_holds(&self) -> usize {
        self.session.live_holds()
    }

    fn info(&self, name: LockName, options: LockOptions) -> HandleInfo {
        HandleInfo::new(BACKEND, self.session.store_id.as_str(), name, options)
    }

    fn name(&self, name: &str) -> Result<(LockName, String)> {
        let name = LockName::new(name)?;
        let path = nodes::lock_path(&self.session.config.chroot, &name);
        Ok((name, path))
    }
}

#[dlock_core::async_trait]
impl LockProvider for ZkProvider {
    async fn describe(&self, name: &str) -> Result<dlock_core::LockStatus> {
        self.describe_name(name).await
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::all(BACKEND);
        caps.min_lease = MIN_LEASE;
        caps
    }

    fn store_id(&self) -> &str {
        &self.session.store_id
    }

    fn lock(&self, name: &str, options: LockOptions) -> Result<DynLock> {
        let (name, path) = self.name(name)?;
        self.capabilities().check(&options)?;
        let raw = ZkMutex {
            session: Arc::clone(&self.session),
            path,
        };
        Ok(Arc::new(Lock::new(self.info(name, options), raw)))
    }

    fn read_write_lock(&self, name: &str, options: LockOptions) -> Result<DynReadWriteLock> {
        let (name, path) = self.name(name)?;
        self.capabilities().check(&options)?;
        let raw = ZkReadWrite {
            session: Arc::clone(&self.session),
            path,
            write_node: std::sync::Mutex::new(None),
        };
        Ok(Arc::new(ReadWriteLock::new(self.info(name, options), raw)))
    }

    fn semaphore(&self, name: &str, permits: u32, options: LockOptions) -> Result<DynSemaphore> {
        let (name, path) = self.name(name)?;
        let caps = self.capabilities();
        caps.check_permits(permits)?;
        caps.check(&options)?;
        let raw = ZkSemaphore {
            session: Arc::clone(&self.session),
            path,
        };
        Ok(Arc::new(Semaphore::new(
            self.info(name, options),
            permits,
            raw,
        )))
    }
}
