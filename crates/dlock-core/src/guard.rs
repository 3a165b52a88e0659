//! The guard a successful acquisition returns, and the plumbing backends use to build one.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::keeper;
use crate::name::{FencingToken, LockName};
use crate::options::Lease;

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
    suspended: AtomicBool,
}

impl HoldSignal {
    /// A fresh signal: held, not suspended.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the hold lost, for good. Idempotent; logs the reason the first time.
    pub fn mark_lost(&self, name: &LockName, reason: &str) {
        if !self.inner.lost.is_cancelled() {
            tracing::warn!(lock = %name, reason, "dlock.lost");
            self.inner.lost.cancel();
        }
    }

    /// Marks the hold suspended (true) or vouched for again (false).
    pub fn set_suspended(&self, suspended: bool) {
        self.inner.suspended.store(suspended, Ordering::SeqCst);
    }

    /// Whether [`mark_lost`](Self::mark_lost) was called.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.is_cancelled()
    }

    /// The current state.
    pub fn state(&self) -> HoldState {
        if self.is_lost() {
            HoldState::Lost
        } else if self.inner.suspended.load(Ordering::SeqCst) {
            HoldState::Suspended
        } else {
            HoldState::Held
        }
    }

    /// A future that resolves once the hold is lost.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.inner.lost.clone().cancelled_owned()
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
    /// The lock's name.
    pub name: LockName,
    /// The token issued for this acquisition.
    pub token: FencingToken,
    /// The lease the hold was taken with.
    pub lease: Lease,
    /// When the acquiring call started: the lease is counted from here, so the client thinks
    /// the hold ends no later than the server does.
    pub started: Instant,
    /// The backend's release and renew calls.
    pub hold: Arc<dyn Hold>,
    /// The loss signal; the backend may keep a clone.
    pub signal: HoldSignal,
}

impl NewHold {
    /// Collects the parts of a fresh hold.
    pub fn new(
        backend: &'static str,
        name: LockName,
        token: FencingToken,
        lease: Lease,
        started: Instant,
        hold: Arc<dyn Hold>,
        signal: HoldSignal,
    ) -> Self {
        Self {
            backend,
            name,
            token,
            lease,
            started,
            hold,
            signal,
        }
    }
}

/// State shared by every guard of one hold (re-entrant guards share it) and its lease keeper.
pub(crate) struct Shared {
    pub(crate) backend: &'static str,
    pub(crate) name: LockName,
    pub(crate) token: FencingToken,
    pub(crate) lease: Lease,
    pub(crate) hold: Arc<dyn Hold>,
    pub(crate) signal: HoldSignal,
    /// When the lease ends as far as this client knows; the keeper and `extend` move it.
    pub(crate) lease_end: Mutex<Instant>,
    /// Wakes the keeper when `extend` moved the end.
    pub(crate) extended: Notify,
    keeper: Mutex<Option<AbortOnDropHandle<()>>>,
    /// Live guards of this hold; the remote hold is released when it drops to zero.
    guards: Mutex<usize>,
}

impl Shared {
    /// Adds a guard (re-entry). Fails if the hold is being released or is lost.
    pub(crate) fn enter(&self) -> bool {
        let mut guards = lock(&self.guards);
        if *guards == 0 || self.signal.is_lost() {
            return false;
        }
        *guards += 1;
        true
    }

    /// Whether a guard is live and the hold is not known to be lost.
    pub(crate) fn is_live(&self) -> bool {
        *lock(&self.guards) > 0 && !self.signal.is_lost()
    }

    /// Removes a guard; true if it was the last one, which must release the hold.
    fn leave(&self) -> bool {
        let mut guards = lock(&self.guards);
        *guards = guards.saturating_sub(1);
        *guards == 0
    }

    fn stop_keeper(&self) {
        lock(&self.keeper).take();
    }

    async fn release_remote(&self) -> Result<()> {
        self.stop_keeper();
        if self.signal.is_lost() {
            return Err(Error::lock_lost(&self.name));
        }
        let result = self.hold.release().await;
        if let Err(Error::LockLost { .. }) = &result {
            self.signal
                .mark_lost(&self.name, "released after the hold was gone");
        }
        result
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("backend", &self.backend)
            .field("name", &self.name)
            .field("token", &self.token)
            .field("lease", &self.lease)
            .field("state", &self.signal.state())
            .finish()
    }
}

