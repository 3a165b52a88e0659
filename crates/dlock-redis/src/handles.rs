//! The handles: mutex (fair or not), read-write lock, semaphore.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::{
    DistributedLock, DistributedReadWriteLock, DistributedSemaphore, Error, LockGuard, LockName,
    LockOptions, Reentrancy, Result, async_trait,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::acquire::{Acquisition, Kind};
use crate::scripts::Keys;
use crate::{BACKEND, Inner};

fn deadline(wait: Duration) -> Option<Instant> {
    Some(Instant::now() + wait)
}

fn acquisition(
    inner: &Arc<Inner>,
    name: &LockName,
    keys: &Keys,
    kind: Kind,
    options: &LockOptions,
) -> Arc<Acquisition> {
    Arc::new(Acquisition {
        inner: Arc::clone(inner),
        name: name.clone(),
        keys: keys.clone(),
        field: inner.next_field(),
        kind,
        lease: options.lease,
    })
}

/// A mutex handle (Redisson `RLock` / `RFencedLock`, or `RFairLock` when fair).
#[derive(Debug)]
pub(crate) struct RedisLock {
    inner: Arc<Inner>,
    name: LockName,
    keys: Keys,
    options: LockOptions,
    reentrancy: Reentrancy,
}

impl RedisLock {
    pub(crate) fn new(inner: Arc<Inner>, name: LockName, keys: Keys, options: LockOptions) -> Self {
        Self {
            inner,
            name,
            keys,
            options,
            reentrancy: Reentrancy::new(),
        }
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, lock = %self.name);
        let kind = if self.options.fair {
            Kind::Fair
        } else {
            Kind::Mutex
        };
        let remote = || {
            acquisition(&self.inner, &self.name, &self.keys, kind, &self.options)
                .run_until(deadline)
        };
        async {
            if self.options.reentrant {
                self.reentrancy.acquire(deadline, remote).await
            } else {
                remote().await
            }
        }
        .instrument(span)
        .await
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn options(&self) -> &LockOptions {
        &self.options
    }

    fn store_id(&self) -> &str {
        &self.inner.store_id
    }

    async fn acquire(&self) -> Result<LockGuard> {
        self.acquire_until(None)
            .await?
            .ok_or_else(|| Error::unbounded_wait_ended(BACKEND, &self.name))
    }

    async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(deadline(wait)).await
    }
}

/// A read-write lock handle (Redisson `RReadWriteLock` layout).
#[derive(Debug)]
pub(crate) struct RedisReadWriteLock {
    inner: Arc<Inner>,
    name: LockName,
    keys: Keys,
    options: LockOptions,
    read: Reentrancy,
    write: Reentrancy,
    /// The field of this owner's current write hold, for downgrades.
    write_field: Mutex<Option<String>>,
}

impl RedisReadWriteLock {
    pub(crate) fn new(inner: Arc<Inner>, name: LockName, keys: Keys, options: LockOptions) -> Self {
        Self {
            inner,
            name,
            keys,
            options,
            read: Reentrancy::new(),
            write: Reentrancy::new(),
            write_field: Mutex::new(None),
        }
    }

    async fn read_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, lock = %self.name, mode = "read");
        let remote = || {
            let downgrade = if self.write.is_held() {
                self.write_field
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            } else {
                None
            };
            acquisition(
                &self.inner,
                &self.name,
                &self.keys,
                Kind::Read { downgrade },
                &self.options,
            )
            .run_until(deadline)
        };
        async {
            if self.options.reentrant {
                self.read.acquire(deadline, remote).await
            } else {
                remote().await
            }
        }
        .instrument(span)
        .await
    }

    async fn write_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        if self.read.is_held() && !self.write.is_held() {
            return Err(Error::WouldDeadlock {
                name: self.name.to_string(),
                reason: "this handle holds the read lock; release it before asking for the \
                         write lock"
                    .into(),
            });
        }
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, lock = %self.name, mode = "write");
        let remote = || async {
            let acq = acquisition(
                &self.inner,
                &self.name,
                &self.keys,
                Kind::Write,
                &self.options,
            );
            let field = acq.field.clone();
            let guard = acq.run_until(deadline).await?;
            if guard.is_some() {
                *self
                    .write_field
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(field);
            }
            Ok(guard)
        };
        async {
            if self.options.reentrant {
                self.write.acquire(deadline, remote).await
            } else {
                remote().await
            }
        }
        .instrument(span)
        .await
    }
}

#[async_trait]
impl DistributedReadWriteLock for RedisReadWriteLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn options(&self) -> &LockOptions {
        &self.options
    }

    fn store_id(&self) -> &str {
        &self.inner.store_id
    }

    async fn read(&self) -> Result<LockGuard> {
        self.read_until(None)
            .await?
            .ok_or_else(|| Error::unbounded_wait_ended(BACKEND, &self.name))
    }

    async fn try_read(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.read_until(deadline(wait)).await
    }

    async fn write(&self) -> Result<LockGuard> {
        self.write_until(None)
            .await?
            .ok_or_else(|| Error::unbounded_wait_ended(BACKEND, &self.name))
    }

    async fn try_write(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.write_until(deadline(wait)).await
    }
}

/// A semaphore handle (Redisson `RPermitExpirableSemaphore` layout).
#[derive(Debug)]
pub(crate) struct RedisSemaphore {
    inner: Arc<Inner>,
    name: LockName,
    keys: Keys,
    permits: u32,
    options: LockOptions,
}

impl RedisSemaphore {
    pub(crate) fn new(
        inner: Arc<Inner>,
        name: LockName,
        keys: Keys,
        permits: u32,
        options: LockOptions,
    ) -> Self {
        Self {
            inner,
            name,
            keys,
            permits,
            options,
        }
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, semaphore = %self.name);
        let kind = Kind::Permit {
            permits: self.permits,
            id: *uuid::Uuid::new_v4().as_bytes(),
        };
        acquisition(&self.inner, &self.name, &self.keys, kind, &self.options)
            .run_until(deadline)
            .instrument(span)
            .await
    }
}

#[async_trait]
impl DistributedSemaphore for RedisSemaphore {
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
        &self.inner.store_id
    }

    async fn acquire(&self) -> Result<LockGuard> {
        self.acquire_until(None)
            .await?
            .ok_or_else(|| Error::unbounded_wait_ended(BACKEND, &self.name))
    }

    async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(deadline(wait)).await
    }
}
