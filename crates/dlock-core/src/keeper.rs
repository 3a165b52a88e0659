//! The lease keeper: the one background task per hold that renews a watchdog lease or ends a
//! fixed one. It never stops silently: it ends when the guard releases (which disarms it
//! first), after it has marked the hold lost, or, if its runtime shuts down or a backend call
//! panics, by marking the hold lost from its drop guard.
//!
//! Most holds are released long before their first renewal, so a hold's keeper is not
//! spawned with it: each runtime has one [`Starter`] task that spawns a hold's keeper a sixth
//! of the lease after the grant (half way to the first renewal, at a third), if the hold is
//! still there. A hold released before that costs no task to start and then abort. The
//! starter sleeps until the earliest start it knows of (it does not move that time when a
//! hold leaves); a new hold wakes it only if it must start earlier, or if the starter found
//! nobody waiting when it last looked, so a steady stream of short holds wakes it about once
//! a sixth of a lease. An `extend` starts a waiting keeper at once (a shortened fixed lease
//! must not wait for the start), and a loss the backend reported before the keeper started
//! is cleaned up at the release, as the keeper would have done.
//!
//! Backends start their own per-hold tasks the same way ([`spawn_at`]): a task that a hold
//! needs only if it lives long (a connection's watcher) waits in the starter, and a hold
//! released before then never spawns it.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::error::Error;
use crate::guard::{Shared, lock};
use crate::loss::LossReason;
use crate::metrics;
use crate::options::Lease;
use crate::time::{Backoff, from_now, later};

/// Starts due within this much of each other are made together, so that a stream of holds
/// wakes the starter once per this span at most.
const START_TOGETHER: Duration = Duration::from_millis(50);

/// The keeper of one hold: waiting for its start, or running.
pub(crate) enum Keeper {
    /// Not spawned yet: in its runtime's starter. Dropping it takes it out.
    Waiting(Waiting),
    /// Spawned; dropping the handle aborts it.
    Running(
        #[allow(dead_code, reason = "kept for its drop, which aborts the task")]
        AbortOnDropHandle<()>,
    ),
}

/// A hold's place in its runtime's starter; dropped, it leaves it.
pub(crate) struct Waiting {
    starter: Arc<Starter>,
    key: Key,
}

/// When a keeper starts, and a number that tells holds starting at the same instant apart.
type Key = (Instant, u64);

impl Drop for Waiting {
    fn drop(&mut self) {
        let job = lock(&self.starter.queue).holds.remove(&self.key);
        // Dropped outside the queue's lock: a task's drop may run any code, even a hold's.
        drop(job);
    }
}

/// The holds of one runtime whose keepers have not started yet, and the task that starts them.
pub(crate) struct Starter {
    queue: Mutex<Queue>,
    /// Wakes the task when a hold must start before the time it sleeps until.
    wake: Notify,
}

/// What the starter starts.
enum Job {
    /// A hold's keeper.
    Keeper(Weak<Shared>),
    /// A backend's task ([`spawn_at`]): what spawns it, on the starter's runtime. The task
    /// itself is made only when it starts, since most never do (a future is often many times
    /// the size of what it is made from, and would be moved and boxed for nothing).
    Task(Box<dyn FnOnce() + Send>),
}

struct Queue {
    holds: BTreeMap<Key, Job>,
    next: u64,
    /// When the task looks next; `None` while it sleeps until it is woken.
    alarm: Option<Instant>,
    /// The runtime shut down (the task was dropped): keepers can no longer start.
    closed: bool,
}

/// The starters of the runtimes that have one.
static STARTERS: Mutex<Vec<(Id, Weak<Starter>)>> = Mutex::new(Vec::new());

impl Starter {
    /// The starter of `runtime`, spawned on first use; `None` if the runtime is shutting down.
    fn of(runtime: &Handle) -> Option<Arc<Self>> {
        let id = runtime.id();
        let mut all = lock(&STARTERS);
        if let Some(found) = all
            .iter()
            .find(|(of, _)| *of == id)
            .and_then(|(_, starter)| starter.upgrade())
            .filter(|starter| !lock(&starter.queue).closed)
        {
            return Some(found);
        }
        all.retain(|(of, starter)| *of != id && starter.strong_count() > 0);
        let starter = Arc::new(Self {
            queue: Mutex::new(Queue {
                holds: BTreeMap::new(),
                next: 0,
                alarm: None,
                closed: false,
            }),
            wake: Notify::new(),
        });
        all.push((id, Arc::downgrade(&starter)));
        drop(all);
        // Its drop guard exists before the first poll: a runtime that refuses the task (it is
        // shutting down) drops it at once, which closes the queue.
        let closing = Closing(Arc::clone(&starter));
        drop(runtime.spawn(async move { starts(&closing.0).await }));
        let open = !lock(&starter.queue).closed;
        open.then_some(starter)
    }
}

/// Closes its starter's queue when the starter task ends (its runtime shut down), and
/// reports the loss of every hold still waiting for its keeper, as a keeper dropped with its
/// runtime does.
struct Closing(Arc<Starter>);

