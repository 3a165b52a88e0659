//! What a backend hands the core for each hold: the [`Hold`] calls, the [`HoldSignal`] it
//! reports losses and suspensions through, the [`Horizon`] of its session, and [`NewHold`],
//! the parts of a fresh hold that [`LockGuard::new`](crate::LockGuard::new) turns into a
//! guard.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::loss::{LockKind, LossReason};
use crate::name::{FencingToken, LockName};
use crate::options::{DriftAllowance, Lease};
use crate::state::{Phase, SignalState};
use crate::sync::Mutex;
use crate::trace::{self, Who};

/// The backend side of one hold: what the guard calls to release it and to keep it alive.
///
/// Backends implement this for their hold type and pass it to
/// [`LockGuard::new`](crate::LockGuard::new). Both methods must check ownership atomically on
/// the server: acting on someone else's hold is a bug.
#[async_trait]
pub trait Hold: fmt::Debug + Send + Sync + 'static {
    /// Releases the hold on the server.
    ///
    /// Returns `Err(Error::LockLost)` if the hold is no longer ours (it expired, or another
    /// owner has the lock); it then changes nothing.
    async fn release(&self) -> Result<()>;

    /// Makes the hold last `ttl` from now, at once (the guard's `extend`, and the watchdog's
    /// retries after a failed renewal).
    ///
    /// Returns `Err(Error::LockLost)` if the hold is no longer ours.
    async fn extend(&self, ttl: Duration) -> Result<()>;

    /// The watchdog's periodic renewal: makes the hold last `ttl` from now, as
    /// [`extend`](Hold::extend) does (the default), or in a batch with the provider's other
    /// holds that reaches the store within [`renewal_window`](crate::backend::renewal_window)
    /// of `ttl` (see [`Batcher`](crate::backend::Batcher)). The keeper counts the new lease
    /// from before this call, so the wait for a batch only shortens the lease the client
    /// believes in. A renewal that failed is tried again the same way while more than a
    /// third of the lease is left and the hold's end is not close (a failed batch is retried
    /// as a batch, not as a call per hold), otherwise with `extend`.
    ///
    /// Returns `Err(Error::LockLost)` if the hold is no longer ours.
    async fn renew(&self, ttl: Duration) -> Result<()> {
        self.extend(ttl).await
    }

    /// Whether [`renew`](Hold::renew) sends the renewal in a batch with the provider's other
    /// holds. The keeper then renews the hold on a beat that the process's holds of its lease
    /// share, so that they come due together and go in one batch a period (up to two while
    /// holds keep arriving: a new hold renews first on a beat of half the period); a hold
    /// that renews alone (the default, `false`) is renewed a third of its lease after its
    /// grant and each renewal, so that its provider's renewals stay spread over the period.
    fn renews_in_batches(&self) -> bool {
        false
    }

    /// Whether the store still has the hold, asked of the store, for holds that can end
    /// before their lease does without the client knowing (a connection-bound hold, see
    /// [`Capabilities::connection_bound`](crate::Capabilities::connection_bound)). Asked by
    /// [`MultiLock`](crate::MultiLock) of the members it took before awaiting the others,
    /// and by [`LockGuard::verify`](crate::LockGuard::verify). The default trusts the lease
    /// and asks nothing: `Ok(true)`.
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
    /// expired). The hold may come back to [`HoldState::Held`] or turn [`HoldState::Lost`];
    /// it turns lost at its horizon at the latest. Work under the lock should stop: another
    /// holder may already exist if the store decided the session is over.
    Suspended,
    /// The hold is gone; [`LockGuard::lost`](crate::LockGuard::lost) has resolved.
    Lost,
}

/// The loss signal of one hold, shared by its guards, its lease keeper and the backend.
///
/// Backends that learn about a loss on their own (a session expired, a store hook) keep a clone
/// and call [`HoldSignal::mark_lost`]; backends that learn the store cannot be asked right now
/// (a disconnected session) call [`HoldSignal::set_suspended`].
#[derive(Clone, Default)]
pub struct HoldSignal {
    inner: Arc<SignalInner>,
}

