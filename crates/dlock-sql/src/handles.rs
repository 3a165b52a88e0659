//! The raw primitives the core wraps: a mutex over any strategy, and the read-write lock of
//! the advisory strategy. Each acquisition waits through [`crate::wait`] with a new owner
//! per attempt; the core's handle adds re-entry, deadlines and the rest.

use std::sync::Arc;

use dlock_core::backend::{Mutex, NewHold, RawLock, RawReadWriteLock, Request};
use dlock_core::{FencingToken, Lease, LockGuard, LockKind, LockName, Result, async_trait};

use crate::Inner;
use crate::sql::AdvisoryMode;
use crate::strategy::advisory::WriteSession;
use crate::strategy::{Advisory, Attempt, Grant, LockStrategy};
use crate::wait;

/// A mutex on one SQL provider: every attempt is an owner of its own.
#[derive(Debug)]
pub struct SqlMutex {
    inner: Arc<Inner>,
    strategy: Arc<dyn LockStrategy>,
}

impl SqlMutex {
    pub(crate) fn new(inner: Arc<Inner>, strategy: Arc<dyn LockStrategy>) -> Self {
        Self { inner, strategy }
    }
}

#[async_trait]
impl RawLock for SqlMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let lease = req.options.lease;
        let granted = wait::until(&self.inner.wakes, req.name, req.deadline, || {
            let attempt = Attempt::new(&self.inner, req.name, lease);
            Arc::clone(&self.strategy).try_lock(attempt, req.deadline)
        })
        .await?;
        Ok(granted.map(|g| guard(&self.inner, g, LockKind::Mutex, req.name, lease)))
    }
}

/// A read-write lock on one SQL provider (PostgreSQL advisory only): readers share the
/// name's advisory lock, a writer takes it alone. Its write holds are remembered, so that a
/// read asked while one is held (a downgrade) is taken on the write's own session, the only
/// one the server lets in beside it.
#[derive(Debug)]
pub struct SqlReadWrite {
    inner: Arc<Inner>,
    advisory: Arc<Advisory>,
    /// The session of the latest write hold taken through this handle, for a downgrade.
    write: Mutex<Option<WriteSession>>,
}

impl SqlReadWrite {
    pub(crate) fn new(inner: Arc<Inner>, advisory: Arc<Advisory>) -> Self {
        Self {
            inner,
            advisory,
            write: Mutex::new(None),
        }
    }

    /// Waits for the advisory lock of `req`'s name in `mode`; a write is remembered for a
    /// downgrade.
    async fn take(&self, req: &Request<'_>, mode: AdvisoryMode) -> Result<Option<Grant>> {
        let lease = req.options.lease;
        let granted = wait::until(&self.inner.wakes, req.name, req.deadline, || {
            let attempt = Attempt::new(&self.inner, req.name, lease);
            self.advisory.acquire(attempt, req.deadline, mode)
        })
        .await?;
        Ok(granted.map(|g| {
            if mode == AdvisoryMode::Exclusive {
                *self.write.lock() = Some(g.write_session());
            }
            g.into_grant()
        }))
    }
}

#[async_trait]
impl RawReadWriteLock for SqlReadWrite {
    async fn read(&self, req: &Request<'_>, downgrade: bool) -> Result<Option<LockGuard>> {
        let lease = req.options.lease;
        if downgrade {
            let write = self.write.lock().clone();
            if let Some(write) = write {
                let attempt = Attempt::new(&self.inner, req.name, lease);
                if let Some(g) = self.advisory.downgrade(&write, attempt).await? {
                    return Ok(Some(guard(&self.inner, g, LockKind::Read, req.name, lease)));
                }
            }
        }
        let granted = self.take(req, AdvisoryMode::Shared).await?;
        Ok(granted.map(|g| guard(&self.inner, g, LockKind::Read, req.name, lease)))
    }

    async fn write(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let lease = req.options.lease;
        let granted = self.take(req, AdvisoryMode::Exclusive).await?;
        Ok(granted.map(|g| guard(&self.inner, g, LockKind::Write, req.name, lease)))
    }
}

/// The guard of a lock just granted.
fn guard(inner: &Inner, g: Grant, kind: LockKind, name: &LockName, lease: Lease) -> LockGuard {
    let new = NewHold::new(
        inner.backend,
        kind,
        name.clone(),
        FencingToken::new(g.token),
        lease,
        g.sent,
        g.hold,
    );
    LockGuard::new(match g.signal {
        Some(signal) => new.with_signal(signal),
        None => new,
    })
}
