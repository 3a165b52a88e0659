//! The guard a successful acquisition returns, and the plumbing backends use to build one.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::keeper;
use crate::loss::{LockKind, LossReason};
use crate::metrics;
use crate::name::{FencingToken, LockName};
use crate::options::Lease;
use crate::time::later;

/// Whether `span` (one of dlock's, all at debug level) is worth entering and recording: a
/// subscriber keeps it, or no `tracing` dispatcher was ever set and a `log` logger takes
/// debug records, to which `tracing`'s `log` feature (which sqlx turns on) then hands the
/// span's enters and records, as `tracing`'s own macros decide. (In a build without that
/// feature, such a logger gets nothing from the span it keeps: a little work for nothing.)
pub(crate) fn kept(span: &tracing::Span) -> bool {
    !span.is_disabled()
        || (!tracing::dispatcher::has_been_set()
            && log::STATIC_MAX_LEVEL >= log::LevelFilter::Debug
            && log::max_level() >= log::LevelFilter::Debug)
}

/// Runs `fut` inside `span`, or as it is when the span is not [`kept`]: a span a subscriber
/// disabled still costs a check of the `log` crate on each enter and exit of every poll,
/// measurable on an uncontended lock's hot path (docs/benchmarks.md). (A function returning
/// the future, not an `async fn`, which would keep `fut` twice; see [`Deadline::run`].)
///
/// [`Deadline::run`]: crate::time::Deadline::run
pub(crate) fn in_span<F: Future>(
    span: &tracing::Span,
    fut: F,
) -> futures::future::Either<tracing::instrument::Instrumented<F>, F> {
    if kept(span) {
        futures::future::Either::Left(fut.instrument(span.clone()))
    } else {
        futures::future::Either::Right(fut)
    }
}

/// Locks a std mutex, ignoring poisoning: every critical section in this crate leaves the data
/// consistent, so a panic elsewhere is no reason to panic here.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The backend side of one hold: what the guard calls to release it and to keep it alive.
///
/// Backends implement this for their hold type and pass it to [`LockGuard::new`]. Both methods
/// must check ownership atomically on the server: acting on someone else's hold is a bug.
#[async_trait]
pub trait Hold: fmt::Debug + Send + Sync + 'static {
    /// Releases the hold on the server.
    ///
    /// Returns `Err(Error::LockLost)` if the hold is no longer ours (it expired, or another
    /// owner has the lock); it then changes nothing.
    async fn release(&self) -> Result<()>;

    /// Makes the hold last `ttl` from now (the watchdog's renewal, and `extend`).
    ///
    /// Returns `Err(Error::LockLost)` if the hold is no longer ours.
    async fn extend(&self, ttl: Duration) -> Result<()>;

    /// Whether the store still has the hold, asked of the store, for holds that can end
    /// before their lease does without the client knowing (a connection-bound hold, see
    /// [`Capabilities::connection_bound`](crate::Capabilities::connection_bound)). Asked by
    /// [`MultiLock`](crate::MultiLock) of the members it took before awaiting the others.
    /// The default trusts the lease and asks nothing: `Ok(true)`.
    async fn verify(&self) -> Result<bool> {
        Ok(true)
    }
}

/// What a guard can say about its hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldState {
    /// The backend vouches for the hold.
    Held,
    /// The backend cannot tell right now (e.g. a ZooKeeper session is disconnected but not
    /// expired). The hold may come back to [`HoldState::Held`] or turn [`HoldState::Lost`].
    Suspended,
    /// The hold is gone; [`LockGuard::lost`] has resolved.
    Lost,
}

/// The loss signal of one hold, shared by its guards, its lease keeper and the backend.
///
/// Backends that learn about a loss on their own (a session expired, a store hook) keep a clone
/// and call [`HoldSignal::mark_lost`].
#[derive(Clone, Default)]
pub struct HoldSignal {
    inner: Arc<SignalInner>,
}

#[derive(Default)]
struct SignalInner {
    lost: CancellationToken,
    reason: OnceLock<LossReason>,
    suspended: AtomicBool,
    /// Set by the keeper while renewals fail, so a loss seen at the lease end says why.
    renewal_failing: AtomicBool,
    /// Who the hold is, for the `dlock.lost` event; set when the guard is built.
    context: OnceLock<Context>,
}

