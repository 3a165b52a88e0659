//! The state every guard of one hold shares with its lease keeper: when the hold ends as far
//! as this client can vouch, whether it is lost, released or still held, and the paths that
//! release it or clean up after its loss.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};
use tracing::Instrument;

use crate::close::{Closer, InFlight, Ticket, ticket_here};
use crate::error::{Error, Result};
use crate::finish::finish_if_dropped;
use crate::hold::{Hold, HoldSignal, HoldState, Horizon, NewHold};
use crate::loss::{LockKind, LossReason};
use crate::metrics;
use crate::name::{FencingToken, LockName};
use crate::options::{DriftAllowance, Lease};
use crate::starter::Task;
use crate::state::{Claim, GuardCount, KeeperArm};
use crate::sync::Mutex;
use crate::time::{Deadline, earlier, later};
use crate::trace::{self, Who};

/// State shared by every guard of one hold (re-entrant guards share it) and its lease keeper.
///
/// The hold is vouched for until the earlier of its lease end (counted from the send time of
/// the request that granted or last renewed it) and its session's [`Horizon`], each less the
/// drift allowance (a part of the lease, at most a quarter of the session's span): past that
/// moment the store may have given the lock to someone else, so [`check`](Self::check) marks
/// the hold lost, whether or not anyone else noticed.
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
    /// When the lease ends on the store at the earliest; the keeper and `extend` move it.
    lease_end: Mutex<Instant>,
    /// The session's bound, where the hold lives in a session.
    horizon: Option<Horizon>,
    /// The drift allowance's part of a span, in millionths, and its fixed part in nanoseconds:
    /// set from the handle's options after the grant.
    drift_ppm: AtomicU32,
    drift_fixed: AtomicU64,
    /// The longest lease the backend can keep, in nanoseconds: set from the handle after the
    /// grant; an `extend` past it is refused.
    max_lease: AtomicU64,
    /// The earliest a release may end the hold ([`LockOptions::hold_at_least`]): one that
    /// comes sooner waits, the keeper renewing, until then.
    ///
    /// [`LockOptions::hold_at_least`]: crate::LockOptions::hold_at_least
    release_not_before: Mutex<Option<Instant>>,
    /// Wakes the keeper when `extend` moved the end.
    pub(crate) extended: Notify,
    /// The lease keeper, waiting for its start or running.
    pub(crate) keeper: Mutex<Option<Task>>,
    /// Disarmed before the keeper is stopped on purpose, so its drop does not report a loss;
    /// a keeper that stops armed reports one, and a release that comes after it finds the
    /// hold lost.
    keeper_arm: KeeperArm,
    /// Whoever sends the store a release (the release itself, or the clean-up after a loss)
    /// claims it first, so it is sent once: by the keeper, the release or the drop of the last
    /// guard, whichever comes first.
    cleanup: Claim,
    /// The runtime the hold was granted on: background releases go there first.
    pub(crate) runtime: Option<Handle>,
    /// That runtime shut down (the keeper was dropped with it): background work goes to the
    /// current runtime instead.
    runtime_gone: AtomicBool,
    /// Live guards of this hold; the remote hold is released when it drops to zero, and no
    /// guard joins it after that.
    guards: GuardCount,
    /// The clean-ups record of the provider that handed the hold out, once it did: its
    /// background release counts there, for the provider's close.
    in_flight: OnceLock<Arc<InFlight>>,
    /// The provider's record of the hold, and its number there, once it was handed out: the
    /// drop of this state removes it.
    record: OnceLock<(Weak<Closer>, u64)>,
    /// This hold in the `dlock_holds` gauge while it exists.
    _live: metrics::Live,
}

impl Shared {
    /// The state of a fresh hold granted on `runtime`, with one guard.
    pub(crate) fn new(new: NewHold, runtime: Option<Handle>) -> Self {
        new.signal.bind(Who {
            backend: new.backend,
            kind: new.kind,
            name: new.name.clone(),
            token: new.token,
        });
        let ttl = new.lease.ttl();
        Self {
            backend: new.backend,
            kind: new.kind,
            name: new.name,
            token: new.token,
            lease: new.lease,
            hold: new.hold,
            signal: new.signal,
            granted: new.sent,
            lease_end: Mutex::new(later(new.sent, ttl)),
            horizon: new.horizon,
            drift_ppm: AtomicU32::new(new.drift.ppm()),
            drift_fixed: AtomicU64::new(nanos(new.drift.fixed())),
            max_lease: AtomicU64::new(nanos(Lease::MAX)),
            release_not_before: Mutex::new(None),
            extended: Notify::new(),
            keeper: Mutex::new(None),
            keeper_arm: KeeperArm::new(),
            cleanup: Claim::new(),
            runtime,
            runtime_gone: AtomicBool::new(false),
            guards: GuardCount::new(1),
            in_flight: OnceLock::new(),
            record: OnceLock::new(),
            _live: metrics::Live::new(new.backend, new.kind),
        }
    }

