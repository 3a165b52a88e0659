//! Work under a lock in one call: acquire, race the work against the loss, release.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::name::FencingToken;
use crate::traits::DistributedLock;

/// Runs work under a lock: [`run`](Self::run) and [`try_run`](Self::try_run), for every
/// [`DistributedLock`] (the blanket impl covers `dyn DistributedLock` and [`DynLock`](crate::DynLock)).
///
/// The work gets the fencing token; it is raced against [`LockGuard::in_doubt`], so if the
/// backend stops vouching for the hold first (it is lost, or suspended: a session that may
/// already be over on the store) the work is **dropped** (cancelled at its next await) and the
/// call returns [`Error::LockLost`]; otherwise the release is awaited (not left to a
/// background task) before the work's value is returned.
///
/// ```
/// use dlock_core::{DistributedLockExt, DynLock, Result};
///
/// async fn bump(lock: DynLock) -> Result<u64> {
///     lock.run(|token| async move {
///         // write to the protected resource, with `token` as its fence
///         token.get()
///     })
///     .await
/// }
/// ```
pub trait DistributedLockExt: DistributedLock {
    /// Waits for the lock, runs `work(token)` while holding it, releases it.
    ///
    /// # Errors
    ///
    /// The acquisition's errors; [`Error::LockLost`] if the hold was lost or suspended before
    /// the work finished (the work was dropped) or found lost when it was released (the work
    /// finished, but the lock may not have protected all of it). Another release error is
    /// logged and the value returned: the lease ends the hold.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the work and releases the lock in the background.
    fn run<F, Fut, T>(&self, work: F) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let guard = self.acquire().await?;
            run_held(guard, work).await
        }
    }

    /// As [`run`](Self::run), waiting at most `wait` for the lock: `Ok(None)` (and the work
    /// not run) if it was not had by then.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run).
    fn try_run<F, Fut, T>(
        &self,
        wait: Duration,
        work: F,
    ) -> impl Future<Output = Result<Option<T>>> + Send
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            match self.try_acquire(wait).await? {
                Some(guard) => run_held(guard, work).await.map(Some),
                None => Ok(None),
            }
        }
    }
}

impl<L: DistributedLock + ?Sized> DistributedLockExt for L {}

/// Runs `work` under `guard`, racing it against the hold's loss or suspension, then releases.
async fn run_held<F, Fut, T>(guard: LockGuard, work: F) -> Result<T>
where
    F: FnOnce(FencingToken) -> Fut,
    Fut: Future<Output = T>,
{
    let doubt = guard.in_doubt();
    let done = tokio::select! {
        biased;
        () = doubt => None,
        value = work(guard.fencing_token()) => Some(value),
    };
    let name = guard.name().clone();
    let Some(value) = done else {
        tracing::warn!(lock = %name, state = ?guard.state(), reason = ?guard.loss_reason(), "dlock: the hold was lost or suspended while the work ran; the work was dropped");
        let _ = guard.release().await;
        return Err(Error::lock_lost(&name));
    };
    match guard.release().await {
        Ok(()) => Ok(value),
        Err(e @ Error::LockLost { .. }) => Err(e),
        Err(e) => {
            tracing::warn!(lock = %name, error = %e, "dlock: releasing after the work failed; the lease will end the hold");
            Ok(value)
        }
    }
}