#[derive(Debug)]
struct Context {
    backend: &'static str,
    kind: LockKind,
    name: LockName,
    token: FencingToken,
}

impl HoldSignal {
    /// A fresh signal: held, not suspended.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the hold lost, for good, and emits the `dlock.lost` event. Idempotent: the first
    /// reason stays. Returns whether this call marked it.
    pub fn mark_lost(&self, reason: LossReason) -> bool {
        if self.inner.reason.set(reason).is_err() {
            return false;
        }
        match self.inner.context.get() {
            Some(c) => {
                metrics::lost(c.backend, c.kind, reason);
                tracing::warn!(
                backend = c.backend,
                kind = %c.kind,
                lock = %c.name,
                token = c.token.get(),
                reason = %reason,
                "dlock.lost"
                );
            }
            None => tracing::warn!(reason = %reason, "dlock.lost"),
        }
        self.inner.lost.cancel();
        true
    }

    /// Marks the hold suspended (true) or vouched for again (false).
    pub fn set_suspended(&self, suspended: bool) {
        self.inner.suspended.store(suspended, Ordering::SeqCst);
    }

    /// Whether [`mark_lost`](Self::mark_lost) was called.
    pub fn is_lost(&self) -> bool {
        self.inner.reason.get().is_some()
    }

    /// Why the hold was lost, once it was.
    pub fn reason(&self) -> Option<LossReason> {
        self.inner.reason.get().copied()
    }

    /// The state as far as the signal knows (without the lease end; see
    /// [`LockGuard::state`]).
    pub fn state(&self) -> HoldState {
        if self.is_lost() {
            HoldState::Lost
        } else if self.inner.suspended.load(Ordering::SeqCst) {
            HoldState::Suspended
        } else {
            HoldState::Held
        }
    }

    /// A future that resolves once the hold is marked lost.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.inner.lost.clone().cancelled_owned()
    }

    pub(crate) fn set_renewal_failing(&self, failing: bool) {
        self.inner.renewal_failing.store(failing, Ordering::SeqCst);
    }

    fn renewal_failing(&self) -> bool {
        self.inner.renewal_failing.load(Ordering::SeqCst)
    }

    fn bind(&self, context: Context) {
        let _ = self.inner.context.set(context);
    }
}

impl fmt::Debug for HoldSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HoldSignal").field(&self.state()).finish()
    }
}

/// Everything a backend knows about a fresh hold; [`LockGuard::new`] turns it into a guard.
#[derive(Debug)]
#[non_exhaustive]
pub struct NewHold {
    /// The backend's short name, for logs.
    pub backend: &'static str,
    /// What the hold is.
    pub kind: LockKind,
    /// The lock's name.
    pub name: LockName,
    /// The token issued for this acquisition.
    pub token: FencingToken,
    /// The lease the hold was taken with.
    pub lease: Lease,
    /// When the request that the store granted was **sent**: the client counts the lease from
    /// here, so it thinks the hold ends no later than the store does. Not when the acquiring
    /// call started: a waiter that waited ten times its lease still holds a whole lease.
    pub sent: Instant,
    /// The backend's release and renew calls.
    pub hold: Arc<dyn Hold>,
    /// The loss signal; the backend may keep a clone (see [`NewHold::with_signal`]).
    pub signal: HoldSignal,
}

impl NewHold {
    /// Collects the parts of a fresh hold, with a fresh [`HoldSignal`].
    pub fn new(
        backend: &'static str,
        kind: LockKind,
        name: LockName,
        token: FencingToken,
        lease: Lease,
        sent: Instant,
        hold: Arc<dyn Hold>,
    ) -> Self {
        Self {
            backend,
            kind,
            name,
            token,
            lease,
            sent,
            hold,
            signal: HoldSignal::new(),
        }
    }

    /// Uses `signal` (a clone the backend keeps, to report losses it learns of itself).
    pub fn with_signal(mut self, signal: HoldSignal) -> Self {
        self.signal = signal;
        self
    }
}

