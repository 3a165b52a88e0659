//! The three primitives over the store: one remote acquisition each. The core's handles
//! (`dlock_core::backend::{Lock, ReadWriteLock, Semaphore}`) add re-entry and the rest.

use std::sync::Arc;

use dlock_core::backend::{Mutex, RawLock, RawReadWriteLock, RawSemaphore, Request};
use dlock_core::{LockGuard, LockName, Result, async_trait};

use crate::link::Link;
use crate::store::{Kind, Mode, Store, Want};

/// A provider's way to the store: the store, over the provider's link to it.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    pub(crate) store: Arc<Store>,
    pub(crate) link: Arc<Link>,
}

impl Client {
    /// One acquisition on the store for holder `owner`: a hold of `kind` in `mode`, with the
    /// request's fairness and lease, waiting until its deadline.
    async fn acquire(
        &self,
        req: &Request<'_>,
        owner: u64,
        kind: Kind,
        mode: Mode,
    ) -> Result<Option<LockGuard>> {
        let want = Want {
            owner,
            kind,
            mode,
            fair: req.options.fair,
            lease: req.options.lease,
        };
        self.store
            .acquire(&self.link, req.name, want, req.deadline, None)
            .await
    }

    /// A holder of its own.
    fn new_owner(&self) -> u64 {
        self.store.next_id()
    }
}

/// The raw mutex: every acquisition is a holder of its own.
#[derive(Debug)]
pub struct MemoryMutex {
    pub(crate) client: Client,
}

#[async_trait]
impl RawLock for MemoryMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let owner = self.client.new_owner();
        self.client
            .acquire(req, owner, Kind::Mutex, Mode::Exclusive)
            .await
    }
}

/// The raw read-write lock: every acquisition is a holder of its own, except a downgrade, a
/// read that shares the owner of the caller's write hold, so the store grants it beside that
/// write (and beside nothing else exclusive).
#[derive(Debug)]
pub struct MemoryReadWrite {
    pub(crate) client: Client,
    /// The owner of the latest write hold taken through this handle: the caller's, when the
    /// core asks for a downgrade (one write at most exists on a name).
    pub(crate) write_owner: Mutex<Option<u64>>,
}

#[async_trait]
impl RawReadWriteLock for MemoryReadWrite {
    async fn read(&self, req: &Request<'_>, downgrade: bool) -> Result<Option<LockGuard>> {
        // The store grants a read beside a write hold of the same owner, atomically: a write
        // released meanwhile simply is not there any more to share with.
        let owner = downgrade
            .then(|| *self.write_owner.lock())
            .flatten()
            .unwrap_or_else(|| self.client.new_owner());
        self.client
            .acquire(req, owner, Kind::ReadWrite, Mode::Shared)
            .await
    }

    async fn write(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let owner = self.client.new_owner();
        let guard = self
            .client
            .acquire(req, owner, Kind::ReadWrite, Mode::Exclusive)
            .await?;
        if guard.is_some() {
            *self.write_owner.lock() = Some(owner);
        }
        Ok(guard)
    }
}

/// The raw semaphore: every acquisition takes a permit of its own.
#[derive(Debug)]
pub struct MemorySemaphore {
    pub(crate) client: Client,
}

#[async_trait]
impl RawSemaphore for MemorySemaphore {
    async fn acquire(&self, req: &Request<'_>, permits: u32) -> Result<Option<LockGuard>> {
        let owner = self.client.new_owner();
        self.client
            .acquire(req, owner, Kind::Semaphore, Mode::Permit(permits))
            .await
    }

    async fn available(&self, name: &LockName, permits: u32) -> Result<u32> {
        self.client
            .store
            .available(&self.client.link, name, permits)
            .await
    }
}
