//! The wait of one acquisition: attempts until one is granted or the deadline passes, with
//! capped exponential backoff and jitter between them, and the wake-ups that cut a pause
//! short.
//!
//! Wake-up sources, for the strategies whose waiters poll (unique-insert, optimistic; the
//! pinned strategies wait on the server's lock itself):
//! - [`registry`]: the waiters of this process by store and name; a release made in this
//!   process wakes one at once;
//! - [`notify`] (PostgreSQL): a release `NOTIFY`s the name, and a listening connection per
//!   provider wakes the waiters of this process through the registry.

use std::time::Duration;

use dlock_core::backend::{AcquireFn, Deadline, Retries, jitter};
use dlock_core::{Error, LockName, Result};
use tokio::time::Instant;

use crate::error;

#[cfg(feature = "postgres")]
pub(crate) mod notify;
pub(crate) mod registry;

/// First pause between two attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(4);
/// Longest pause between two attempts.
const BACKOFF_MAX: Duration = Duration::from_millis(200);
/// Shortest pause of a waiter queued behind others of its process: a release in the process
/// wakes them in turn, and polling sooner would only contend with the holder.
const QUEUED_PAUSE: Duration = Duration::from_millis(50);
/// An attempt that failed on its connection faster than this is made once more at the
/// deadline (a dead pooled connection fails at once; a database that refuses connections
/// fails only after the pool's wait).
const QUICK_FAILURE: Duration = Duration::from_millis(500);

/// Where the waiters of one provider are woken from.
#[derive(Debug)]
pub(crate) struct WakeSources {
    /// The provider's store id, which names its waiters in the [`registry`].
    store: String,
    /// Whether its waiters poll (and are woken); `false` where the server queues them.
    polls: bool,
    /// PostgreSQL: the listener of release notifications.
    #[cfg(feature = "postgres")]
    listener: Option<std::sync::Arc<notify::Wakeups>>,
}

impl WakeSources {
    /// The wake-ups of a provider on `store` whose waiters poll (`polls`) or wait on the
    /// server.
    pub(crate) fn new(store: &str, polls: bool) -> Self {
        Self {
            store: store.to_owned(),
            polls,
            #[cfg(feature = "postgres")]
            listener: None,
        }
    }

    /// With PostgreSQL's release notifications, heard by `listener`.
    #[cfg(feature = "postgres")]
    pub(crate) fn with_listener(
        mut self,
        listener: Option<std::sync::Arc<notify::Wakeups>>,
    ) -> Self {
        self.listener = listener;
        self
    }

    /// The listener of release notifications, if there is one.
    #[cfg(feature = "postgres")]
    pub(crate) fn listener(&self) -> Option<&notify::Wakeups> {
        self.listener.as_deref()
    }

    /// The wake-up of `name`'s waiters in this process: a release in this process (or, on
    /// PostgreSQL, one announced by `NOTIFY`) wakes one at once. `None` where the server
    /// queues the waiters.
    fn wakeup(&self, name: &LockName) -> Option<registry::Waiting> {
        if !self.polls {
            return None;
        }
        let waiting = registry::register(&self.store, name.as_str());
        // Releases are announced on PostgreSQL: listen from the first wait on.
        self.still_waiting();
        Some(waiting)
    }

    /// A waiter waits on (each pass of its wait after the first): on PostgreSQL the release
    /// listener notes it, and starts again if its task ended with the runtime it ran on.
    fn still_waiting(&self) {
        #[cfg(feature = "postgres")]
        if let Some(w) = &self.listener {
            w.listen();
        }
    }

    /// A place behind `name`'s waiters in this process, if it has any (see
    /// [`wakeup`](Self::wakeup)).
    fn queue_behind(&self, name: &LockName) -> Option<registry::Waiting> {
        if !self.polls {
            return None;
        }
        let behind = registry::join(&self.store, name.as_str());
        // The waiters ahead may be another provider's on the same store: this one listens
        // too, or its waiters would only poll once that provider is gone.
        if behind.is_some() {
            self.still_waiting();
        }
        behind
    }

