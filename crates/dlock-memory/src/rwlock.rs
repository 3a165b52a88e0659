//! The read-write lock handle.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    DistributedReadWriteLock, Error, LockGuard, LockName, LockOptions, Reentrancy, Result,
    async_trait,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::BACKEND;
use crate::store::{Kind, Mode, Request, Store};

/// A read-write lock handle on a memory store. The read and write sides share one owner, so
/// the writer can also read (downgrade).
#[derive(Debug)]
pub(crate) struct MemoryReadWriteLock {
    pub(crate) store: Arc<Store>,
    pub(crate) store_id: String,
    pub(crate) name: LockName,
    pub(crate) options: LockOptions,
    pub(crate) owner: u64,
    pub(crate) read: Reentrancy,
    pub(crate) write: Reentrancy,
}

impl MemoryReadWriteLock {
    async fn acquire_until(
        &self,
        mode: Mode,
        deadline: Option<Instant>,
    ) -> Result<Option<LockGuard>> {
        let span =
            tracing::debug_span!("dlock.acquire", backend = BACKEND, lock = %self.name, ?mode);
        let (slot, owner) = match mode {
            Mode::Shared => (&self.read, self.owner),
            _ => {
                if self.read.is_held() && !self.write.is_held() {
                    return Err(Error::WouldDeadlock {
                        name: self.name.to_string(),
                        reason: "this handle holds the read lock; release it before asking for \
                                 the write lock"
                            .into(),
                    });
                }
                (&self.write, self.owner)
            }
        };
        let owner = if self.options.reentrant {
            owner
        } else {
            self.store.next_id()
        };
        let request = Request {
            owner,
            mode,
            fair: self.options.fair,
            lease: self.options.lease,
        };
        let acquire = || {
            self.store
                .acquire(Kind::ReadWrite, &self.name, request, deadline)
        };
        async {
            if self.options.reentrant {
                slot.acquire(deadline, acquire).await
            } else {
                acquire().await
            }
        }
        .instrument(span)
        .await
    }

    async fn wait_forever(&self, mode: Mode) -> Result<LockGuard> {
        match self.acquire_until(mode, None).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::unbounded_wait_ended(BACKEND, &self.name)),
        }
    }
}

#[async_trait]
impl DistributedReadWriteLock for MemoryReadWriteLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn options(&self) -> &LockOptions {
        &self.options
    }

    fn store_id(&self) -> &str {
        &self.store_id
    }

    async fn read(&self) -> Result<LockGuard> {
        self.wait_forever(Mode::Shared).await
    }

    async fn try_read(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(Mode::Shared, Some(Instant::now() + wait))
            .await
    }

    async fn write(&self) -> Result<LockGuard> {
        self.wait_forever(Mode::Exclusive).await
    }

    async fn try_write(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(Mode::Exclusive, Some(Instant::now() + wait))
            .await
    }
}