impl Drop for Closing {
    fn drop(&mut self) {
        let waiting = {
            let mut q = lock(&self.0.queue);
            q.closed = true;
            std::mem::take(&mut q.holds)
        };
        for job in waiting.into_values() {
            // A backend's task is dropped with its runtime, as a spawned one would be.
            if let Job::Keeper(shared) = job
                && let Some(shared) = shared.upgrade()
            {
                shared.keeper_stopped();
            }
        }
    }
}

/// The starter task: spawns the keepers that are due, then sleeps until the next one is.
async fn starts(starter: &Starter) {
    loop {
        let (due, alarm) = {
            let mut q = lock(&starter.queue);
            let later_ones = q.holds.split_off(&(from_now(START_TOGETHER), u64::MAX));
            let due = std::mem::replace(&mut q.holds, later_ones);
            q.alarm = q.holds.keys().next().map(|(at, _)| *at);
            (due, q.alarm)
        };
        for (key, job) in due {
            match job {
                Job::Keeper(shared) => {
                    if let Some(shared) = shared.upgrade() {
                        shared.start_waiting_keeper(key);
                    }
                }
                Job::Task(start) => start(),
            }
        }
        match alarm {
            Some(at) => {
                tokio::select! {
                    () = sleep_until(at) => {}
                    () = starter.wake.notified() => {}
                }
            }
            None => starter.wake.notified().await,
        }
    }
}

/// The keeper of a hold just granted on `runtime`: waiting in the runtime's starter until a
/// sixth of its lease has passed, or spawned at once if the runtime is shutting down (which
/// drops it, and it reports the loss).
pub(crate) fn start(runtime: &Handle, shared: &Arc<Shared>) -> Keeper {
    let at = later(shared.granted, shared.lease.ttl() / 6);
    match enqueue(runtime, at, Job::Keeper(Arc::downgrade(shared))) {
        Ok(waiting) => Keeper::Waiting(waiting),
        Err(_) => spawn(runtime, shared),
    }
}

/// Puts `job` in the starter of `runtime`, to start at `at`; gives it back if the runtime
/// is shutting down.
fn enqueue(runtime: &Handle, at: Instant, job: Job) -> Result<Waiting, Job> {
    let Some(starter) = Starter::of(runtime) else {
        return Err(job);
    };
    let mut q = lock(&starter.queue);
    if q.closed {
        return Err(job);
    }
    let key = (at, q.next);
    q.next = q.next.wrapping_add(1);
    q.holds.insert(key, job);
    let sooner = q.alarm.is_none_or(|alarm| at < alarm);
    if sooner {
        q.alarm = Some(at);
    }
    drop(q);
    if sooner {
        starter.wake.notify_one();
    }
    Ok(Waiting { starter, key })
}

/// A task that [`spawn_at`] spawns at its time. Dropped before the starter took it, the task
/// is never made nor spawned; dropped after, the task runs on (it is detached).
#[must_use = "dropping it cancels the task if it has not started yet"]
pub struct Later(Option<Waiting>);

impl fmt::Debug for Later {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Later")
            .field("at", &self.0.as_ref().map(|w| w.key.0))
            .finish()
    }
}

/// Spawns the task `make` makes on the current runtime at `at`, unless the returned
/// [`Later`] is dropped before. Starts due within 50 ms of each other are made together, so a
/// task may start up to 50 ms early; a task that must not run before a time checks it itself.
///
/// For a task a hold needs only if it lives long, such as a check of its connection between
/// renewals: most holds are released within milliseconds, and one released before `at`
/// costs no task (a spawned task costs two wake-ups of a worker thread, and an abort one
/// more) and not even its future: `make` is called only when the task starts. One task per
/// runtime starts them all, the task that starts the holds' keepers.
///
/// `make` is called at the start of the new task (what it reads of its context, such as the
/// current span, is that task's: capture it outside). Outside a runtime, or in a runtime that
/// is shutting down, `make` is dropped uncalled (there is nothing to run the task on).
///
/// ```
/// use std::time::Duration;
/// use dlock_core::backend::{from_now, spawn_at};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, rx) = tokio::sync::oneshot::channel();
/// let check = spawn_at(from_now(Duration::from_millis(10)), move || async move {
///     let _ = tx.send("checked");
/// });
/// assert_eq!(rx.await, Ok("checked"));
/// drop(check);
///
/// // Dropped before its time: never made, never spawned.
/// let (tx, rx) = tokio::sync::oneshot::channel::<()>();
/// drop(spawn_at(from_now(Duration::from_secs(60)), move || async move { drop(tx) }));
/// assert!(rx.await.is_err());
/// # }
/// ```
pub fn spawn_at<M, F>(at: Instant, make: M) -> Later
where
    M: FnOnce() -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let Ok(runtime) = Handle::try_current() else {
        return Later(None);
    };
    // The task is made in a task of its own, not in the starter's loop: whatever making it
    // does (even a panic) stays out of the starter, which starts every keeper of the runtime.
    let start = move || drop(tokio::spawn(async move { make().await }));
    match enqueue(&runtime, at, Job::Task(Box::new(start))) {
        Ok(waiting) => Later(Some(waiting)),
        // A runtime that is shutting down would drop the task unpolled.
        Err(_) => Later(None),
    }
}

