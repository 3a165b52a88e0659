//! Closing a provider: its holds released, its acquisitions refused from then on, and its
//! clean-ups in flight waited for, within a bound.
//!
//! A clean-up is work a dropped future leaves to a task of its own: a dropped guard's
//! release, a cancelled acquisition's undo, a call finished after its caller went. When
//! `main` returns, the runtime drops such tasks unfinished, and what they were to undo stays
//! on the store until its lease or session ends (a queued fair waiter blocks the queue
//! meanwhile). [`Closer::close`] waits for them: every clean-up task of the core, and the
//! backends' through [`cleanup`], is counted while it runs, for the provider whose
//! acquisition or release left it (known from a task-local value that the handles set
//! around their calls to the backend, and that a dropped future still sees as it drops).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::guard::LockGuard;
use crate::shared::Shared;
use crate::sync::Mutex;
use crate::time::Deadline;

/// A provider's clean-ups in flight, and the wake-up of those waiting for none.
#[derive(Default)]
pub(crate) struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

tokio::task_local! {
    /// The clean-ups record of the provider whose work runs (or is dropped) here: set around
    /// an acquisition and a release, so that what they leave to the background counts for
    /// their provider.
    static OWNER: Arc<InFlight>;
}

/// Runs `task` as work of the provider whose clean-ups `in_flight` records: the clean-ups it
/// leaves behind, even when dropped, count for that provider.
pub(crate) async fn as_work_of<F: Future>(in_flight: Option<&Arc<InFlight>>, task: F) -> F::Output {
    match in_flight {
        Some(f) => OWNER.scope(Arc::clone(f), task).await,
        None => task.await,
    }
}

/// One clean-up counted in flight, from its making to its drop (done, or dropped unfinished
/// by a runtime that shut down).
pub(crate) struct Ticket(Arc<InFlight>);

impl Ticket {
    pub(crate) fn new(in_flight: &Arc<InFlight>) -> Self {
        in_flight.count.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(in_flight))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// `task`, counted from now until it ends or is dropped as a clean-up of the provider whose
/// acquisition or release is running (or being dropped) here, if any: that provider's
/// [`close`](crate::LockProvider::close) waits for it. For the work a backend leaves to a
/// task of its own when one of its futures is dropped (an undo); the core's own
/// ([`UndoOnDrop`](crate::backend::UndoOnDrop),
/// [`finish_if_dropped`](crate::backend::finish_if_dropped), a dropped guard's release) are
/// counted already.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use dlock_core::backend::cleanup;
///
/// let task = tokio::spawn(cleanup(async { "undone" }));
/// assert_eq!(task.await.unwrap(), "undone");
/// # }
/// ```
pub fn cleanup<F: Future>(task: F) -> impl Future<Output = F::Output> {
    let owner = OWNER.try_with(Arc::clone).ok();
    let ticket = owner.as_ref().map(Ticket::new);
    async move {
        // What the clean-up leaves behind in turn counts for the same provider.
        let out = as_work_of(owner.as_ref(), task).await;
        drop(ticket);
        out
    }
}

/// A ticket for the provider whose work runs (or is dropped) here, if any.
pub(crate) fn ticket_here() -> Option<Ticket> {
    OWNER.try_with(Ticket::new).ok()
}

/// Waits until none of `in_flight`'s clean-ups is left, or `deadline` passes: how many were
/// still in flight then.
async fn cleanups_done(in_flight: &InFlight, deadline: Deadline) -> usize {
    loop {
        let idle = in_flight.idle.notified();
        tokio::pin!(idle);
        idle.as_mut().enable();
        let left = in_flight.count.load(Ordering::SeqCst);
        if left == 0 || deadline.has_passed() {
            return left;
        }
        tokio::select! {
            () = idle => {}
            () = deadline.sleep() => {}
        }
    }
}

/// What [`close`](crate::LockProvider::close) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Closed {
    /// The holds it released on the store.
    pub released: usize,
    /// The holds whose release did not end in time or failed: their stores end them with
    /// their leases or sessions.
    pub unreleased: usize,
    /// The provider's clean-ups (a dropped guard's release, a cancelled acquisition's undo)
    /// still in flight when the bound was up.
    pub cleanups_left: usize,
}