    /// Records the clean-ups record of the provider that hands the hold out.
    pub(crate) fn set_in_flight(&self, in_flight: &Arc<InFlight>) {
        let _ = self.in_flight.set(Arc::clone(in_flight));
    }

    /// Records where the provider keeps the hold, to be removed when this state drops.
    pub(crate) fn set_record(&self, closer: Weak<Closer>, id: u64) {
        let _ = self.record.set((closer, id));
    }

    /// The clean-ups record of the provider that handed the hold out, if known.
    pub(crate) fn in_flight(&self) -> Option<&Arc<InFlight>> {
        self.in_flight.get()
    }

    /// When the lease ends on the store at the earliest.
    pub(crate) fn lease_end(&self) -> Instant {
        *self.lease_end.lock()
    }

    /// Moves the lease end (a renewal or an extension the store confirmed).
    pub(crate) fn set_lease_end(&self, end: Instant) {
        *self.lease_end.lock() = end;
    }

    /// The drift allowance.
    pub(crate) fn drift(&self) -> DriftAllowance {
        DriftAllowance::new(
            self.drift_ppm.load(Ordering::Relaxed),
            Duration::from_nanos(self.drift_fixed.load(Ordering::Relaxed)),
        )
    }

    /// Sets the drift allowance from the handle's options.
    pub(crate) fn set_drift(&self, drift: DriftAllowance) {
        self.drift_ppm.store(drift.ppm(), Ordering::Relaxed);
        self.drift_fixed
            .store(nanos(drift.fixed()), Ordering::Relaxed);
    }

    /// The longest lease the backend can keep.
    pub(crate) fn max_lease(&self) -> Duration {
        Duration::from_nanos(self.max_lease.load(Ordering::Relaxed))
    }

    /// Sets the longest lease the backend can keep, from the handle.
    pub(crate) fn set_max_lease(&self, max_lease: Duration) {
        self.max_lease.store(nanos(max_lease), Ordering::Relaxed);
    }

    /// Sets the earliest a release may end the hold.
    /// The first grant sets it; a re-entry does not move it.
    pub(crate) fn set_release_not_before(&self, at: Instant) {
        self.release_not_before.lock().get_or_insert(at);
    }

    /// Drops the hold's least time: the next release ends it at once.
    pub(crate) fn clear_release_not_before(&self) {
        *self.release_not_before.lock() = None;
    }

    /// Whether a release now would come before the hold's least time is up (and the hold is
    /// still vouched for).
    fn released_too_soon(&self) -> bool {
        self.release_not_before
            .lock()
            .is_some_and(|at| Instant::now() < at)
            && self.check()
    }

    /// Waits, the keeper renewing, until the hold's least time is up or it is lost.
    async fn hold_least_time(&self) {
        let Some(at) = *self.release_not_before.lock() else {
            return;
        };
        loop {
            let changed = self.signal.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if Instant::now() >= at || self.signal.is_lost() || !self.check() {
                return;
            }
            // The loss comes as a change of the signal, or as the end of the vouched time.
            let wake = std::cmp::min(at, self.vouched_until());
            tokio::select! {
                () = changed => {}
                () = sleep_until(wake) => {}
            }
        }
    }

    /// The last moment this client vouches for the hold (its lease end or horizon, whichever
    /// comes first, each less the drift allowance of its own span), and why the hold is lost
    /// past it.
    pub(crate) fn end(&self) -> (Instant, LossReason) {
        let drift = self.drift();
        let ttl = self.lease.ttl();
        let by_lease = earlier(self.lease_end(), drift.of(ttl));
        match &self.horizon {
            Some(h) => {
                // The lease's allowance, as for a lease store, but never more than a quarter of
                // the session's span (a lease of an hour in a session of ten seconds is not
                // lost on arrival), nor less than the allowance of that span.
                let span = h.span();
                let allowance = drift.of(ttl).min(span / 4).max(drift.of(span.min(ttl)));
                let by_horizon = earlier(h.at(), allowance);
                if by_horizon < by_lease {
                    (by_horizon, h.reason())
                } else {
                    (by_lease, self.reason_at_lease_end())
                }
            }
            None => (by_lease, self.reason_at_lease_end()),
        }
    }