/// Proof of a hold on a lock, a read or write lock, or a semaphore permit.
///
/// The guard owns everything it needs (it is `'static` and `Send`), so it can move into a task.
/// Release it with [`release`](Self::release) to learn whether the release worked. Watch
/// [`lost`](Self::lost) while you work: it resolves when the backend can no longer vouch for
/// the hold, and then you must stop touching the protected resource.
///
/// # Release on drop is not immediate
///
/// Dropping a guard without calling `release` releases the hold in a background task when a
/// tokio runtime is available; the lock is free a moment later, not when `drop` returns. Without
/// a runtime nothing is sent and the hold ends with its lease (or session).
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
    /// ends. Backends call this right after the server granted the hold, with no await in
    /// between, so a cancelled acquire cannot leak the hold.
    ///
    /// Outside a tokio runtime no keeper runs: the hold is neither renewed nor timed.
    pub fn new(new: NewHold) -> Self {
        let lease_end = new.started + new.lease.ttl();
        let shared = Arc::new(Shared {
            backend: new.backend,
            name: new.name,
            token: new.token,
            lease: new.lease,
            hold: new.hold,
            signal: new.signal,
            lease_end: Mutex::new(lease_end),
            extended: Notify::new(),
            keeper: Mutex::new(None),
            guards: Mutex::new(1),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let task = runtime.spawn(keeper::keep(Arc::clone(&shared)));
            *lock(&shared.keeper) = Some(AbortOnDropHandle::new(task));
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

    /// The fencing token of this acquisition (re-entrant guards share it).
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The state of the hold.
    pub fn state(&self) -> HoldState {
        match &self.shared {
            Some(shared) => shared.signal.state(),
            None => HoldState::Lost,
        }
    }

    /// Whether the backend vouches for the hold right now: false once it is lost, and false
    /// while it is [`HoldState::Suspended`].
    pub fn is_held(&self) -> bool {
        self.state() == HoldState::Held
    }

    /// A future that resolves when the hold is lost. Cheap to call many times; each call gives
    /// an independent future that owns what it needs.
    ///
    /// ```no_run
    /// # async fn demo(guard: dlock_core::LockGuard) {
    /// tokio::select! {
    ///     _ = guard.lost() => eprintln!("lost the lock: stop"),
    ///     _ = async { /* work */ } => {}
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let signal = self.shared.as_ref().map(|s| s.signal.clone());
        async move {
            if let Some(signal) = signal {
                signal.lost().await;
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
            Some(shared) if !shared.signal.is_lost() => {
                lock(&shared.lease_end).saturating_duration_since(Instant::now())
            }
            _ => Duration::ZERO,
        }
    }

    /// Moves the end of a [`Lease::Fixed`] hold to `ttl` from now.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the hold is gone, [`Error::InvalidArgument`] for a zero `ttl` or a
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
        if shared.lease.is_watchdog() {
            return Err(Error::invalid_argument(
                "ttl",
                "extend applies to fixed leases; the watchdog renews this one",
            ));
        }
        if shared.signal.is_lost() {
            return Err(Error::lock_lost(&self.name));
        }
        let started = Instant::now();
        let span =
            tracing::debug_span!("dlock.extend", backend = shared.backend, lock = %self.name);
        match shared.hold.extend(ttl).instrument(span).await {
            Ok(()) => {
                *lock(&shared.lease_end) = started + ttl;
                shared.extended.notify_one();
                Ok(())
            }
            Err(e @ Error::LockLost { .. }) => {
                shared
                    .signal
                    .mark_lost(&self.name, "extend found the hold gone");
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
            return if shared.signal.is_lost() {
                Err(Error::lock_lost(&self.name))
            } else {
                Ok(())
            };
        }
        let span =
            tracing::debug_span!("dlock.release", backend = shared.backend, lock = %self.name);
        let mut pending = PendingRelease(Some(shared));
        let result = match &pending.0 {
            Some(shared) => shared.release_remote().instrument(span).await,
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
    shared.stop_keeper();
    if shared.signal.is_lost() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let span = tracing::debug_span!("dlock.release", backend = shared.backend, lock = %shared.name, background = true);
        runtime.spawn(
            async move {
                if let Err(e) = shared.release_remote().await {
                    tracing::warn!(error = %e, "background release failed; the lease will end the hold");
                }
            }
            .instrument(span),
        );
    }
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
