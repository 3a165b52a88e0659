//! All-or-nothing acquisition of several locks.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures::future::select_all;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::name::FencingToken;
use crate::traits::DynLock;

/// Several locks taken as one: all or nothing, over any mix of backends.
///
/// The locks are acquired in one canonical order (by store id, then name), so two `MultiLock`s
/// over the same names never deadlock whatever order they were given in; a partial acquisition
/// is rolled back (released in reverse) before an error or `Ok(None)` is returned; the
/// [`MultiGuard`] releases all of them in reverse order.
///
/// ```
/// # async fn demo(a: dlock_core::DynLock, b: dlock_core::DynLock) -> dlock_core::Result<()> {
/// use dlock_core::MultiLock;
/// let both = MultiLock::new(vec![a, b])?;
/// let guard = both.acquire().await?;
/// // ... both locks are held ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiLock {
    locks: Vec<DynLock>,
}

impl MultiLock {
    /// Orders `locks` canonically.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the list is empty or names the same lock twice.
    pub fn new(mut locks: Vec<DynLock>) -> Result<Self> {
        if locks.is_empty() {
            return Err(Error::invalid_argument(
                "locks",
                "a MultiLock needs at least one lock",
            ));
        }
        locks.sort_by(|a, b| (a.store_id(), a.name()).cmp(&(b.store_id(), b.name())));
        if let Some(w) = locks
            .windows(2)
            .find(|w| (w[0].store_id(), w[0].name()) == (w[1].store_id(), w[1].name()))
        {
            return Err(Error::invalid_argument(
                "locks",
                format!("lock {:?} appears twice", w[0].name()),
            ));
        }
        Ok(Self { locks })
    }

    /// The locks in acquisition order.
    pub fn locks(&self) -> &[DynLock] {
        &self.locks
    }

    /// Waits as long as it takes for all the locks.
    ///
    /// # Errors
    ///
    /// The first error of any lock; the locks taken before it are released first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: guards already taken are dropped, which releases them in the background.
    pub async fn acquire(&self) -> Result<MultiGuard> {
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            match lock.acquire().await {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    rollback(guards).await;
                    return Err(e);
                }
            }
        }
        Ok(MultiGuard { guards })
    }

    /// Waits at most `wait` (in all) for all the locks; `Ok(None)`, with nothing held, if they
    /// were not all had by then.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self, wait: Duration) -> Result<Option<MultiGuard>> {
        let deadline = Instant::now() + wait;
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let left = deadline.saturating_duration_since(Instant::now());
            match lock.try_acquire(left).await {
                Ok(Some(guard)) => guards.push(guard),
                Ok(None) => {
                    rollback(guards).await;
                    return Ok(None);
                }
                Err(e) => {
                    rollback(guards).await;
                    return Err(e);
                }
            }
        }
        Ok(Some(MultiGuard { guards }))
    }
}

async fn rollback(guards: Vec<LockGuard>) {
    for guard in guards.into_iter().rev() {
        let name = guard.name().clone();
        if let Err(e) = guard.release().await {
            tracing::warn!(lock = %name, error = %e, "MultiLock rollback: release failed");
        }
    }
}

/// The guards of a [`MultiLock`], released together in reverse acquisition order.
#[must_use = "dropping the guard releases the locks in the background"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The individual guards, in acquisition order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The fencing tokens, in acquisition order.
    pub fn fencing_tokens(&self) -> Vec<FencingToken> {
        self.guards.iter().map(LockGuard::fencing_token).collect()
    }

    /// Whether every hold is vouched for.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when any of the holds is lost.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let futures: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            if !futures.is_empty() {
                select_all(futures).await;
            }
        }
    }

    /// Releases every lock, last acquired first; all are attempted even if one fails.
    ///
    /// # Errors
    ///
    /// The first error met (e.g. [`Error::LockLost`] for a hold that was lost).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the guards not yet released are dropped, which releases them in the
    /// background.
    pub async fn release(self) -> Result<()> {
        let mut first = None;
        for guard in self.guards.into_iter().rev() {
            if let Err(e) = guard.release().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}