/// The keeper of `shared`, spawned on `runtime`.
pub(crate) fn spawn(runtime: &Handle, shared: &Arc<Shared>) -> Keeper {
    Keeper::Running(AbortOnDropHandle::new(
        runtime.spawn(keep(Arc::clone(shared))),
    ))
}

impl Keeper {
    /// Whether this is the waiting keeper with `key`.
    pub(crate) fn waits_as(&self, key: Key) -> bool {
        matches!(self, Self::Waiting(w) if w.key == key)
    }
}

/// Shortest pause between two failed renewal attempts.
const RETRY_MIN: Duration = Duration::from_millis(50);
/// Longest pause between two failed renewal attempts.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Reports the loss if the keeper is dropped before it was disarmed (runtime shutdown, panic),
/// even if it was never polled.
struct Armed(Arc<Shared>);

impl Drop for Armed {
    fn drop(&mut self) {
        self.0.keeper_stopped();
    }
}

/// The keeper of one hold, to spawn. Its drop guard exists before the first poll.
pub(crate) fn keep(shared: Arc<Shared>) -> impl Future<Output = ()> + Send + 'static {
    let armed = Armed(shared);
    async move {
        let shared = &armed.0;
        keep_until_lost(shared).await;
    }
}

async fn keep_until_lost(shared: &Shared) {
    let lost = shared.signal.lost();
    let work = async {
        match shared.lease {
            Lease::Watchdog { ttl } => watchdog(shared, ttl).await,
            Lease::Fixed(_) => fixed(shared).await,
        }
    };
    tokio::select! {
        // Someone else (the backend, a store hook, the guard's own check at the lease end)
        // marked the hold lost: nothing left to keep.
        () = lost => {}
        reason = work => {
            shared.signal.mark_lost(reason);
        }
    }
    // Best effort, whoever saw the loss first: clean up what may be left on the server. The
    // guard's check can see a lease end before this task wakes, and a backend without a
    // server-side lease (ZooKeeper) would keep its node until the session ends. The release is
    // owner-checked, so it cannot touch a hold that someone else took over meanwhile.
    if let Err(e) = shared.hold.release().await {
        tracing::debug!(backend = shared.backend, lock = %shared.name, error = %e, "clean-up after a loss found nothing to release");
    }
}

/// Ends when the fixed lease has run out; `extend` moves the end and wakes us.
async fn fixed(shared: &Shared) -> LossReason {
    loop {
        let end = shared.lease_end();
        if Instant::now() >= end {
            return LossReason::FixedLeaseEnded;
        }
        tokio::select! {
            () = sleep_until(end) => {}
            () = shared.extended.notified() => {}
        }
    }
}

/// Renews every `ttl / 3`; ends (with the reason) once the hold cannot be vouched for.
async fn watchdog(shared: &Shared, ttl: Duration) -> LossReason {
    let period = ttl / 3;
    let mut next = later(shared.granted, period);
    loop {
        sleep_until(next).await;
        let lease_end = shared.lease_end();
        let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
        loop {
            let sent = Instant::now();
            if sent >= lease_end {
                return shared.reason_at_lease_end();
            }
            let span = tracing::debug_span!("dlock.renew", backend = shared.backend, kind = %shared.kind, lock = %shared.name);
            match timeout_at(lease_end, shared.hold.extend(ttl).instrument(span)).await {
                Ok(Ok(())) => {
                    metrics::renewed(shared.backend, "renewed");
                    shared.set_lease_end(later(sent, ttl));
                    shared.signal.set_renewal_failing(false);
                    next = later(sent, period);
                    break;
                }
                Ok(Err(Error::LockLost { .. })) => {
                    metrics::renewed(shared.backend, "gone");
                    return LossReason::Gone;
                }
                Ok(Err(e)) if e.is_retryable() => {
                    metrics::renewed(shared.backend, "failed");
                    shared.signal.set_renewal_failing(true);
                    tracing::warn!(
                        backend = shared.backend,
                        lock = %shared.name,
                        error = %e,
                        "dlock.renew failed; retrying until the lease ends"
                    );
                    sleep_until(from_now(retry.next_pause()).min(lease_end)).await;
                }
                Ok(Err(e)) => {
                    metrics::renewed(shared.backend, "failed");
                    tracing::error!(
                        backend = shared.backend,
                        lock = %shared.name,
                        error = %e,
                        "dlock.renew failed with an error that retrying cannot fix"
                    );
                    return LossReason::RenewalFailed;
                }
                Err(_elapsed) => {
                    metrics::renewed(shared.backend, "failed");
                    return LossReason::RenewalFailed;
                }
            }
        }
    }
}
