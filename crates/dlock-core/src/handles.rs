//! The handles every backend shares: the contract traits implemented once over a backend's
//! "acquire until this deadline" per primitive.
//!
//! A backend implements [`RawLock`], [`RawReadWriteLock`] or [`RawSemaphore`]: one remote
//! acquisition that waits until a [`Deadline`]. [`Lock`], [`ReadWriteLock`] and [`Semaphore`]
//! add the rest: the name, options and store id, `acquire` and `try_acquire` (with
//! `try_acquire(Duration::MAX)` meaning "as long as it takes"), re-entry, the read→write
//! deadlock check, and one `dlock.acquire` span with the same fields on every backend.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::close::{Closer, Ticket, as_work_of};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::loss::{LockKind, LossReason};
use crate::metrics;
use crate::name::LockName;
use crate::options::{Lease, LockOptions};
use crate::reentrancy::{Owner, Reentrancy};
use crate::shared::{Settled, Shared};
use crate::sync::Mutex;
use crate::time::Deadline;
use crate::trace::{self, in_span, kept};
use crate::traits::{DistributedLock, DistributedReadWriteLock, DistributedSemaphore};

/// What every handle knows about itself: backend, store, name, options.
#[derive(Debug, Clone)]
pub struct HandleInfo {
    backend: &'static str,
    store_id: Arc<str>,
    name: LockName,
    options: LockOptions,
    max_lease: Duration,
    /// The provider's record of the holds it handed out, if it keeps one.
    closer: Option<Arc<Closer>>,
}

impl HandleInfo {
    /// Describes a handle. The backend has validated `name` and `options` already.
    pub fn new(
        backend: &'static str,
        store_id: impl Into<Arc<str>>,
        name: LockName,
        options: LockOptions,
    ) -> Self {
        Self {
            backend,
            store_id: store_id.into(),
            name,
            options,
            max_lease: Lease::MAX,
            closer: None,
        }
    }

    /// The handle's provider's record of its holds: each hold handed out is recorded, and
    /// nothing is handed out once the provider is closed.
    pub(crate) fn with_closer(mut self, closer: Arc<Closer>) -> Self {
        self.closer = Some(closer);
        self
    }

    /// The error of an acquisition through a closed provider.
    fn closed(&self) -> Error {
        Error::Closed {
            backend: self.backend,
            name: self.name.as_str().to_owned(),
        }
    }

    /// Fails if the provider is closed.
    fn check_open(&self) -> Result<()> {
        match &self.closer {
            Some(c) if c.is_closed() => Err(self.closed()),
            _ => Ok(()),
        }
    }

    /// `guard`, recorded by the provider as handed out; a provider closed meanwhile gets it
    /// back instead (its drop releases it at once, in the background) and the caller an
    /// error.
    fn admit(&self, guard: LockGuard) -> Result<LockGuard> {
        match &self.closer {
            Some(c) if !Closer::register(c, &guard) => {
                drop(guard);
                Err(self.closed())
            }
            _ => Ok(guard),
        }
    }

    /// The longest lease the backend can keep a hold for
    /// ([`Capabilities::max_lease`](crate::Capabilities::max_lease)): its guards refuse an
    /// `extend` past it. [`Lease::MAX`] unless set.
    #[must_use]
    pub fn with_max_lease(mut self, max_lease: Duration) -> Self {
        self.max_lease = max_lease.min(Lease::MAX);
        self
    }