/// State shared by every guard of one hold (re-entrant guards share it) and its lease keeper.
pub(crate) struct Shared {
    pub(crate) backend: &'static str,
    pub(crate) kind: LockKind,
    pub(crate) name: LockName,
    pub(crate) token: FencingToken,
    pub(crate) lease: Lease,
    pub(crate) hold: Arc<dyn Hold>,
    pub(crate) signal: HoldSignal,
    /// When the granted request was sent: the first lease period starts here.
    pub(crate) granted: Instant,
    /// When the lease ends as far as this client knows; the keeper and `extend` move it.
    lease_end: Mutex<Instant>,
    /// Wakes the keeper when `extend` moved the end.
    pub(crate) extended: Notify,
    keeper: Mutex<Option<keeper::Keeper>>,
    /// Set before the keeper is stopped on purpose, so its drop does not report a loss.
    keeper_disarmed: AtomicBool,
    /// The runtime the hold was granted on: background releases go there even when the guard
    /// is dropped on a thread without a runtime.
    runtime: Option<Handle>,
    /// Live guards of this hold; the remote hold is released when it drops to zero.
    guards: Mutex<usize>,
    /// This hold in the `dlock_holds` gauge while it exists.
    _live: metrics::Live,
}

impl Shared {
    pub(crate) fn lease_end(&self) -> Instant {
        *lock(&self.lease_end)
    }

    pub(crate) fn set_lease_end(&self, end: Instant) {
        *lock(&self.lease_end) = end;
    }

    /// Whether the hold can still be vouched for: not lost, and its lease has not ended. A
    /// lease seen ended marks the hold lost, even if the keeper never ran (a blocked runtime,
    /// a paused process).
    pub(crate) fn check(&self) -> bool {
        if self.signal.is_lost() {
            return false;
        }
        if Instant::now() < self.lease_end() {
            return true;
        }
        self.signal.mark_lost(self.reason_at_lease_end());
        false
    }

    /// Why a hold whose lease end passed is lost.
    pub(crate) fn reason_at_lease_end(&self) -> LossReason {
        if !self.lease.is_watchdog() {
            LossReason::FixedLeaseEnded
        } else if self.signal.renewal_failing() {
            LossReason::RenewalFailed
        } else {
            LossReason::LeaseEnded
        }
    }

    /// Adds a guard (re-entry). Fails if the hold is being released, lost or past its lease.
    pub(crate) fn enter(&self) -> bool {
        let mut guards = lock(&self.guards);
        if *guards == 0 || !self.check() {
            return false;
        }
        *guards += 1;
        true
    }

    /// Whether a guard is live and the hold can be vouched for.
    pub(crate) fn is_live(&self) -> bool {
        *lock(&self.guards) > 0 && self.check()
    }

    /// Removes a guard; true if it was the last one, which must release the hold.
    fn leave(&self) -> bool {
        let mut guards = lock(&self.guards);
        *guards = guards.saturating_sub(1);
        *guards == 0
    }

    /// Disarms and stops the keeper; whether it never ran (it was still waiting for its
    /// start), so that nothing cleaned up after a loss yet.
    fn stop_keeper(&self) -> bool {
        self.keeper_disarmed.store(true, Ordering::SeqCst);
        let stopped = lock(&self.keeper).take();
        matches!(stopped, Some(keeper::Keeper::Waiting(_)))
    }

    /// Spawns the keeper now if it still waits for its start.
    fn start_keeper_now(self: &Arc<Self>) {
        let mut keeper = lock(&self.keeper);
        if let Some(runtime) = &self.runtime
            && matches!(*keeper, Some(keeper::Keeper::Waiting(_)))
            && !self.keeper_disarmed.load(Ordering::SeqCst)
        {
            *keeper = Some(keeper::spawn(runtime, self));
        }
    }

    /// After a loss that no keeper saw (it had not started): the clean-up a keeper makes,
    /// best effort (the release is owner-checked, so it cannot touch another's hold).
    async fn clean_up_after_loss(&self) {
        if let Err(e) = self.hold.release().await {
            tracing::debug!(backend = self.backend, lock = %self.name, error = %e, "clean-up after a loss found nothing to release");
        }
    }