    /// Wakes a waiter of `name` in this process after a release.
    pub(crate) fn released(&self, name: &LockName) {
        registry::wake(&self.store, name.as_str());
    }
}

/// Makes `attempt`s at `name` until one is granted or `deadline` passes: `Ok(None)` once it
/// passed with the lock held by someone else, the last attempt's error if the database could
/// not be asked then.
///
/// Where releases are announced, a waiter sleeps until one (or its pause) ends. A
/// notification that comes while it tries is kept for its next wait. A waiter registers after
/// its first try fails: an uncontended acquire registers nothing.
///
/// A newcomer queues behind the waiters of this process: with others already waiting for
/// this name, it waits for a release here (or its queued pause, or its deadline) before its
/// first try. A task that releases and at once acquires again thus does not take the lock
/// back before the waiter its release woke, and does not contend with it (a failed try on
/// SQLite takes the write lock the holder needs to release).
pub(crate) async fn until<T>(
    wakes: &WakeSources,
    name: &LockName,
    deadline: Deadline,
    mut attempt: impl AcquireFn<T>,
) -> Result<Option<T>> {
    let mut retries = Retries::new(BACKOFF_MIN, BACKOFF_MAX);
    let mut reconnected = false;
    let mut wakeup = wakes.queue_behind(name);
    if let Some(waiting) = &wakeup {
        tokio::select! {
            () = tokio::time::sleep_until(deadline.wake_after(QUEUED_PAUSE)) => {}
            () = waiting.released() => {}
        }
    }
    loop {
        let started = Instant::now();
        // The error of an attempt the database did not answer (a connection that broke or
        // could not be had, no answer in time); `None` for one it answered "held". At the
        // deadline the last attempt's is the answer: a database that could not be asked is
        // an error, never a lock held by someone else.
        let unanswered = match attempt().await {
            Ok(Some(granted)) => return Ok(Some(granted)),
            Ok(None) => {
                retries.answered();
                None
            }
            // At the deadline, one more try at once if the attempt failed fast on its
            // connection: the connection that broke was closed, and a pooled one that died
            // while idle (closed by the server or a proxy) should not make the answer. (A
            // pool whose idle connections all died can still answer with the error once per
            // dead connection.) An attempt that failed slowly (the wait for a connection) is
            // not made twice.
            Err(e @ Error::Connection { .. }) if deadline.has_passed() => {
                if reconnected || started.elapsed() >= QUICK_FAILURE {
                    return Err(e);
                }
                reconnected = true;
                continue;
            }
            Err(e) if e.is_retryable() => {
                if retries.failed() {
                    // A database that stays down must not look like a lock held for ever.
                    let failures = retries.failures();
                    tracing::warn!(lock = %name, error = %e, failures, "acquire keeps failing; still retrying");
                } else {
                    tracing::debug!(lock = %name, error = %e, "acquire attempt failed; retrying");
                }
                // Contention (a lock wait that ran out, a deadlock victim, a busy SQLite
                // file) is the database's answer that the lock is held.
                (!error::answered_busy(&e)).then_some(e)
            }
            Err(e) => return Err(e),
        };
        if deadline.has_passed() {
            return unanswered.map_or(Ok(None), Err);
        }
        if wakeup.is_none() {
            wakeup = wakes.wakeup(name);
        } else {
            wakes.still_waiting();
        }
        let mut pause = retries.next_pause();
        if wakeup.as_ref().is_some_and(registry::Waiting::has_company) {
            pause = pause.max(QUEUED_PAUSE);
        }
        let jittered = jitter(pause);
        let sleep = tokio::time::sleep_until(deadline.wake_after(jittered));
        match &wakeup {
            Some(waiting) => {
                tokio::select! {
                    () = sleep => {}
                    () = waiting.released() => {}
                }
            }
            None => sleep.await,
        }
    }
}
