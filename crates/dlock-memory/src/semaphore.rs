//! The semaphore handle.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    DistributedSemaphore, Error, LockGuard, LockName, LockOptions, Result, async_trait,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::BACKEND;
use crate::store::{Kind, Mode, Request, Store};

/// A semaphore handle on a memory store.
#[derive(Debug)]
pub(crate) struct MemorySemaphore {
    pub(crate) store: Arc<Store>,
    pub(crate) store_id: String,
    pub(crate) name: LockName,
    pub(crate) permits: u32,
    pub(crate) options: LockOptions,
}

impl MemorySemaphore {
    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, semaphore = %self.name);
        let request = Request {
            owner: self.store.next_id(),
            mode: Mode::Permit(self.permits),
            fair: self.options.fair,
            lease: self.options.lease,
        };
        self.store
            .acquire(Kind::Semaphore, &self.name, request, deadline)
            .instrument(span)
            .await
    }
}

#[async_trait]
impl DistributedSemaphore for MemorySemaphore {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn permits(&self) -> u32 {
        self.permits
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