impl Closed {
    /// Whether everything was released and cleaned up in time.
    pub const fn is_clean(&self) -> bool {
        self.unreleased == 0 && self.cleanups_left == 0
    }
}

/// A provider's record of its live holds, and whether it was closed. One per provider, in
/// its [`ProviderMeta`](crate::backend::ProviderMeta); every handle of the provider shares it.
#[derive(Default)]
pub(crate) struct Closer {
    /// The holds handed out and not yet dropped, by a number of their own: a hold removes
    /// itself when its state is dropped, so the record never outgrows the live holds.
    holds: Mutex<Holds>,
    /// Cancelled when the close begins: acquisitions under way end with [`Error::Closed`].
    ///
    /// [`Error::Closed`]: crate::Error::Closed
    pub(crate) closing: CancellationToken,
    /// The provider's clean-ups in flight, acquisitions under way among them.
    pub(crate) in_flight: Arc<InFlight>,
}

#[derive(Default)]
struct Holds {
    next: u64,
    live: HashMap<u64, Weak<Shared>>,
}

impl fmt::Debug for Closer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Closer")
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl Closer {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Whether [`close`](Self::close) began.
    pub(crate) fn is_closed(&self) -> bool {
        self.closing.is_cancelled()
    }

    /// Records a hold handed to a caller. False if the provider is closed: the caller must
    /// give the hold back instead (its background release counts as a clean-up either way).
    pub(crate) fn register(self: &Arc<Self>, guard: &LockGuard) -> bool {
        let Some(shared) = guard.shared() else {
            return true;
        };
        shared.set_in_flight(&self.in_flight);
        let mut holds = self.holds.lock();
        // Under the lock that `close` cancels the token and takes its holds under: a hold
        // recorded after that is one `close` would not see.
        if self.is_closed() {
            return false;
        }
        let id = holds.next;
        holds.next = holds.next.wrapping_add(1);
        holds.live.insert(id, Arc::downgrade(shared));
        shared.set_record(Arc::downgrade(self), id);
        true
    }

    /// Forgets hold `id` (its state is being dropped).
    pub(crate) fn forget(&self, id: u64) {
        self.holds.lock().live.remove(&id);
    }

    /// Refuses acquisitions from now on (those under way end with an error), releases every
    /// hold handed out and not yet given back (their guards report
    /// [`LossReason::Closed`](crate::LossReason::Closed)), and waits for the provider's
    /// clean-ups in flight, all within `within`. Releases cut off by the bound go on in the
    /// background, counted as unreleased and as clean-ups left.
    pub(crate) async fn close(&self, within: Duration) -> Closed {
        let deadline = Deadline::after(within);
        let holds: Vec<Arc<Shared>> = {
            let mut holds = self.holds.lock();
            self.closing.cancel();
            holds
                .live
                .drain()
                .filter_map(|(_, w)| w.upgrade())
                .collect()
        };
        // The releases run as the provider's work: those cut off by the bound (or by a drop
        // of this future) finish in the background as its clean-ups.
        let releases = async {
            let mut pending: FuturesUnordered<_> = holds.iter().map(|s| s.close()).collect();
            let (mut released, mut failed) = (0, 0);
            let tally = async {
                while let Some(outcome) = pending.next().await {
                    match outcome {
                        Some(true) => released += 1,
                        Some(false) => failed += 1,
                        None => {}
                    }
                }
            };
            let cut_off = deadline.run(tally).await.is_none();
            let left = if cut_off { pending.len() } else { 0 };
            drop(pending);
            (released, failed + left)
        };
        let (released, unreleased) = as_work_of(Some(&self.in_flight), releases).await;
        Closed {
            released,
            unreleased,
            cleanups_left: cleanups_done(&self.in_flight, deadline).await,
        }
    }
}
