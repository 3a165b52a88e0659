//! Re-entry within one task, for handles built `reentrant(true)`.
//!
//! The owner of a hold is the task that acquired it through a handle (outside a task, the
//! thread), not the handle: tasks that share a handle through an `Arc` exclude each other,
//! as they would with a `tokio::sync::Mutex`, and with `reentrant(true)` the same task
//! acquiring again through the same handle re-enters its own hold, as a Redisson thread does.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Weak};

use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::handles::HandleInfo;
use crate::shared::{Settled, Shared};
use crate::sync::Mutex;
use crate::time::Deadline;

/// Who acquires: the current tokio task, or the current thread outside a task (a
/// `block_on`). Task ids are unique among the tasks alive at once. The owner of a hold, for
/// re-entry; a backend may key what it keeps per caller by it too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A tokio task.
    Task(tokio::task::Id),
    /// A thread outside any task.
    Thread(std::thread::ThreadId),
}

impl Owner {
    /// The caller.
    pub fn current() -> Self {
        tokio::task::try_id().map_or_else(|| Self::Thread(std::thread::current().id()), Self::Task)
    }
}

/// The re-entry state of one handle: each owner's current hold, and whether one of its
/// acquisitions is at the store (so that a second one of the same owner, a `join!` of two in
/// one task, waits for it and re-enters instead of contending with itself).
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
    /// One of the owner's acquisitions is at the store.
    busy: bool,
    /// Wakes the owner's other acquisitions when that one is done (made only for them).
    done: Option<Arc<Notify>>,
}

/// What the owner's current hold allows.
enum Reentry {
    /// A guard on it.
    Entered(LockGuard),
    /// It is suspended: wait for it to come back or be lost.
    Suspended(Arc<Shared>),
    /// None to enter.
    No,
}

fn reentry(hold: &Weak<Shared>) -> Reentry {
    let Some(shared) = hold.upgrade() else {
        return Reentry::No;
    };
    if shared.enter() {
        return Reentry::Entered(LockGuard::from_shared(shared));
    }
    if shared.is_live() {
        return Reentry::Suspended(shared);
    }
    Reentry::No
}

/// Marks the owner's acquisition done when it ends, however it ends.
struct Busy<'a> {
    owners: &'a Mutex<HashMap<Owner, Slot>>,
    owner: Owner,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut owners = self.owners.lock();
        if let Some(slot) = owners.get_mut(&self.owner) {
            slot.busy = false;
            if let Some(done) = slot.done.take() {
                done.notify_waiters();
            }
        }
    }
}

impl Reentrancy {
    /// No hold yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// For a re-entrant handle (`info`'s options): re-enters the caller's hold, or else runs
    /// `acquire` (the backend's acquisition) with the caller's other acquisitions kept out, and
    /// remembers the new hold for later re-entry. For any other handle it just runs `acquire`.
    /// A hold of the caller's that is suspended is waited on: re-entered when the backend
    /// vouches for it again, left for a new acquisition if it is lost.
    ///
    /// `deadline` bounds the wait for another acquisition of the same owner. Returns
    /// `Ok(None)` if the deadline passed, and a retryable error if the caller's own hold was
    /// still suspended then (the store did not answer: nobody else holds it).
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as `acquire`: waiting for the owner's other acquisitions holds nothing.
    pub(crate) async fn acquire<F, Fut>(
        &self,
        info: &HandleInfo,
        deadline: Deadline,
        acquire: F,
    ) -> Result<Option<LockGuard>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<LockGuard>>>,
    {
        if !info.options().reentrant {
            return acquire().await;
        }
        let backend = info.backend();
        let owner = Owner::current();
        loop {
            let wait = {
                let mut owners = self.owners.lock();
                // Owners whose hold is gone and who are not acquiring leave.
                owners.retain(|_, slot| slot.hold.strong_count() > 0 || slot.busy);
                let slot = owners.entry(owner).or_default();
                match reentry(&slot.hold) {
                    Reentry::Entered(guard) => return Ok(Some(guard)),
                    Reentry::Suspended(shared) => Err(shared),
                    Reentry::No if slot.busy => {
                        Ok(Arc::clone(slot.done.get_or_insert_with(Default::default)))
                    }
                    Reentry::No => {
                        slot.busy = true;
                        break;
                    }
                }
            };
            match wait {
                Ok(done) => {
                    let notified = done.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    // Done meanwhile: look again at once.
                    let still = self.owners.lock().get(&owner).is_some_and(|s| s.busy);
                    if still && deadline.run(notified).await.is_none() {
                        return Ok(None);
                    }
                }
                Err(shared) => {
                    if shared.settle(deadline).await == Settled::Suspended {
                        return Err(Error::no_answer(
                            backend,
                            format!(
                                "{:?} is held by this task, but the session to the store is \
                                 suspended (reconnecting) and did not come back before the \
                                 deadline",
                                shared.name.as_str()
                            ),
                        ));
                    }
                }
            }
        }
        let _busy = Busy {
            owners: &self.owners,
            owner,
        };
        let guard = acquire().await?;
        if let Some(shared) = guard.as_ref().and_then(LockGuard::shared) {
            let mut owners = self.owners.lock();
            owners.entry(owner).or_default().hold = Arc::downgrade(shared);
        }
        Ok(guard)
    }
}