    /// Spawns the keeper that waited in its runtime's starter under `key`, unless the hold was
    /// released meanwhile (the keeper was stopped) or the keeper already runs.
    pub(crate) fn start_waiting_keeper(self: &Arc<Self>, key: (Instant, u64)) {
        let mut keeper = lock(&self.keeper);
        if let Some(runtime) = &self.runtime
            && keeper.as_ref().is_some_and(|k| k.waits_as(key))
            && !self.keeper_disarmed.load(Ordering::SeqCst)
        {
            *keeper = Some(keeper::spawn(runtime, self));
        }
    }

    /// Called by the keeper's drop guard: a keeper that stops while armed reports the loss.
    pub(crate) fn keeper_stopped(&self) {
        if !self.keeper_disarmed.load(Ordering::SeqCst) {
            self.signal.mark_lost(LossReason::KeeperStopped);
        }
    }

    async fn release_remote(&self) -> Result<()> {
        let unseen = self.stop_keeper();
        if !self.check() {
            if unseen {
                self.clean_up_after_loss().await;
            }
            return Err(Error::lock_lost(&self.name));
        }
        let result = self.hold.release().await;
        let outcome = match &result {
            Ok(()) => "released",
            Err(Error::LockLost { .. }) => {
                self.signal.mark_lost(LossReason::Gone);
                "lost"
            }
            Err(_) => "error",
        };
        metrics::released(self.backend, self.kind, outcome);
        result
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("backend", &self.backend)
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("token", &self.token)
            .field("lease", &self.lease)
            .field("state", &self.signal.state())
            .finish()
    }
}

/// Proof of a hold on a lock, a read or write lock, or a semaphore permit.
///
/// The guard owns everything it needs (it is `'static`, `Send` and `Sync`), so it can move into
/// a task. Release it with [`release`](Self::release) to learn whether the release worked.
/// Watch [`lost`](Self::lost) while you work: it resolves when the backend can no longer vouch
/// for the hold, and then you must stop touching the protected resource.
///
/// # Time
///
/// The client counts each lease period from when the request that the store granted (or
/// renewed) was sent, so it never believes in a hold longer than the store keeps it. Once that
/// lease end has passed without a renewal, the guard is lost even if its lease keeper never
/// ran (a blocked runtime, a paused process): [`is_held`](Self::is_held) is false and
/// [`lost`](Self::lost) resolves. dlock needs a tokio runtime with its time driver enabled.
///
/// # Release on drop is not immediate
///
/// Dropping a guard without calling `release` releases the hold in a background task on the
/// runtime the hold was taken on; the lock is free a moment later, not when `drop` returns.
/// Without a runtime nothing is sent and the hold ends with its lease (or session).
#[must_use = "dropping the guard releases the lock in the background"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    shared: Option<Arc<Shared>>,
    token: FencingToken,
    name: LockName,
}

impl LockGuard {
    /// Builds the guard for a fresh hold and starts its lease keeper: the watchdog that renews a
    /// [`Lease::Watchdog`] hold, or the timer that marks a [`Lease::Fixed`] hold lost when it
    /// ends. The keeper's task is spawned a sixth of the lease after the grant, by one task per
    /// runtime, so a hold released sooner costs none. Backends call this right after the store
    /// granted the hold, with no await in between, so a cancelled acquire cannot leak the
    /// hold.
    ///
    /// Outside a tokio runtime no keeper runs: the hold is neither renewed nor timed, and the
    /// guard turns lost when its lease end passes.
    pub fn new(new: NewHold) -> Self {
        let lease_end = later(new.sent, new.lease.ttl());
        new.signal.bind(Context {
            backend: new.backend,
            kind: new.kind,
            name: new.name.clone(),
            token: new.token,
        });
        let runtime = Handle::try_current().ok();
        let shared = Arc::new(Shared {
            backend: new.backend,
            kind: new.kind,
            name: new.name,
            token: new.token,
            lease: new.lease,
            hold: new.hold,
            signal: new.signal,
            granted: new.sent,
            lease_end: Mutex::new(lease_end),
            extended: Notify::new(),
            keeper: Mutex::new(None),
            keeper_disarmed: AtomicBool::new(false),
            runtime: runtime.clone(),
            guards: Mutex::new(1),
            _live: metrics::Live::new(new.backend, new.kind),
        });
        if let Some(runtime) = runtime {
            // Under the keeper's lock: the starter cannot start it before it is in place.
            let mut keeper = lock(&shared.keeper);
            *keeper = Some(keeper::start(&runtime, &shared));
        }
        Self::from_shared(shared)
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        Self {
            token: shared.token,
            name: shared.name.clone(),
            shared: Some(shared),
        }
    }

