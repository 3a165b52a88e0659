//! Re-entry within one task, shared by every backend.
//!
//! The owner of a hold is the task that acquired it through a handle (outside a task, the
//! thread), not the handle: tasks that share a handle through an `Arc` exclude each other,
//! as they would with a `tokio::sync::Mutex`, and the same task acquiring again through the
//! same handle re-enters its own hold, as a Redisson thread does.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Weak};

use crate::error::Result;
use crate::guard::LockGuard;
use crate::shared::Shared;
use crate::sync::Mutex;
use crate::time::Deadline;

/// Who acquires: the current tokio task, or the current thread outside a task (a
/// `block_on`). Task ids are unique among the tasks alive at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    /// The caller.
    pub(crate) fn current() -> Self {
        tokio::task::try_id().map_or_else(|| Self::Thread(std::thread::current().id()), Self::Task)
    }
}

/// The re-entry state of one handle: each owner's current hold, and a gate that keeps one
/// owner's concurrent acquisitions (a `join!` of two in one task) from contending with each
/// other at the store.
///
/// While an owner holds the lock, [`acquire`](Self::acquire) by the same owner hands out
/// another guard on the same hold at once, with the same fencing token; the hold is released
/// on the server only when the last of those guards is released. Other owners go to the
/// store and wait there like any other holder.
#[derive(Debug, Default)]
pub(crate) struct Reentrancy {
    owners: Mutex<HashMap<Owner, Slot>>,
}

#[derive(Debug, Default)]
struct Slot {
    /// The owner's current hold.
    hold: Weak<Shared>,
    /// Held by the owner's acquisition that is at the store.
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl Reentrancy {
    /// No hold yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn reenter(hold: &Weak<Shared>) -> Option<LockGuard> {
        let shared = hold.upgrade()?;
        shared.enter().then(|| LockGuard::from_shared(shared))
    }

    /// Re-enters the caller's hold, or else runs `acquire` (the backend's acquisition) with
    /// the caller's other acquisitions kept out, and remembers the new hold for later re-entry.
    ///
    /// `deadline` bounds the wait for another acquisition of the same owner. Returns
    /// `Ok(None)` if the deadline passed.
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as `acquire`: waiting for the owner's other acquisitions holds nothing.
    pub(crate) async fn acquire<F, Fut>(
        &self,
        deadline: Deadline,
        acquire: F,
    ) -> Result<Option<LockGuard>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<LockGuard>>>,
    {
        let owner = Owner::current();
        let gate = {
            let mut owners = self.owners.lock();
            // Owners whose hold is gone and who are not acquiring leave.
            owners.retain(|_, slot| {
                slot.hold.strong_count() > 0 || Arc::strong_count(&slot.gate) > 1
            });
            let slot = owners.entry(owner).or_default();
            if let Some(guard) = Self::reenter(&slot.hold) {
                return Ok(Some(guard));
            }
            Arc::clone(&slot.gate)
        };
        let Some(_gate) = deadline.run(gate.lock()).await else {
            return Ok(None);
        };
        let hold = self
            .owners
            .lock()
            .get(&owner)
            .map(|slot| Weak::clone(&slot.hold))
            .unwrap_or_default();
        if let Some(guard) = Self::reenter(&hold) {
            return Ok(Some(guard));
        }
        let guard = acquire().await?;
        if let Some(shared) = guard.as_ref().and_then(LockGuard::shared) {
            let mut owners = self.owners.lock();
            owners.entry(owner).or_default().hold = Arc::downgrade(shared);
        }
        Ok(guard)
    }
}
