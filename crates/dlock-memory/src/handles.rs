//! The three primitives over the store: one remote acquisition each. The core's handles
//! (`dlock_core::backend::{Lock, ReadWriteLock, Semaphore}`) add re-entry and the rest.

use std::sync::Arc;

use dlock_core::backend::{RawLock, RawReadWriteLock, RawSemaphore, Request};
use dlock_core::{LockGuard, LockName, Result, async_trait};

use crate::store::{Kind, Link, Mode, Store, Want};

/// A mutex: every acquisition is a holder of its own.
#[derive(Debug)]
pub(crate) struct MemoryMutex {
    pub(crate) store: Arc<Store>,
    pub(crate) link: Arc<Link>,
}

#[async_trait]
impl RawLock for MemoryMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let want = Want {
            owner: self.store.next_id(),
            kind: Kind::Mutex,
            mode: Mode::Exclusive,
            fair: req.options.fair,
            lease: req.options.lease,
        };
        self.store
            .acquire(&self.link, Kind::Mutex, req.name, want, req.deadline)
            .await
    }
}

/// A read-write lock: every acquisition is a holder of its own, except a downgrade, a read
/// that shares the owner of the caller's write hold, so the store grants it beside that write
/// (and beside nothing else exclusive).
#[derive(Debug)]
pub(crate) struct MemoryReadWrite {
    pub(crate) store: Arc<Store>,
    pub(crate) link: Arc<Link>,
    /// The owner of the latest write hold taken through this handle: the caller's, when the
    /// core asks for a downgrade (one write at most exists on a name).
    pub(crate) write_owner: dlock_core::backend::Mutex<Option<u64>>,
}

#[async_trait]
impl RawReadWriteLock for MemoryReadWrite {
    async fn read(&self, req: &Request<'_>, downgrade: bool) -> Result<Option<LockGuard>> {
        // The store grants a read beside a write hold of the same owner, atomically: a write
        // released meanwhile simply is not there any more to share with.
        let owner = downgrade
            .then(|| *self.write_owner.lock())
            .flatten()
            .unwrap_or_else(|| self.store.next_id());
        self.acquire(req, owner, Mode::Shared).await
    }

    async fn write(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let owner = self.store.next_id();
        let guard = self.acquire(req, owner, Mode::Exclusive).await?;
        if guard.is_some() {
            *self.write_owner.lock() = Some(owner);
        }
        Ok(guard)
    }
}

impl MemoryReadWrite {
    async fn acquire(
        &self,
        req: &Request<'_>,
        owner: u64,
        mode: Mode,
    ) -> Result<Option<LockGuard>> {
        let want = Want {
            owner,
            kind: Kind::ReadWrite,
            mode,
            fair: req.options.fair,
            lease: req.options.lease,
        };
        self.store
            .acquire(&self.link, Kind::ReadWrite, req.name, want, req.deadline)
            .await
    }
}

/// A semaphore: every acquisition takes a permit of its own.
#[derive(Debug)]
pub(crate) struct MemorySemaphore {
    pub(crate) store: Arc<Store>,
    pub(crate) link: Arc<Link>,
}

#[async_trait]
impl RawSemaphore for MemorySemaphore {
    async fn acquire(&self, req: &Request<'_>, permits: u32) -> Result<Option<LockGuard>> {
        let want = Want {
            owner: self.store.next_id(),
            kind: Kind::Semaphore,
            mode: Mode::Permit(permits),
            fair: req.options.fair,
            lease: req.options.lease,
        };
        self.store
            .acquire(&self.link, Kind::Semaphore, req.name, want, req.deadline)
            .await
    }

    async fn available(&self, name: &LockName, permits: u32) -> Result<u32> {
        self.store.available(&self.link, name, permits).await
    }
}