    /// The backend's short name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The store's id.
    pub fn store_id(&self) -> &str {
        &self.store_id
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The handle's options.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    pub(crate) fn request(&self, deadline: Deadline) -> Request<'_> {
        Request {
            name: &self.name,
            options: &self.options,
            deadline,
        }
    }

    /// The guard of an acquisition that waited as long as it takes ([`Deadline::NEVER`]),
    /// which ends only with the lock or an error: `Ok(None)` from it is an error too.
    fn forever(&self, acquired: Result<Option<LockGuard>>) -> Result<LockGuard> {
        acquired?.ok_or_else(|| Error::unbounded_wait_ended(self.backend, &self.name))
    }
}

/// The accessors every handle answers from its [`HandleInfo`] (in `info`).
macro_rules! info_accessors {
    () => {
        fn name(&self) -> &LockName {
            &self.info.name
        }

        fn options(&self) -> &LockOptions {
            &self.info.options
        }

        fn store_id(&self) -> &str {
            &self.info.store_id
        }
    };
}

/// One remote acquisition, as the core hands it to a backend.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Request<'a> {
    /// The lock's name.
    pub name: &'a LockName,
    /// The handle's options (lease, fairness, reentrancy).
    pub options: &'a LockOptions,
    /// When to give up and return `Ok(None)`; [`Deadline::NEVER`] waits as long as it takes.
    pub deadline: Deadline,
}

/// A backend's mutex: one acquisition on the store for a new holder.
///
/// Re-entry is the core's business: [`Lock`] calls this once per remote hold, and for a
/// `reentrant(false)` handle once per acquisition, so each call must be a holder of its own
/// (its own hash field, node, row owner) that waits for the others, including earlier holds of
/// the same handle.
#[async_trait]
pub trait RawLock: fmt::Debug + Send + Sync + 'static {
    /// Acquires, waiting until `req.deadline`; `Ok(None)` once it passed without the lock.
    ///
    /// Must be cancel safe: dropped at any await, it leaves nothing behind on the store.
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>>;
}

/// A backend's read-write lock.
#[async_trait]
pub trait RawReadWriteLock: fmt::Debug + Send + Sync + 'static {
    /// Acquires a read hold, waiting until `req.deadline`. `downgrade` is true when this handle
    /// holds the write hold right now: the read must then be granted beside it (and the backend
    /// must make sure that write hold is still there when it grants, or wait like anyone else).
    ///
    /// Must be cancel safe.
    async fn read(&self, req: &Request<'_>, downgrade: bool) -> Result<Option<LockGuard>>;

    /// Acquires the write hold, waiting until `req.deadline`.
    ///
    /// Must be cancel safe.
    async fn write(&self, req: &Request<'_>) -> Result<Option<LockGuard>>;
}

/// A backend's counting semaphore.
#[async_trait]
pub trait RawSemaphore: fmt::Debug + Send + Sync + 'static {
    /// Takes one permit out of `permits`, waiting until `req.deadline`.
    ///
    /// Must be cancel safe.
    async fn acquire(&self, req: &Request<'_>, permits: u32) -> Result<Option<LockGuard>>;

    /// How many of `permits` are free right now (see
    /// [`DistributedSemaphore::available`]). The default: [`Error::Unsupported`].
    async fn available(&self, name: &LockName, permits: u32) -> Result<u32> {
        let _ = (name, permits);
        Err(Error::unsupported(
            "dlock",
            "counting a semaphore's available permits",
        ))
    }
}

/// One try at an acquisition, made again by a loop that retries it: any
/// `FnMut() -> impl Future<Output = Result<Option<T>>>`, whose `Ok(None)` says the lock is
/// held by someone else.
pub trait AcquireFn<T>: FnMut() -> Self::Try {
    /// The try's future.
    type Try: Future<Output = Result<Option<T>>>;
}

impl<T, F, Fut> AcquireFn<T> for F
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    type Try = Fut;
}

