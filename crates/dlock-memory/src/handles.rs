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
            mode: Mode::Exclusive,
            fair: req.options.fair,
            lease: req.options.lease,
        };
        self.store
            .acquire(&self.link, Kind::Mutex, req.name, want, req.deadline)
            .await
    }
}

/// A read-write lock. Both sides act as the handle's owner, so a read can share with the
/// handle's own write hold (a downgrade) and with nothing else exclusive.
#[derive(Debug)]
pub(crate) struct MemoryReadWrite {
    pub(crate) store: Arc<Store>,
    pub(crate) link: Arc<Link>,
    pub(crate) owner: u64,
}

#[async_trait]
impl RawReadWriteLock for MemoryReadWrite {
    async fn read(&self, req: &Request<'_>, _downgrade: bool) -> Result<Option<LockGuard>> {
        // The store grants a read beside a write hold of the same owner, atomically: a write
        // released meanwhile simply is not there any more to share with.
        self.acquire(req, Mode::Shared).await
    }

    async fn write(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        self.acquire(req, Mode::Exclusive).await
    }
}

impl MemoryReadWrite {
    async fn acquire(&self, req: &Request<'_>, mode: Mode) -> Result<Option<LockGuard>> {
        let want = Want {
            owner: self.owner,
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
