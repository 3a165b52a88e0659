//! Tasks started later, by one task per runtime: each hold's lease keeper, and the tasks
//! backends need only for holds that live long ([`spawn_at`]).
//!
//! Most holds are released long before their first renewal, so a hold's keeper is not
//! spawned with it: each runtime has one [`Starter`] task that starts a hold's keeper a sixth
//! of the lease after the grant, if the hold is still there. A hold released before that costs
//! no task to start and then abort. The starter sleeps until the earliest start it knows of
//! (it does not move that time when a hold leaves); a new hold wakes it only if it must start
//! earlier, or if the starter found nobody waiting when it last looked, so a steady stream of
//! short holds wakes it about once a sixth of a lease.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};
use tokio_util::task::AbortOnDropHandle;

use crate::sync::Mutex;
use crate::time::from_now;

/// Starts due within this much of each other are made together, so that a stream of holds
/// wakes the starter once per this span at most.
const START_TOGETHER: Duration = Duration::from_millis(50);

/// What waits in a starter to be started: a hold's keeper.
pub(crate) trait Startable: Send + Sync + 'static {
    /// Starts now, unless the place `key` is no longer this one's (it was started or
    /// stopped meanwhile).
    fn start(self: Arc<Self>, key: Key);

    /// The runtime shut down before the start.
    fn never_started(&self);
}

/// A task that waits in its runtime's starter, or runs.
pub(crate) enum Task {
    /// Not spawned yet: in its runtime's starter. Dropping it takes it out.
    Waiting(Waiting),
    /// Spawned; dropping the handle aborts it.
    Running(
        #[allow(dead_code, reason = "kept for its drop, which aborts the task")]
        AbortOnDropHandle<()>,
    ),
}

impl Task {
    /// Whether this is the waiting task with `key`.
    pub(crate) fn waits_as(&self, key: Key) -> bool {
        matches!(self, Self::Waiting(w) if w.key == key)
    }

    /// Whether it still waits for its start.
    pub(crate) fn is_waiting(&self) -> bool {
        matches!(self, Self::Waiting(_))
    }
}

/// A place in a runtime's starter; dropped, it leaves it.
pub(crate) struct Waiting {
    starter: Arc<Starter>,
    key: Key,
}

/// When a task starts, and a number that tells tasks starting at the same instant apart.
pub(crate) type Key = (Instant, u64);

impl Drop for Waiting {
    fn drop(&mut self) {
        let job = self.starter.queue.lock().jobs.remove(&self.key);
        // Dropped outside the queue's lock: a task's drop may run any code, even a hold's.
        drop(job);
    }
}

/// The jobs of one runtime that have not started yet, and the task that starts them.
pub(crate) struct Starter {
    queue: Mutex<Queue>,
    /// Wakes the task when a job must start before the time it sleeps until.
    wake: Notify,
}

/// What the starter starts.
enum Job {
    /// A hold's keeper.
    Keeper(Weak<dyn Startable>),
    /// A backend's task ([`spawn_at`]): what spawns it, on the starter's runtime. The task
    /// itself is made only when it starts, since most never do (a future is often many times
    /// the size of what it is made from, and would be moved and boxed for nothing).
    Task(Box<dyn FnOnce() + Send>),
}

struct Queue {
    jobs: BTreeMap<Key, Job>,
    next: u64,
    /// When the task looks next; `None` while it sleeps until it is woken.
    alarm: Option<Instant>,
    /// The runtime shut down (the task was dropped): nothing can start any more.
    closed: bool,
}

/// The starters of the runtimes that have one.
static STARTERS: Mutex<Vec<(Id, Weak<Starter>)>> = Mutex::new(Vec::new());

impl Starter {
    /// The starter of `runtime`, spawned on first use; `None` if the runtime is shutting down.
    fn of(runtime: &Handle) -> Option<Arc<Self>> {
        let id = runtime.id();
        let mut all = STARTERS.lock();
        if let Some(found) = all
            .iter()
            .find(|(of, _)| *of == id)
            .and_then(|(_, starter)| starter.upgrade())
            .filter(|starter| !starter.queue.lock().closed)
        {
            return Some(found);
        }
        all.retain(|(of, starter)| *of != id && starter.strong_count() > 0);
        let starter = Arc::new(Self {
            queue: Mutex::new(Queue {
                jobs: BTreeMap::new(),
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
        let open = !starter.queue.lock().closed;
        open.then_some(starter)
    }
}

/// Closes its starter's queue when the starter task ends (its runtime shut down), and tells
/// every keeper still waiting that it will never start.
struct Closing(Arc<Starter>);

impl Drop for Closing {
    fn drop(&mut self) {
        let waiting = {
            let mut q = self.0.queue.lock();
            q.closed = true;
            std::mem::take(&mut q.jobs)
        };
        for job in waiting.into_values() {
            // A backend's task is dropped with its runtime, as a spawned one would be.
            if let Job::Keeper(keeper) = job
                && let Some(keeper) = keeper.upgrade()
            {
                keeper.never_started();
            }
        }
    }
}

/// The starter task: starts the jobs that are due, then sleeps until the next one is.
async fn starts(starter: &Starter) {
    loop {
        let (due, alarm) = {
            let mut q = starter.queue.lock();
            let later_ones = q.jobs.split_off(&(from_now(START_TOGETHER), u64::MAX));
            let due = std::mem::replace(&mut q.jobs, later_ones);
            q.alarm = q.jobs.keys().next().map(|(at, _)| *at);
            (due, q.alarm)
        };
        for (key, job) in due {
            match job {
                Job::Keeper(keeper) => {
                    if let Some(keeper) = keeper.upgrade() {
                        keeper.start(key);
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

/// Puts a keeper in the starter of `runtime`, to start at `at`; `None` if the runtime is
/// shutting down.
pub(crate) fn enqueue_keeper(
    runtime: &Handle,
    at: Instant,
    keeper: Weak<dyn Startable>,
) -> Option<Waiting> {
    enqueue(runtime, at, Job::Keeper(keeper)).ok()
}

/// Puts `job` in the starter of `runtime`, to start at `at`; gives it back if the runtime
/// is shutting down.
fn enqueue(runtime: &Handle, at: Instant, job: Job) -> Result<Waiting, Job> {
    let Some(starter) = Starter::of(runtime) else {
        return Err(job);
    };
    let mut q = starter.queue.lock();
    if q.closed {
        return Err(job);
    }
    let key = (at, q.next);
    q.next = q.next.wrapping_add(1);
    q.jobs.insert(key, job);
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