/// Runs a backend's acquisition until it hands over a hold the backend vouches for.
///
/// A grant whose reply came back after the hold's end had already passed (a reply delayed
/// longer than the lease, a paused process) is a guard that is lost on arrival: it is dropped
/// (its store ends it with its lease, which is over) and the acquisition tried again while
/// the deadline allows, so no caller is ever handed a hold that another client may already
/// have. A grant that arrives while the backend's session is suspended (reconnecting) is
/// waited on until the session is back (then it is handed over) or lost (then the acquisition
/// is tried again), within the deadline.
///
/// A timed acquisition is also cut off [`CALL_GRACE`] after its deadline, whatever the backend
/// is waiting for (a slow script, a SUBSCRIBE, a pool, a hung server): `try_acquire(wait)`
/// returns by `wait` plus that grace, with a retryable [`Error::Connection`] (the store did not
/// answer, so nothing says the lock is held). Backends are cancel safe, so what a cut-off call
/// may have taken is given back by their undo.
pub(crate) async fn live(
    info: &HandleInfo,
    deadline: Deadline,
    mut acquire: impl AcquireFn<LockGuard>,
) -> Result<Option<LockGuard>> {
    info.check_open()?;
    let closer = info.closer.as_ref();
    // An acquisition under way counts as a clean-up of its provider: a close waits for it
    // to end (the close ends it) and for what it leaves behind.
    let _running = closer.map(|c| Ticket::new(&c.in_flight));
    let attempts = async {
        let mut dead = 0u32;
        loop {
            let Some(guard) = acquire().await? else {
                return Ok(None);
            };
            guard.set_drift(info.options.vouch_margin());
            guard.set_max_lease(info.max_lease);
            let reason = match settle(&guard, deadline).await {
                Settled::Held => {
                    // Only a hold handed to the caller keeps its least time: one dropped here
                    // (an error, a cut-off, a cancelled acquire) is released at once.
                    let guard = info.admit(guard)?;
                    guard.set_hold_at_least(info.options.hold_at_least);
                    return Ok(Some(guard));
                }
                Settled::Lost(reason) => reason,
                Settled::Suspended => {
                    return Err(Error::no_answer(
                        info.backend,
                        format!(
                            "{:?} was granted, but the session to the store was suspended \
                             (reconnecting) and did not come back before the deadline",
                            info.name.as_str()
                        ),
                    ));
                }
            };
            tracing::debug!(lock = %guard.name(), ?reason, "granted after the hold's end; trying again");
            let lease = guard_lease(&guard);
            drop(guard);
            dead += 1;
            // Every grant arriving dead means the lease is shorter than the trip to the store
            // and back: say so instead of trying for ever.
            if dead >= DEAD_ON_ARRIVAL_LIMIT || deadline.has_passed() {
                return Err(Error::Backend {
                    backend: info.backend,
                    message: format!(
                        "{dead} grant(s) of {:?} in a row were lost on arrival ({reason}): \
                         the lease{lease} is not longer than the round trip to the store",
                        info.name.as_str()
                    ),
                    retryable: true,
                    source: None,
                });
            }
            tokio::time::sleep_until(deadline.wake_after(DEAD_ON_ARRIVAL_PAUSE * dead)).await;
        }
    };
    // What the backend leaves to the background (an undo when this is dropped) counts as
    // a clean-up of the handle's provider.
    let attempts = as_work_of(closer.map(|c| &c.in_flight), attempts);
    let attempts = async {
        match closer {
            Some(c) => tokio::select! {
                biased;
                () = c.closing.cancelled() => Err(info.closed()),
                acquired = attempts => acquired,
            },
            None => attempts.await,
        }
    };
    match deadline.with_grace(CALL_GRACE).run(attempts).await {
        Some(result) => result,
        None => Err(Error::no_answer(
            info.backend,
            format!(
                "no answer from the store about {:?} within the wait and {CALL_GRACE:?} more",
                info.name.as_str()
            ),
        )),
    }
}

/// Waits while a fresh grant is suspended (see [`Shared::settle`]).
async fn settle(guard: &LockGuard, deadline: Deadline) -> Settled {
    match guard.shared() {
        Some(shared) => shared.settle(deadline).await,
        None => Settled::Lost(LossReason::Gone),
    }
}

/// How many grants in a row may be lost on arrival before the acquisition fails.
const DEAD_ON_ARRIVAL_LIMIT: u32 = 5;

/// The pause after a grant lost on arrival, times the number of such grants in a row.
const DEAD_ON_ARRIVAL_PAUSE: Duration = Duration::from_millis(20);

/// The lease of a guard, for messages.
fn guard_lease(guard: &LockGuard) -> String {
    guard
        .shared()
        .map(|s| format!(" ({:?})", s.lease.ttl()))
        .unwrap_or_default()
}