    /// The last moment this client vouches for the hold.
    pub(crate) fn vouched_until(&self) -> Instant {
        self.end().0
    }

    /// Whether the hold can still be vouched for: not lost, not released, and not past its
    /// end. A hold found past its end is marked lost here, even if its keeper never ran (a
    /// blocked runtime, a paused process).
    pub(crate) fn check(&self) -> bool {
        if self.signal.is_lost() || self.signal.is_released() {
            return false;
        }
        let (end, reason) = self.end();
        if Instant::now() < end {
            return true;
        }
        self.signal.mark_lost(reason);
        false
    }

    /// Whether the backend vouches for the hold right now: [`check`](Self::check), and not
    /// suspended.
    pub(crate) fn is_held(&self) -> bool {
        self.check() && self.signal.state() == HoldState::Held
    }

    /// Why a hold whose lease end passed is lost.
    fn reason_at_lease_end(&self) -> LossReason {
        if !self.lease.is_watchdog() {
            LossReason::FixedLeaseEnded
        } else if self.signal.renewal_failing() {
            LossReason::RenewalFailed
        } else {
            LossReason::LeaseEnded
        }
    }

    /// Adds a guard (re-entry). Fails if the hold is being released, is lost or past its end,
    /// or is suspended: re-entry hands out only holds the backend vouches for.
    pub(crate) fn enter(&self) -> bool {
        // The count refuses an entry after the last leave, whatever the check saw.
        self.guards.is_live() && self.is_held() && self.guards.enter()
    }

    /// Whether a guard is live and the hold can be vouched for.
    pub(crate) fn is_live(&self) -> bool {
        self.guards.is_live() && self.check()
    }

    /// Removes a guard; true if it was the last one, which must release the hold (exactly
    /// one leave is the last).
    pub(crate) fn leave(&self) -> bool {
        self.guards.leave()
    }

    /// Disarms and stops the keeper. False if the keeper had stopped armed before (its loss
    /// stands, and is reported here if its keeper has not done so yet).
    pub(crate) fn stop_keeper(&self) -> bool {
        let disarmed = self.keeper_arm.disarm();
        if !disarmed {
            self.signal.mark_lost(LossReason::KeeperStopped);
        }
        let stopped = self.keeper.lock().take();
        drop(stopped);
        disarmed
    }

    /// Whether the keeper may still start: neither stopped on purpose nor stopped armed.
    pub(crate) fn keeper_armed(&self) -> bool {
        self.keeper_arm.is_armed()
    }

    /// Called when the keeper stops, or will never start: a keeper that stops while armed
    /// (its runtime shut down, a backend call panicked) reports the loss.
    pub(crate) fn keeper_stopped(&self) {
        if self.keeper_arm.stopped() {
            self.runtime_gone.store(true, Ordering::SeqCst);
            self.signal.mark_lost(LossReason::KeeperStopped);
        }
    }

    /// Waits while the hold is suspended, until the backend vouches for it again, it is lost,
    /// or `deadline` passes.
    pub(crate) async fn settle(&self, deadline: Deadline) -> Settled {
        loop {
            let changed = self.signal.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.check() {
                return Settled::Lost(self.signal.reason().unwrap_or(LossReason::Gone));
            }
            if self.signal.state() == HoldState::Held {
                return Settled::Held;
            }
            if deadline.has_passed() {
                return Settled::Suspended;
            }
            tokio::select! {
                () = changed => {}
                () = sleep_until(self.vouched_until()) => {}
                () = deadline.sleep() => {}
            }
        }
    }

    /// Claims the one release sent to the store (the release, or the clean-up after a loss);
    /// true for the first caller only.
    pub(crate) fn claim_cleanup(&self) -> bool {
        self.cleanup.claim()
    }

    /// After a loss: what may be left on the store is released, best effort (the release is
    /// owner-checked, so it cannot touch a hold that someone else took over meanwhile; a
    /// backend without a server-side lease, such as ZooKeeper, would keep its node until the
    /// session ends). Runs to its end once begun, even if its caller is dropped.
    pub(crate) async fn clean_up_after_loss(&self) {
        let hold = Arc::clone(&self.hold);
        let (backend, name) = (self.backend, self.name.clone());
        finish_if_dropped(async move {
            if let Err(e) = hold.release().await {
                tracing::debug!(backend, lock = %name, error = %e, "clean-up after a loss found nothing to release");
            }
        })
        .await;
    }