    pub(crate) fn shared(&self) -> Option<&Arc<Shared>> {
        self.shared.as_ref()
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// What the hold is: a mutex, read or write hold, or a semaphore permit.
    pub fn kind(&self) -> Option<LockKind> {
        self.shared.as_ref().map(|s| s.kind)
    }

    /// The fencing token of this acquisition (re-entrant guards share it).
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The state of the hold. [`HoldState::Lost`] once the hold was reported lost, and once
    /// its lease end has passed without a renewal (which then reports the loss).
    pub fn state(&self) -> HoldState {
        match &self.shared {
            Some(shared) if shared.check() => shared.signal.state(),
            _ => HoldState::Lost,
        }
    }

    /// Whether the backend vouches for the hold right now: false once it is lost, false once
    /// its lease end has passed (even if the keeper never ran), and false while it is
    /// [`HoldState::Suspended`].
    pub fn is_held(&self) -> bool {
        self.state() == HoldState::Held
    }

    /// Asks the backend whether the store still has the hold ([`Hold::verify`]); a hold it
    /// says is gone is marked lost ([`LossReason::Gone`], unless the backend gave a reason).
    pub(crate) async fn verify(&self) -> Result<bool> {
        let Some(shared) = &self.shared else {
            return Ok(false);
        };
        if !shared.check() {
            return Ok(false);
        }
        if shared.hold.verify().await? {
            Ok(shared.check())
        } else {
            shared.signal.mark_lost(LossReason::Gone);
            Ok(false)
        }
    }

    /// Why the hold was lost, once it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.as_ref().and_then(|s| s.signal.reason())
    }

