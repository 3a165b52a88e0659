//! The mutex handle.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    DistributedLock, Error, LockGuard, LockName, LockOptions, Reentrancy, Result, async_trait,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::BACKEND;
use crate::store::{Kind, Mode, Request, Store};

/// A mutex handle on a memory store. Clones of the `Arc` share the owner.
#[derive(Debug)]
pub(crate) struct MemoryLock {
    pub(crate) store: Arc<Store>,
    pub(crate) store_id: String,
    pub(crate) name: LockName,
    pub(crate) options: LockOptions,
    pub(crate) owner: u64,
    pub(crate) reentrancy: Reentrancy,
}

impl MemoryLock {
    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, lock = %self.name);
        let request = |owner| Request {
            owner,
            mode: Mode::Exclusive,
            fair: self.options.fair,
            lease: self.options.lease,
        };
        async {
            if self.options.reentrant {
                self.reentrancy
                    .acquire(deadline, || {
                        self.store
                            .acquire(Kind::Mutex, &self.name, request(self.owner), deadline)
                    })
                    .await
            } else {
                // Every acquisition is its own owner, so the handle waits for itself.
                let owner = self.store.next_id();
                self.store
                    .acquire(Kind::Mutex, &self.name, request(owner), deadline)
                    .await
            }
        }
        .instrument(span)
        .await
    }
}

#[async_trait]
impl DistributedLock for MemoryLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn options(&self) -> &LockOptions {
        &self.options
    }

    fn store_id(&self) -> &str {
        &self.store_id
    }

    async fn acquire(&self) -> Result<LockGuard> {
        match self.acquire_until(None).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::unbounded_wait_ended(BACKEND, &self.name)),
        }
    }

    async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(Some(Instant::now() + wait)).await
    }
}
