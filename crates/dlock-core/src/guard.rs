//! The guard a successful acquisition returns.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::{Instant, sleep_until};

use crate::close::as_work_of;
use crate::error::{Error, Result};
use crate::finish::finish_if_dropped;
use crate::hold::{HoldSignal, HoldState, NewHold};
use crate::keeper;
use crate::loss::{LockKind, LossReason};
use crate::name::{FencingToken, LockName};
use crate::options::{DriftAllowance, Lease};
use crate::shared::Shared;
use crate::time::{earlier, later};
use crate::trace::{self, in_span};

/// Proof of a hold on a lock, a read or write lock, or a semaphore permit.
///
/// The guard owns everything it needs (it is `'static`, `Send` and `Sync`), so it can move into
/// a task. Release it with [`release`](Self::release) to learn whether the release worked.
/// Watch [`lost`](Self::lost) while you work: it resolves before the store can give the lock
/// to anyone else, and then you must stop touching the protected resource.
///
/// # Time
///
/// The guard vouches for its hold until its *horizon*, less a drift allowance: the horizon is
/// the latest moment at which the store cannot yet have given the lock to anyone else (on
/// lease stores the lease end, counted from when the request that the store granted or
/// renewed was sent; on session stores the session's timeout after the store last answered),
/// and the allowance (by default 1 % of the lease plus 5 ms, see
/// [`DriftAllowance`](crate::DriftAllowance)) covers clock drift and a late process. Past
/// that moment the guard is lost whatever the network does, even if its lease keeper never
/// ran (a blocked runtime, a paused process): [`is_held`](Self::is_held) is false and
/// [`lost`](Self::lost) resolves. dlock needs a tokio runtime with its time driver enabled.
///
/// # Release on drop is not immediate
///
/// Dropping a guard without calling `release` releases the hold in a background task on the
/// runtime the hold was taken on (or the current one, if that one is gone); the lock is free a
/// moment later, not when `drop` returns. Without a runtime nothing is sent and the hold ends
/// with its lease (or session).
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
    /// guard turns lost when its end passes.
    pub fn new(new: NewHold) -> Self {
        let runtime = Handle::try_current().ok();
        let shared = Arc::new(Shared::new(new, runtime.clone()));
        if let Some(runtime) = runtime {
            // Under the keeper's lock: the starter cannot start it before it is in place.
            let mut keeper = shared.keeper.lock();
            *keeper = Some(keeper::place(&runtime, &shared));
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

    /// The hold's state, taken out of the guard without what its drop does.
    #[cfg(loom)]
    pub(crate) fn into_shared(mut self) -> Option<Arc<Shared>> {
        self.shared.take()
    }

    /// Sets the drift allowance from the handle's options (the handles do, after the grant).
    pub(crate) fn set_drift(&self, drift: DriftAllowance) {
        if let Some(shared) = &self.shared {
            shared.set_drift(drift);
        }
    }

    /// Sets the longest lease the backend can keep (the handles do, after the grant).
    pub(crate) fn set_max_lease(&self, max_lease: Duration) {
        if let Some(shared) = &self.shared {
            shared.set_max_lease(max_lease);
        }
    }

    /// Keeps the hold at least `least` from its grant (the send of the request the store
    /// granted; the handles call this as they hand the hold over, see
    /// [`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least)).
    pub(crate) fn set_hold_at_least(&self, least: Duration) {
        if let Some(shared) = &self.shared
            && !least.is_zero()
        {
            shared.set_release_not_before(later(shared.granted, least));
        }
    }

    /// Drops the hold's least time (a MultiLock member the caller never got).
    pub(crate) fn forget_least_time(&self) {
        if let Some(shared) = &self.shared {
            shared.clear_release_not_before();
        }
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
    /// its end (horizon less the drift allowance) has passed, which then reports the loss.
    pub fn state(&self) -> HoldState {
        match &self.shared {
            Some(shared) if shared.check() => shared.signal.state(),
            _ => HoldState::Lost,
        }
    }

    /// Whether the backend vouches for the hold right now: false once it is lost, false once
    /// its end has passed (even if the keeper never ran), and false while it is
    /// [`HoldState::Suspended`].
    pub fn is_held(&self) -> bool {
        self.shared.as_ref().is_some_and(|s| s.is_held())
    }

    /// The moment this guard stops vouching for its hold unless it is renewed before (the
    /// horizon less the drift allowance); `None` once it is lost. A watchdog lease moves it
    /// at each renewal, a session's answers move it on session stores.
    pub fn held_until(&self) -> Option<Instant> {
        let shared = self.shared.as_ref()?;
        shared.check().then(|| shared.vouched_until())
    }

    /// Asks the store whether it still has the hold, for stores where a hold can end before its
    /// lease without the client knowing (see
    /// [`Capabilities::connection_bound`](crate::Capabilities::connection_bound)); elsewhere it
    /// trusts the lease. A hold the store says is gone is marked lost
    /// ([`LossReason::Gone`], unless the backend gave a reason).
    ///
    /// # Errors
    ///
    /// Connection and backend errors (the hold is then neither confirmed nor marked lost).
    pub async fn verify(&self) -> Result<bool> {
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

    /// A future that resolves when the hold is lost: at the latest when its end (the horizon
    /// less the drift allowance) passes without a renewal, so before the store can give the
    /// lock to anyone else, whatever the network does. It never resolves for a hold that was
    /// released. Cheap to call many times; each call gives an independent future that owns
    /// what it needs (and does not keep the hold alive).
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
        self.watch(false, Duration::ZERO)
    }

    /// A future that resolves when the backend stops vouching for the hold: when it is lost,
    /// and also as soon as it is [`HoldState::Suspended`] (a ZooKeeper session disconnected, an
    /// etcd keep-alive that failed), when the store may already have decided the session is
    /// over. Stop the work under the lock when it resolves, as Curator advises for its
    /// SUSPENDED state; [`DistributedLockExt::run`](crate::DistributedLockExt::run) does.
    /// Never resolves for a hold that was released.
    pub fn in_doubt(&self) -> impl Future<Output = ()> + Send + 'static {
        self.watch(true, Duration::ZERO)
    }

    /// A future that resolves once the hold is lost, or will be within `margin` unless it is
    /// renewed first (its [`held_until`](Self::held_until) is `margin` away or less): the
    /// moment to begin a shutdown that must be over before the lock can pass on.
    pub fn expiring(&self, margin: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.watch(false, margin)
    }

    /// Resolves when the hold is lost, or (`doubt`) suspended, or within `margin` of its end;
    /// never after a release. Keeps only a weak reference to the hold.
    fn watch(&self, doubt: bool, margin: Duration) -> impl Future<Output = ()> + Send + 'static {
        let parts = self
            .shared
            .as_ref()
            .map(|s| (s.signal.clone(), Arc::downgrade(s)));
        async move {
            if let Some((signal, shared)) = parts {
                watch(signal, shared, doubt, margin).await;
            }
        }
    }

    /// The lease this hold was taken with.
    pub fn lease(&self) -> Option<Lease> {
        self.shared.as_ref().map(|s| s.lease)
    }

    /// How long this guard vouches for the hold from now unless it is renewed (see
    /// [`held_until`](Self::held_until)).
    pub fn remaining(&self) -> Duration {
        self.held_until().map_or(Duration::ZERO, |end| {
            end.saturating_duration_since(Instant::now())
        })
    }

    /// Another guard on the same hold, with the same token: explicit re-entry, for handing the
    /// hold to another task that will release its own guard. The store's hold is released
    /// when the last of its guards is.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the hold is lost, past its end, being released, or suspended.
    pub fn reenter(&self) -> Result<Self> {
        match &self.shared {
            Some(shared) if shared.enter() => Ok(Self::from_shared(Arc::clone(shared))),
            _ => Err(Error::lock_lost(&self.name)),
        }
    }

    /// Moves the end of a [`Lease::Fixed`] hold to `ttl` from now.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the hold is gone (also when it was lost while the call was in
    /// flight, and when the store's answer came after the new end, less the drift allowance),
    /// [`Error::InvalidArgument`] for a zero `ttl`, one above the backend's
    /// [`Capabilities::max_lease`](crate::Capabilities::max_lease) (at most [`Lease::MAX`]),
    /// or a watchdog lease (the watchdog already renews it), or the backend's error.
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
        let max = shared.max_lease();
        if ttl > max {
            return Err(Error::invalid_argument(
                "ttl",
                format!(
                    "{ttl:?} is longer than the {max:?} maximum of {}",
                    shared.backend
                ),
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
        let span = trace::extend(shared.backend, shared.kind, &self.name);
        match in_span(&span, shared.hold.extend(ttl)).await {
            // The hold may have been lost (and its keeper released it) while the call was in
            // flight: then the extension does not count.
            Ok(()) if shared.signal.is_lost() => Err(Error::lock_lost(&self.name)),
            Ok(()) => {
                shared.set_lease_end(later(sent, ttl));
                shared.extended.notify_one();
                shared.signal.notify_changed();
                // An answer that came after the new end: the store's hold is already over.
                if !shared.check() {
                    return Err(Error::lock_lost(&self.name));
                }
                // An end moved before the keeper's start (a shortened lease) must not wait
                // for that start: the keeper ends the hold and cleans up at the new end.
                keeper::start_now(shared);
                Ok(())
            }
            Err(e @ Error::LockLost { .. }) => {
                shared.signal.mark_lost(LossReason::Gone);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases the hold. For a re-entered lock, only the last guard of the hold releases it
    /// on the server; the others return `Ok(())` at once. A released hold is never reported
    /// lost: a [`lost`](Self::lost) future that outlives the release stays pending.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the hold was lost before (nothing is changed on the server), or
    /// the backend's error (the hold then ends with its lease).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped once the release began, the release runs to its
    /// end in the background, sent once.
    ///
    /// A hold with a least time ([`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least))
    /// that has not passed yet is kept, renewed, until it has: the release returns then (or
    /// at once with [`Error::LockLost`] if the hold is lost meanwhile). Dropped while it
    /// waits, it still releases then, in the background; [`release_now`](Self::release_now)
    /// does not wait.
    pub async fn release(self) -> Result<()> {
        self.release_with(false).await
    }

    /// Releases as [`release`](Self::release) does, but at once, before the hold's least time
    /// ([`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least)) if it has one: for
    /// a hold whose work never ran (a command that could not start, a rollback) or is being
    /// abandoned (a shutdown). A re-entered hold keeps its least time until its last guard
    /// goes.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    pub async fn release_now(self) -> Result<()> {
        self.release_with(true).await
    }

    async fn release_with(mut self, now: bool) -> Result<()> {
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
        if now {
            shared.clear_release_not_before();
        }
        let span = trace::release(shared.backend, shared.kind, &self.name, false);
        let in_flight = shared.in_flight().cloned();
        // A release cut off finishes in the background, a clean-up of the hold's provider.
        let release = finish_if_dropped(async move { shared.release_remote().await });
        in_span(&span, as_work_of(in_flight.as_ref(), release)).await
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

/// Resolves when the hold is lost, or (`doubt`) suspended, or within `margin` of its end; never
/// after a release, nor for a hold that was leaked and forgotten.
async fn watch(signal: HoldSignal, shared: Weak<Shared>, doubt: bool, margin: Duration) {
    loop {
        let changed = signal.changed();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if signal.is_lost() {
            return;
        }
        if signal.is_released() {
            break;
        }
        if doubt && signal.state() == HoldState::Suspended {
            return;
        }
        let Some(s) = shared.upgrade() else { break };
        if !s.check() {
            continue;
        }
        let wake = earlier(s.vouched_until(), margin);
        drop(s);
        if Instant::now() >= wake {
            return;
        }
        tokio::select! {
            () = changed => {}
            () = sleep_until(wake) => {}
        }
    }
    std::future::pending::<()>().await;
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take()
            && shared.leave()
        {
            shared.release_in_background();
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
