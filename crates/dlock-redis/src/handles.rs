//! The primitives: mutex (fair or not), read-write lock, semaphore. Each is one remote
//! acquisition; the core's handles add re-entry, deadlines and the rest.

use std::sync::{Arc, Mutex, PoisonError};

use dlock_core::backend::{RawLock, RawReadWriteLock, RawSemaphore, Request};
use dlock_core::{LockGuard, LockName, Result, async_trait};

use crate::Inner;
use crate::acquire::{Acquisition, Kind, read_other_kind};
use crate::scripts::Keys;

fn acquisition(
    inner: &Arc<Inner>,
    keys: &Arc<Keys>,
    kind: Kind,
    req: &Request<'_>,
) -> Arc<Acquisition> {
    Arc::new(Acquisition {
        inner: Arc::clone(inner),
        name: req.name.clone(),
        keys: Arc::clone(keys),
        field: inner.next_field(),
        kind,
        lease: req.options.lease,
        acked: std::sync::atomic::AtomicU32::new(0),
    })
}

/// A mutex (Redisson `RLock` / `RFencedLock`, or `RFairLock` when fair). Every acquisition
/// holds as a hash field of its own.
#[derive(Debug)]
pub(crate) struct RedisMutex {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: Arc<Keys>,
}

#[async_trait]
impl RawLock for RedisMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let kind = if req.options.fair {
            Kind::Fair
        } else {
            Kind::Mutex
        };
        acquisition(&self.inner, &self.keys, kind, req)
            .run_until(req.deadline)
            .await
    }
}

/// A read-write lock (Redisson `RReadWriteLock` layout).
#[derive(Debug)]
pub(crate) struct RedisReadWrite {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: Arc<Keys>,
    /// The field of this handle's latest write hold, for downgrades.
    pub(crate) write_field: Mutex<Option<String>>,
}

#[async_trait]
impl RawReadWriteLock for RedisReadWrite {
    async fn read(&self, req: &Request<'_>, downgrade: bool) -> Result<Option<LockGuard>> {
        let downgrade = if downgrade {
            self.write_field
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        } else {
            None
        };
        acquisition(&self.inner, &self.keys, Kind::Read { downgrade }, req)
            .run_until(req.deadline)
            .await
    }

    async fn write(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let acq = acquisition(&self.inner, &self.keys, Kind::Write, req);
        let field = acq.field.clone();
        let guard = acq.run_until(req.deadline).await?;
        if guard.is_some() {
            *self
                .write_field
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(field);
        }
        Ok(guard)
    }
}

/// A semaphore (Redisson `RPermitExpirableSemaphore` layout).
#[derive(Debug)]
pub(crate) struct RedisSemaphore {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: Arc<Keys>,
}

#[async_trait]
impl RawSemaphore for RedisSemaphore {
    async fn acquire(&self, req: &Request<'_>, permits: u32) -> Result<Option<LockGuard>> {
        let kind = Kind::Permit {
            permits,
            id: *uuid::Uuid::new_v4().as_bytes(),
        };
        acquisition(&self.inner, &self.keys, kind, req)
            .run_until(req.deadline)
            .await
    }

    async fn available(&self, _name: &LockName, permits: u32) -> Result<u32> {
        let mut invocation = crate::scripts::SEM_AVAILABLE.prepare_invoke();
        invocation
            .key(&self.keys.name)
            .key(&self.keys.sem_timeouts)
            .arg(permits);
        let reply: redis::Value = self.inner.conn.script("count permits", &invocation).await?;
        if let Some(e) = read_other_kind(&reply, self.keys.name.as_str(), false) {
            return Err(e);
        }
        match reply {
            redis::Value::Int(free) => Ok(u32::try_from(free.max(0)).unwrap_or(u32::MAX)),
            other => Err(crate::error::unexpected("count permits", other)),
        }
    }
}