#[derive(Default)]
struct SignalInner {
    /// Cancelled after the state turned lost, never before, never otherwise.
    lost: CancellationToken,
    /// Held, released or lost (each exclusive of the others), and suspended.
    state: SignalState,
    /// Told of every change, after it: a suspension, its end, the loss, the release.
    changed: Notify,
    /// Set by the keeper while renewals fail, so a loss seen at the lease end says why.
    renewal_failing: AtomicBool,
    /// Who the hold is, for the `dlock.lost` event; set when the guard is built.
    who: OnceLock<Who>,
}

impl HoldSignal {
    /// A fresh signal: held, not suspended.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the hold lost, for good, and emits the `dlock.lost` event. Idempotent: the first
    /// reason stays. A hold released on purpose is not lost: the call then does nothing.
    /// Returns whether this call marked it.
    pub fn mark_lost(&self, reason: LossReason) -> bool {
        // One transition decides against a concurrent release or loss: only the call that
        // made it reports the loss.
        if !self.inner.state.lose(reason) {
            return false;
        }
        trace::lost(self.inner.who.get(), reason);
        self.inner.lost.cancel();
        self.inner.changed.notify_waiters();
        true
    }

    /// Marks the hold suspended (true) or vouched for again (false).
    pub fn set_suspended(&self, suspended: bool) {
        if self.inner.state.set_suspended(suspended) {
            self.inner.changed.notify_waiters();
        }
    }

    /// Whether [`mark_lost`](Self::mark_lost) was called.
    pub fn is_lost(&self) -> bool {
        matches!(self.inner.state.phase(), Phase::Lost(_))
    }

    /// Why the hold was lost, once it was.
    pub fn reason(&self) -> Option<LossReason> {
        match self.inner.state.phase() {
            Phase::Lost(reason) => Some(reason),
            Phase::Held | Phase::Released => None,
        }
    }

    /// The state as far as the signal knows (without the lease end and horizon; see
    /// [`LockGuard::state`](crate::LockGuard::state)).
    pub fn state(&self) -> HoldState {
        if self.is_lost() {
            HoldState::Lost
        } else if self.inner.state.is_suspended() {
            HoldState::Suspended
        } else {
            HoldState::Held
        }
    }

    /// A future that resolves once the hold is marked lost.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.inner.lost.clone().cancelled_owned()
    }

    /// Whether the hold was released on purpose.
    pub(crate) fn is_released(&self) -> bool {
        self.inner.state.is_released()
    }

    /// The hold was released on purpose: it is never reported lost after this. False if it
    /// was marked lost first: it then stays lost.
    pub(crate) fn set_released(&self) -> bool {
        if !self.inner.state.release() {
            return false;
        }
        self.inner.changed.notify_waiters();
        true
    }

    /// Wakes the watchers of the hold (its end moved).
    pub(crate) fn notify_changed(&self) {
        self.inner.changed.notify_waiters();
    }

    /// Notified at every change of state; enable it before reading the state.
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.changed.notified()
    }

    pub(crate) fn set_renewal_failing(&self, failing: bool) {
        self.inner.renewal_failing.store(failing, Ordering::SeqCst);
    }

    pub(crate) fn renewal_failing(&self) -> bool {
        self.inner.renewal_failing.load(Ordering::SeqCst)
    }

    pub(crate) fn bind(&self, who: Who) {
        let _ = self.inner.who.set(who);
    }
}

impl fmt::Debug for HoldSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HoldSignal").field(&self.state()).finish()
    }
}