/// How long past its deadline a timed acquisition's calls to the store may run before the
/// handle cuts them off (the wait itself ends at the deadline; this bounds a slow or hung
/// call, so `try_acquire(wait)` returns by `wait` plus this).
pub const CALL_GRACE: Duration = Duration::from_secs(2);

/// Runs the acquisition `acquire` makes inside its span and records how it ended. (It takes
/// what makes the acquisition, not the acquisition: an `async fn` keeps a future it is given
/// beside the one it awaits, see [`Deadline::run`].)
pub(crate) async fn traced<M, F>(
    info: &HandleInfo,
    kind: LockKind,
    acquire: M,
) -> Result<Option<LockGuard>>
where
    M: FnOnce() -> F,
    F: Future<Output = Result<Option<LockGuard>>>,
{
    let span = trace::acquire(info.backend, kind, &info.name);
    let started = Instant::now();
    let result = in_span(&span, acquire()).await;
    let took = started.elapsed();
    let outcome = match &result {
        Ok(Some(_)) => "acquired",
        Ok(None) => "timeout",
        Err(e) => {
            tracing::debug!(parent: &span, error = %e, "dlock.acquire failed");
            "error"
        }
    };
    // Recorded only where the span is kept (a record on a span a subscriber disabled is
    // work for nothing).
    if kept(&span) {
        span.record(
            "waited_ms",
            u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        );
        if let Ok(Some(guard)) = &result {
            span.record("token", guard.fencing_token().get());
        }
        span.record("outcome", outcome);
    }
    metrics::acquired(info.backend, kind, outcome, took);
    result
}

/// The holds a handle's owners have taken and not yet given back, to tell whether the caller
/// holds the read or the write side right now.
#[derive(Debug, Default)]
struct Holds(Mutex<Vec<(Owner, Weak<Shared>)>>);

impl Holds {
    fn add(&self, guard: &LockGuard) {
        if let Some(shared) = guard.shared() {
            let mut holds = self.0.lock();
            holds.retain(|(_, w)| w.strong_count() > 0);
            holds.push((Owner::current(), Arc::downgrade(shared)));
        }
    }

    /// Whether the caller holds one.
    fn caller_holds(&self) -> bool {
        let me = Owner::current();
        self.0
            .lock()
            .iter()
            .any(|(owner, w)| *owner == me && w.upgrade().is_some_and(|s| s.is_live()))
    }
}

/// A mutex handle over a backend's [`RawLock`]. Each task that acquires through it (through
/// the `Arc` the provider returns) is an owner of its own: tasks exclude each other, and a
/// task re-enters only its own hold.
#[derive(Debug)]
pub struct Lock<R> {
    info: HandleInfo,
    reentrancy: Reentrancy,
    raw: R,
}

impl<R: RawLock> Lock<R> {
    /// A handle.
    pub fn new(info: HandleInfo, raw: R) -> Self {
        Self {
            info,
            reentrancy: Reentrancy::new(),
            raw,
        }
    }

    /// The backend part.
    pub fn raw(&self) -> &R {
        &self.raw
    }

    async fn acquire_until(&self, deadline: Deadline) -> Result<Option<LockGuard>> {
        let req = self.info.request(deadline);
        traced(&self.info, LockKind::Mutex, || {
            let remote = || live(&self.info, deadline, || self.raw.acquire(&req));
            self.reentrancy.acquire(&self.info, deadline, remote)
        })
        .await
    }
}

#[async_trait]
impl<R: RawLock> DistributedLock for Lock<R> {
    info_accessors!();

    async fn acquire(&self) -> Result<LockGuard> {
        self.info.forever(self.acquire_until(Deadline::NEVER).await)
    }

    async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(Deadline::after(wait)).await
    }
}

/// A read-write lock handle over a backend's [`RawReadWriteLock`]. Each task that acquires
/// through it is an owner of its own, and its read and write sides share that owner: the task
/// that writes can also read (downgrade), and a task that reads and asks for the write lock
/// gets [`Error::WouldDeadlock`] at once, re-entrant or not. Another task's read makes a
/// writer wait, as any reader's does.
#[derive(Debug)]
pub struct ReadWriteLock<R> {
    info: HandleInfo,
    read: Reentrancy,
    write: Reentrancy,
    reads: Holds,
    writes: Holds,
    raw: R,
}