    /// Releases the hold on the store (its last guard is gone), or cleans up after a loss.
    pub(crate) async fn release_remote(&self) -> Result<()> {
        self.hold_least_time().await;
        self.stop_keeper();
        if !self.check() {
            if self.claim_cleanup() {
                self.clean_up_after_loss().await;
            }
            return Err(Error::lock_lost(&self.name));
        }
        // The keeper claimed it first: it saw the loss (and reported it before its claim), and
        // its clean-up sends the release.
        if !self.claim_cleanup() {
            return Err(Error::lock_lost(&self.name));
        }
        let result = self.hold.release().await;
        let outcome = match &result {
            // The store released it. A loss reported while the call was in flight (the
            // backend's own) stands: the hold is then lost, never also released.
            Ok(()) => {
                if self.signal.set_released() {
                    "released"
                } else {
                    "lost"
                }
            }
            Err(Error::LockLost { .. }) => {
                self.signal.mark_lost(LossReason::Gone);
                "lost"
            }
            // Nothing renews the hold any more, and nothing tells when the store ends it: no
            // longer vouched for.
            Err(_) => {
                self.signal.mark_lost(LossReason::ReleaseFailed);
                "error"
            }
        };
        metrics::released(self.backend, self.kind, outcome);
        result
    }

    /// The release of a hold whose last guard was dropped, in a task on the runtime the hold
    /// was granted on (or, if that one is gone, the current one); nothing without either, and
    /// the lease or session ends the hold.
    pub(crate) fn release_in_background(self: Arc<Self>) {
        let Some(lost) = self.background_release() else {
            return;
        };
        let home = self
            .runtime
            .clone()
            .filter(|_| !self.runtime_gone.load(Ordering::SeqCst));
        let Some(runtime) = home.or_else(|| Handle::try_current().ok()) else {
            return;
        };
        let span = trace::release(self.backend, self.kind, &self.name, true);
        // A runtime that is shutting down refuses new tasks quietly; the lease then ends the hold.
        // The provider's, or (a grant given back before it was handed out) that of the
        // acquisition dropping it.
        let ticket = self.in_flight().map(Ticket::new).or_else(ticket_here);
        runtime.spawn(
            async move {
                self.finish_release(lost).await;
                drop(ticket);
            }
            .instrument(span),
        );
    }

    /// What the drop of the last guard decides before it spawns the background release:
    /// `None` if nothing is left to do (the hold was released, or someone else cleans up after
    /// its loss), else whether the hold is lost (the clean-up is then claimed).
    pub(crate) fn background_release(&self) -> Option<bool> {
        if self.released_too_soon() {
            // The keeper goes on until the release, once the least time is up.
            return Some(false);
        }
        self.stop_keeper();
        let lost = !self.check();
        if lost && (self.signal.is_released() || !self.claim_cleanup()) {
            return None;
        }
        Some(lost)
    }

    /// The background release decided by [`background_release`](Self::background_release).
    pub(crate) async fn finish_release(&self, lost: bool) {
        if lost {
            self.clean_up_after_loss().await;
        } else if let Err(e) = self.release_remote().await {
            // A close that came first released the hold itself.
            if self.signal.reason() != Some(LossReason::Closed) {
                tracing::warn!(error = %e, "background release failed; the lease will end the hold");
            }
        }
    }

    /// Ends the hold for its provider's close: a hold still vouched for is marked lost
    /// ([`LossReason::Closed`], so its guards' work stops) and released on the store, at
    /// once (whatever its least time); a hold lost before whose clean-up nobody claimed is
    /// cleaned up. `None` if nothing was left to send (released, or its release or clean-up
    /// under way elsewhere); else whether the store released it. The release runs to its end
    /// even if this future is dropped.
    pub(crate) async fn close(&self) -> Option<bool> {
        self.stop_keeper();
        self.clear_release_not_before();
        if self.check() {
            self.signal.mark_lost(LossReason::Closed);
        }
        if self.signal.is_released() || !self.claim_cleanup() {
            return None;
        }
        let hold = Arc::clone(&self.hold);
        let (backend, name) = (self.backend, self.name.clone());
        let released = finish_if_dropped(async move { hold.release().await }).await;
        metrics::released(
            self.backend,
            self.kind,
            if released.is_ok() { "closed" } else { "error" },
        );
        match released {
            Ok(()) => Some(true),
            Err(e) => {
                tracing::debug!(backend, lock = %name, error = %e, "a close found the hold gone or could not release it");
                Some(false)
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some((closer, id)) = self.record.get()
            && let Some(closer) = closer.upgrade()
        {
            closer.forget(*id);
        }
    }
}

/// What became of a hold that was suspended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The backend vouches for it.
    Held,
    /// It was lost (or was lost already).
    Lost(LossReason),
    /// Still suspended at the deadline.
    Suspended,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