/// The latest moment at which a store cannot yet have given any of a group of holds to
/// anyone else, as the client knows it: the bound of a session that carries the holds
/// (ZooKeeper: the send time of the last request the server answered, plus the negotiated
/// session timeout; etcd: the send time of the last keep-alive the server answered, plus the
/// lease's TTL).
///
/// A backend makes one per session, attaches a clone to every hold it grants in that session
/// ([`NewHold::with_horizon`]) and [`advance`](Self::advance)s it each time it hears from the
/// server. The core stops vouching for the holds at the horizon, less the drift allowance,
/// whatever the network does: a session that the server may have expired is not vouched for,
/// even before the client library says so. Lease stores (Redis, SQL) need none: their lease
/// end, counted from the request's send time, is their horizon.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::LossReason;
/// use dlock_core::backend::{Horizon, from_now};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let h = Horizon::new(from_now(Duration::from_secs(10)), LossReason::SessionTimedOut);
/// let later = from_now(Duration::from_secs(12));
/// h.advance(later);
/// h.advance(from_now(Duration::from_secs(1))); // never moves back
/// assert_eq!(h.at(), later);
/// # }
/// ```
#[derive(Clone)]
pub struct Horizon {
    inner: Arc<HorizonInner>,
}

struct HorizonInner {
    /// The horizon, and how far ahead of the moment it was set it lay (the longest seen): the
    /// span an answer vouches for, of which the drift allowance is taken.
    at: Mutex<(Instant, Duration)>,
    reason: LossReason,
}

impl Horizon {
    /// A horizon at `at`; a hold found past it is lost with `reason`. How far ahead of now
    /// `at` lies is the span one answer vouches for: the drift allowance taken off the
    /// horizon is the hold's (a part of its lease) but never more than a quarter of that span
    /// (a lease of an hour in a session of ten seconds is vouched for 7.5 s at a time).
    pub fn new(at: Instant, reason: LossReason) -> Self {
        let span = at.saturating_duration_since(Instant::now());
        Self {
            inner: Arc::new(HorizonInner {
                at: Mutex::new((at, span)),
                reason,
            }),
        }
    }

    /// Moves the horizon to `to` if that is later; it never moves back.
    pub fn advance(&self, to: Instant) {
        let span = to.saturating_duration_since(Instant::now());
        let mut at = self.inner.at.lock();
        if to > at.0 {
            at.0 = to;
        }
        if span > at.1 {
            at.1 = span;
        }
    }

    /// The horizon.
    pub fn at(&self) -> Instant {
        self.inner.at.lock().0
    }

    /// How far ahead of an answer the horizon lies (the longest seen).
    pub fn span(&self) -> Duration {
        self.inner.at.lock().1
    }

    /// Why a hold found past the horizon is lost.
    pub fn reason(&self) -> LossReason {
        self.inner.reason
    }
}

impl fmt::Debug for Horizon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Horizon")
            .field("at", &self.at())
            .field("reason", &self.inner.reason)
            .finish()
    }
}

/// Everything a backend knows about a fresh hold; [`LockGuard::new`](crate::LockGuard::new)
/// turns it into a guard.
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
    /// The session's bound, for backends whose holds live in a session (see [`Horizon`]).
    pub horizon: Option<Horizon>,
    /// How much before its bound the guard stops vouching for the hold. The handles of
    /// [`backend`](crate::backend) set it from the handle's
    /// [`LockOptions::drift`](crate::LockOptions::drift); the default otherwise.
    pub drift: DriftAllowance,
}

impl NewHold {
    /// Collects the parts of a fresh hold, with a fresh [`HoldSignal`], no horizon and the
    /// default drift allowance.
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
            horizon: None,
            drift: DriftAllowance::DEFAULT,
        }
    }

    setters! {
        /// Uses `signal` (a clone the backend keeps, to report losses it learns of itself).
        with_signal => signal: HoldSignal;
        /// Sets the drift allowance.
        with_drift => drift: DriftAllowance;
    }

    /// Bounds the hold by its session's horizon.
    pub fn with_horizon(mut self, horizon: Horizon) -> Self {
        self.horizon = Some(horizon);
        self
    }
}