impl<R: RawReadWriteLock> ReadWriteLock<R> {
    /// A handle.
    pub fn new(info: HandleInfo, raw: R) -> Self {
        Self {
            info,
            read: Reentrancy::new(),
            write: Reentrancy::new(),
            reads: Holds::default(),
            writes: Holds::default(),
            raw,
        }
    }

    /// The backend part.
    pub fn raw(&self) -> &R {
        &self.raw
    }

    /// Whether the calling task holds the write side through this handle right now.
    pub fn holds_write(&self) -> bool {
        self.writes.caller_holds()
    }

    async fn read_until(&self, deadline: Deadline) -> Result<Option<LockGuard>> {
        let req = self.info.request(deadline);
        // Asked after the re-entry gate, so a write released meanwhile is not taken for a
        // downgrade.
        let remote = || async {
            let downgrade = self.writes.caller_holds();
            let guard = live(&self.info, deadline, || self.raw.read(&req, downgrade)).await?;
            if let Some(g) = &guard {
                self.reads.add(g);
            }
            Ok(guard)
        };
        traced(&self.info, LockKind::Read, || {
            self.read.acquire(&self.info, deadline, remote)
        })
        .await
    }

    async fn write_until(&self, deadline: Deadline) -> Result<Option<LockGuard>> {
        if self.reads.caller_holds() && !self.writes.caller_holds() {
            return Err(Error::WouldDeadlock {
                name: self.info.name.to_string(),
                reason: "this task holds the read lock; release it before asking for the \
                         write lock"
                    .into(),
            });
        }
        let req = self.info.request(deadline);
        let remote = || async {
            let guard = live(&self.info, deadline, || self.raw.write(&req)).await?;
            if let Some(g) = &guard {
                self.writes.add(g);
            }
            Ok(guard)
        };
        traced(&self.info, LockKind::Write, || {
            self.write.acquire(&self.info, deadline, remote)
        })
        .await
    }
}

#[async_trait]
impl<R: RawReadWriteLock> DistributedReadWriteLock for ReadWriteLock<R> {
    info_accessors!();

    async fn read(&self) -> Result<LockGuard> {
        self.info.forever(self.read_until(Deadline::NEVER).await)
    }

    async fn try_read(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.read_until(Deadline::after(wait)).await
    }

    async fn write(&self) -> Result<LockGuard> {
        self.info.forever(self.write_until(Deadline::NEVER).await)
    }

    async fn try_write(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.write_until(Deadline::after(wait)).await
    }
}

/// A semaphore handle over a backend's [`RawSemaphore`]. Every acquisition takes a permit of
/// its own, even through the same handle.
#[derive(Debug)]
pub struct Semaphore<R> {
    info: HandleInfo,
    permits: u32,
    raw: R,
}

impl<R: RawSemaphore> Semaphore<R> {
    /// A handle counting against `permits` permits.
    pub fn new(info: HandleInfo, permits: u32, raw: R) -> Self {
        Self { info, permits, raw }
    }

    /// The backend part.
    pub fn raw(&self) -> &R {
        &self.raw
    }

    async fn acquire_until(&self, deadline: Deadline) -> Result<Option<LockGuard>> {
        let req = self.info.request(deadline);
        traced(&self.info, LockKind::Permit, || {
            live(&self.info, deadline, || {
                self.raw.acquire(&req, self.permits)
            })
        })
        .await
    }
}

#[async_trait]
impl<R: RawSemaphore> DistributedSemaphore for Semaphore<R> {
    info_accessors!();

    fn permits(&self) -> u32 {
        self.permits
    }

    async fn acquire(&self) -> Result<LockGuard> {
        self.info.forever(self.acquire_until(Deadline::NEVER).await)
    }

    async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(Deadline::after(wait)).await
    }

    async fn available(&self) -> Result<u32> {
        self.raw.available(&self.info.name, self.permits).await
    }
}
