//! Owner-local re-entry, shared by every backend.

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use crate::error::Result;
use crate::guard::{LockGuard, Shared, lock};
use crate::time::Deadline;

/// The re-entry state of one owner (one lock handle and its clones).
///
/// While the owner holds the lock, [`acquire`](Self::acquire) hands out another guard on the
/// same hold at once, with the same fencing token, and the hold is released on the server only
/// when the last of those guards is released. Only one task per owner goes to the server at a
/// time; the others wait for it and then re-enter, so an owner never contends with itself.
#[derive(Debug, Default)]
pub(crate) struct Reentrancy {
    gate: tokio::sync::Mutex<()>,
    current: Mutex<Weak<Shared>>,
}

impl Reentrancy {
    /// No hold yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn reenter(&self) -> Option<LockGuard> {
        let shared = lock(&self.current).upgrade()?;
        shared.enter().then(|| LockGuard::from_shared(shared))
    }

    /// Re-enters the owner's hold, or else runs `acquire` (the backend's acquisition) with the
    /// owner's other acquisitions kept out, and remembers the new hold for later re-entry.
    ///
    /// `deadline` bounds the wait for another task of the same owner. Returns `Ok(None)` if
    /// the deadline passed.
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as `acquire`: waiting for the owner's other tasks holds nothing.
    pub(crate) async fn acquire<F, Fut>(
        &self,
        deadline: Deadline,
        acquire: F,
    ) -> Result<Option<LockGuard>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<LockGuard>>>,
    {
        if let Some(guard) = self.reenter() {
            return Ok(Some(guard));
        }
        let Some(_gate) = deadline.run(self.gate.lock()).await else {
            return Ok(None);
        };
        if let Some(guard) = self.reenter() {
            return Ok(Some(guard));
        }
        let guard = acquire().await?;
        if let Some(shared) = guard.as_ref().and_then(LockGuard::shared) {
            *lock(&self.current) = Arc::downgrade(shared);
        }
        Ok(guard)
    }
}