    /// A future that resolves when the hold is lost, at the latest when its lease end passes
    /// without a renewal. Cheap to call many times; each call gives an independent future that
    /// owns what it needs.
    ///
    /// ```no_run
    /// # async fn demo(guard: dlock_core::LockGuard) {
    /// tokio::select! {
    ///     _ = guard.lost() => eprintln!("lost the lock: {:?}", guard.loss_reason()),
    ///     _ = async { /* work */ } => {}
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let shared = self.shared.clone();
        async move {
            let Some(shared) = shared else { return };
            let lost = shared.signal.lost();
            tokio::pin!(lost);
            while shared.check() {
                tokio::select! {
                    () = &mut lost => return,
                    () = sleep_until(shared.lease_end()) => {}
                }
            }
        }
    }

    /// The lease this hold was taken with.
    pub fn lease(&self) -> Option<Lease> {
        self.shared.as_ref().map(|s| s.lease)
    }

    /// How long the hold lasts from now unless renewed, as far as this client knows.
    pub fn remaining(&self) -> Duration {
        match &self.shared {
            Some(shared) if shared.check() => {
                shared.lease_end().saturating_duration_since(Instant::now())
            }
            _ => Duration::ZERO,
        }
    }

    /// Moves the end of a [`Lease::Fixed`] hold to `ttl` from now.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the hold is gone (also when it was lost while the call was in
    /// flight), [`Error::InvalidArgument`] for a zero `ttl`, one above [`Lease::MAX`], or a
    /// watchdog lease (the watchdog already renews it), or the backend's error.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the server may or may not have extended the hold; the
    /// client-side end stays where it was, which errs on the side of "lost".
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let shared = self
            .shared
            .as_ref()
            .ok_or_else(|| Error::lock_lost(&self.name))?;
        if ttl.is_zero() {
            return Err(Error::invalid_argument("ttl", "cannot extend by zero"));
        }
        if ttl > Lease::MAX {
            return Err(Error::invalid_argument(
                "ttl",
                format!("{ttl:?} is longer than the {:?} maximum", Lease::MAX),
            ));
        }
        if shared.lease.is_watchdog() {
            return Err(Error::invalid_argument(
                "ttl",
                "extend applies to fixed leases; the watchdog renews this one",
            ));
        }
        if !shared.check() {
            return Err(Error::lock_lost(&self.name));
        }
        let sent = Instant::now();
        let span = tracing::debug_span!("dlock.extend", backend = shared.backend, kind = %shared.kind, lock = %self.name);
        match shared.hold.extend(ttl).instrument(span).await {
            // The hold may have been lost (and its keeper released it) while the call was in
            // flight: then the extension does not count.
            Ok(()) if shared.signal.is_lost() => Err(Error::lock_lost(&self.name)),
            Ok(()) => {
                shared.set_lease_end(later(sent, ttl));
                shared.extended.notify_one();
                // An end moved before the keeper's start (a shortened lease) must not wait
                // for that start: the keeper ends the hold and cleans up at the new end.
                shared.start_keeper_now();
                Ok(())
            }
            Err(e @ Error::LockLost { .. }) => {
                shared.signal.mark_lost(LossReason::Gone);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases the hold. For a re-entered lock, only the last guard of the owner releases it
    /// on the server; the others return `Ok(())` at once.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the hold was lost before (nothing is changed on the server), or
    /// the backend's error (the hold then ends with its lease).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped before the server answered, the release finishes
    /// in the background.
    pub async fn release(mut self) -> Result<()> {
        let Some(shared) = self.shared.take() else {
            return Err(Error::lock_lost(&self.name));
        };
        if !shared.leave() {
            return if shared.check() {
                Ok(())
            } else {
                Err(Error::lock_lost(&self.name))
            };
        }
        let span = tracing::debug_span!("dlock.release", backend = shared.backend, kind = %shared.kind, lock = %self.name);
        let mut pending = PendingRelease(Some(shared));
        let result = match &pending.0 {
            Some(shared) => in_span(&span, shared.release_remote()).await,
            None => Ok(()),
        };
        pending.0 = None;
        result
    }

    /// Stops renewing and forgets the hold without releasing it: it ends with its lease or
    /// session, as if this process had crashed. Returns the token.
    ///
    /// Useful to hand a hold over to the lease, and in tests to simulate a dead holder.
    pub fn leak(mut self) -> FencingToken {
        if let Some(shared) = self.shared.take()
            && shared.leave()
        {
            shared.stop_keeper();
        }
        self.token
    }
}

/// Finishes a release in the background if the releasing future is dropped mid-way.
struct PendingRelease(Option<Arc<Shared>>);

impl Drop for PendingRelease {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            release_in_background(shared);
        }
    }
}

fn release_in_background(shared: Arc<Shared>) {
    let unseen = shared.stop_keeper();
    // A loss its keeper saw was cleaned up by it; one it never saw (it had not started) is
    // cleaned up here, as the keeper would have.
    let lost = shared.signal.is_lost();
    if lost && !unseen {
        return;
    }
    let Some(runtime) = Handle::try_current()
        .ok()
        .or_else(|| shared.runtime.clone())
    else {
        return;
    };
    let span = tracing::debug_span!("dlock.release", backend = shared.backend, kind = %shared.kind, lock = %shared.name, background = true);
    // A runtime that is shutting down refuses new tasks quietly; the lease then ends the hold.
    runtime.spawn(
        async move {
            if lost {
                shared.clean_up_after_loss().await;
            } else if let Err(e) = shared.release_remote().await {
                tracing::warn!(error = %e, "background release failed; the lease will end the hold");
            }
        }
        .instrument(span),
    );
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take()
            && shared.leave()
        {
            release_in_background(shared);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("state", &self.state())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::kept;

    /// No `tracing` dispatcher is ever set in this test binary: a span is kept for the `log`
    /// crate only where a logger takes debug records.
    #[test]
    fn without_a_subscriber_a_span_is_kept_only_for_a_debug_logger() {
        assert!(!tracing::dispatcher::has_been_set(), "a dispatcher was set");
        let span = tracing::debug_span!("dlock.test");
        log::set_max_level(log::LevelFilter::Info);
        assert!(!kept(&span), "kept for a logger at info");
        log::set_max_level(log::LevelFilter::Debug);
        assert!(kept(&span), "not kept for a logger at debug");
        log::set_max_level(log::LevelFilter::Off);
    }
}
