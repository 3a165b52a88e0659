//! A hold's life from grant to release on a store-less backend: when the guard stops
//! vouching for it (lease end, horizon, drift allowance, suspension), what a release does
//! once and only once, and what is never reported as a loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use dlock_core::backend::{
    HandleInfo, Hold, HoldSignal, Horizon, Lock, Mutex, NewHold, RawLock, Request, from_now,
};
use dlock_core::{
    DistributedLock, DistributedLockExt, DriftAllowance, Error, FencingToken, HoldState, Lease,
    LockGuard, LockKind, LockName, LockOptions, LossReason, Result, async_trait,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A store-less hold. `release` takes effect on the "store" at once and answers after
/// `release_delay`; a second release answers "not yours" (the store already released it).
#[derive(Debug, Default)]
struct Fake {
    releases: AtomicUsize,
    release_delay: Duration,
    extend_delay: Duration,
    released: Notify,
}

#[async_trait]
impl Hold for Fake {
    async fn release(&self) -> Result<()> {
        let n = self.releases.fetch_add(1, SeqCst);
        self.released.notify_one();
        if !self.release_delay.is_zero() {
            tokio::time::sleep(self.release_delay).await;
        }
        if n > 0 {
            return Err(Error::lock_lost("fake"));
        }
        Ok(())
    }

    async fn extend(&self, _ttl: Duration) -> Result<()> {
        if !self.extend_delay.is_zero() {
            tokio::time::sleep(self.extend_delay).await;
        }
        Ok(())
    }
}

fn new_hold(hold: Arc<Fake>, lease: Lease) -> NewHold {
    NewHold::new(
        "fake",
        LockKind::Mutex,
        LockName::new("fake").unwrap(),
        FencingToken::new(1),
        lease,
        Instant::now(),
        hold,
    )
}

fn guard(hold: Arc<Fake>, lease: Lease) -> LockGuard {
    LockGuard::new(new_hold(hold, lease))
}

/// Waits for `what` to be true, every millisecond, failing after `limit`.
async fn until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = from_now(limit);
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A `lost()` future that outlives a clean release never resolves (it is `'static` so that
/// it can move into a monitoring task), and the hold is not counted as lost.
#[tokio::test(start_paused = true)]
async fn a_released_hold_is_never_reported_lost() {
    let g = guard(Arc::default(), Lease::watchdog(Duration::from_secs(3)));
    let lost = g.lost();
    let doubt = g.in_doubt();
    g.release().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(10), lost)
            .await
            .is_err(),
        "lost() resolved for a hold that was released"
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(1), doubt)
            .await
            .is_err(),
        "in_doubt() resolved for a hold that was released"
    );
}

/// A release cancelled once it reached the store finishes in the background, sent once: the
/// store is not asked twice, and its "not yours" to a second ask is not taken for a loss.
#[tokio::test]
async fn a_cancelled_release_is_sent_once_and_is_no_loss() {
    let hold = Arc::new(Fake {
        release_delay: Duration::from_millis(200),
        ..Fake::default()
    });
    let g = guard(Arc::clone(&hold), Lease::watchdog(Duration::from_secs(30)));
    let lost = g.lost();
    let _ = tokio::time::timeout(Duration::from_millis(20), g.release()).await;
    // The release answers 200 ms after it was sent; a second one would be counted at once.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(hold.releases.load(SeqCst), 1, "the release was sent twice");
    assert!(
        tokio::time::timeout(Duration::from_millis(10), lost)
            .await
            .is_err(),
        "a cancelled release was reported as a loss"
    );
}

/// The keeper runs but has not yet seen the end the guard saw (the runtime stalled past it);
/// the holder releases at once, aborting the keeper: the store is still asked to drop what
/// may be left, once.
#[test]
fn a_loss_is_cleaned_up_on_the_store_even_if_released_at_once() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let hold = Arc::new(Fake::default());
        let g = guard(Arc::clone(&hold), Lease::Fixed(Duration::from_millis(600)));
        // The keeper is started a sixth of the lease after the grant, at 100 ms.
        tokio::time::sleep(Duration::from_millis(250)).await;
        // The stall under test: the runtime's only thread sleeps past the lease end.
        std::thread::sleep(Duration::from_millis(450));
        assert!(!g.is_held());
        let r = g.release().await;
        assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
        until(Duration::from_secs(2), "the clean-up", || {
            hold.releases.load(SeqCst) >= 1
        })
        .await;
        // The keeper, aborted, did not clean up a second time.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(hold.releases.load(SeqCst), 1, "cleaned up twice");
    });
}

/// `extend(ttl)` whose answer comes after `ttl` (less the drift allowance) is `LockLost`:
/// the store's hold ended before the client heard it was extended.
#[tokio::test]
async fn an_extend_answered_after_its_ttl_is_lock_lost() {
    let hold = Arc::new(Fake {
        extend_delay: Duration::from_millis(150),
        ..Fake::default()
    });
    let g = guard(hold, Lease::Fixed(Duration::from_secs(10)));
    let r = g.extend(Duration::from_millis(100)).await;
    assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
    assert!(!g.is_held());
    assert_eq!(g.loss_reason(), Some(LossReason::FixedLeaseEnded));
}

/// The guard stops vouching for a hold a drift allowance before its lease end: 1 % of the
/// lease plus 5 ms by default; `lost()` resolves then.
#[tokio::test(start_paused = true)]
async fn the_guard_stops_a_drift_allowance_before_the_lease_end() {
    let started = Instant::now();
    let g = guard(Arc::default(), Lease::Fixed(Duration::from_secs(10)));
    let allowance = DriftAllowance::DEFAULT.of(Duration::from_secs(10));
    assert_eq!(allowance, Duration::from_millis(105));
    let end = g.held_until().unwrap();
    assert_eq!(end - started, Duration::from_secs(10) - allowance);
    tokio::time::sleep_until(end - Duration::from_millis(1)).await;
    assert!(g.is_held(), "lost before its end");
    g.lost().await;
    assert!(Instant::now() >= end, "lost before its end");
    assert!(!g.is_held());
    assert_eq!(g.loss_reason(), Some(LossReason::FixedLeaseEnded));
}

/// A hold in a session is vouched for until the session's horizon (less the allowance),
/// however long its lease: a horizon that no answer moves ends the hold, one that answers
/// move keeps it.
#[tokio::test(start_paused = true)]
async fn a_hold_is_lost_at_its_sessions_horizon() {
    let horizon = Horizon::new(
        from_now(Duration::from_secs(10)),
        LossReason::SessionTimedOut,
    );
    let g = LockGuard::new(
        new_hold(Arc::default(), Lease::watchdog(Duration::from_secs(30)))
            .with_horizon(horizon.clone()),
    );
    let started = Instant::now();
    // Answers move the horizon: the hold outlives the first one.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        horizon.advance(from_now(Duration::from_secs(10)));
        assert!(g.is_held(), "lost while the session answered");
    }
    // The session goes silent: the hold is lost at its horizon, long before the lease end.
    let silent = Instant::now();
    g.lost().await;
    let after = Instant::now() - silent;
    assert!(
        after < Duration::from_secs(10) && after >= Duration::from_secs(9),
        "lost {after:?} after the last answer"
    );
    assert_eq!(g.loss_reason(), Some(LossReason::SessionTimedOut));
    assert!(Instant::now() - started < Duration::from_secs(30));
}

/// A backend whose holds carry a signal the test can suspend, as a ZooKeeper session that
/// disconnects does, and that may register a grant as suspended (a session reconnecting).
#[derive(Debug, Default)]
struct Sessions {
    grants: AtomicUsize,
    suspended_at_grant: bool,
    last: Mutex<Option<HoldSignal>>,
}

#[async_trait]
impl RawLock for Sessions {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let n = self.grants.fetch_add(1, SeqCst);
        let signal = HoldSignal::new();
        if self.suspended_at_grant {
            signal.set_suspended(true);
        }
        *self.last.lock() = Some(signal.clone());
        Ok(Some(LockGuard::new(
            NewHold::new(
                "fake",
                LockKind::Mutex,
                req.name.clone(),
                FencingToken::new(n as u64 + 1),
                req.options.lease,
                Instant::now(),
                Arc::new(Fake::default()),
            )
            .with_signal(signal),
        )))
    }
}

fn handle(raw: Sessions) -> Arc<Lock<Sessions>> {
    let info = HandleInfo::new(
        "fake",
        "fake://",
        LockName::new("s").unwrap(),
        LockOptions::new().with_reentrant(true),
    );
    Arc::new(Lock::new(info, raw))
}

fn last_signal(lock: &Lock<Sessions>) -> HoldSignal {
    lock.raw().last.lock().clone().unwrap()
}

/// `run()` stops its work as soon as the hold is suspended: the store may already have ended
/// the session and granted the lock elsewhere.
#[tokio::test]
async fn run_stops_the_work_when_the_hold_is_suspended() {
    let lock = handle(Sessions::default());
    let l2 = Arc::clone(&lock);
    let r = lock
        .run(move |_| async move {
            last_signal(&l2).set_suspended(true);
            tokio::time::sleep(Duration::from_secs(10)).await;
            "wrote under a hold nobody vouched for"
        })
        .await;
    assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
}

/// A grant that arrives while the session is suspended is waited on, not thrown away: it is
/// handed over when the session is back, and no further grant is taken.
#[tokio::test]
async fn a_grant_during_a_suspension_waits_for_the_session() {
    let lock = handle(Sessions {
        suspended_at_grant: true,
        ..Sessions::default()
    });
    let acquiring = {
        let lock = Arc::clone(&lock);
        tokio::spawn(async move { lock.acquire().await })
    };
    until(Duration::from_secs(5), "the grant", || {
        lock.raw().grants.load(SeqCst) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!acquiring.is_finished(), "handed over while suspended");
    last_signal(&lock).set_suspended(false);
    let g = acquiring.await.unwrap().unwrap();
    assert!(g.is_held());
    assert_eq!(lock.raw().grants.load(SeqCst), 1, "grants thrown away");
    // Still suspended at a deadline: an error that says so, not a lease too short.
    let r = handle(Sessions {
        suspended_at_grant: true,
        ..Sessions::default()
    })
    .try_acquire(Duration::from_millis(100))
    .await;
    match r {
        Err(e @ Error::Connection { .. }) => assert!(e.to_string().contains("suspended"), "{e}"),
        other => panic!("expected a connection error, got {other:?}"),
    }
}

/// Re-entry hands out only a hold the backend vouches for: while it is suspended, the same
/// task's second acquire waits (and gets nothing within its wait).
#[tokio::test]
async fn reentry_never_hands_out_a_suspended_guard() {
    let lock = handle(Sessions::default());
    let g1 = lock.acquire().await.unwrap();
    last_signal(&lock).set_suspended(true);
    assert_eq!(g1.state(), HoldState::Suspended);
    let g2 = lock.try_acquire(Duration::ZERO).await;
    assert!(
        matches!(&g2, Ok(Some(g)) if g.is_held() && g.fencing_token() != g1.fencing_token())
            || matches!(&g2, Ok(None) | Err(_)),
        "re-entered a suspended hold: {g2:?}"
    );
    assert!(
        g1.reenter().is_err(),
        "explicit re-entry of a suspended hold"
    );
    drop((g1, g2));
}

/// A guard dropped under another runtime (one that ends right after) is released on the
/// runtime the hold was taken on, which lives on.
#[test]
fn a_dropped_guard_is_released_on_its_own_runtime() {
    let home = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let hold = Arc::new(Fake::default());
    let g = home.block_on({
        let hold = Arc::clone(&hold);
        async move { guard(hold, Lease::watchdog(Duration::from_secs(30))) }
    });
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    other.block_on(async move { drop(g) });
    drop(other);
    home.block_on(async {
        until(Duration::from_secs(5), "the background release", || {
            hold.releases.load(SeqCst) == 1
        })
        .await;
    });
}

/// Explicit re-entry: another guard on the same hold and token, for another task; the store's
/// hold goes with the last guard.
#[tokio::test]
async fn an_explicit_reentry_shares_the_hold_until_the_last_guard() {
    let hold = Arc::new(Fake::default());
    let g = guard(Arc::clone(&hold), Lease::watchdog(Duration::from_secs(30)));
    let again = g.reenter().unwrap();
    assert_eq!(again.fencing_token(), g.fencing_token());
    let task = tokio::spawn(async move { again.release().await });
    task.await.unwrap().unwrap();
    assert_eq!(hold.releases.load(SeqCst), 0, "released with a guard left");
    assert!(g.is_held());
    g.release().await.unwrap();
    assert_eq!(hold.releases.load(SeqCst), 1);
}

#[derive(Debug, Default)]
struct ExclusiveStore {
    holder: Mutex<Option<u64>>,
    freed: Notify,
    next: AtomicU64,
    releases: AtomicUsize,
    last: Mutex<Option<HoldSignal>>,
}

#[derive(Debug)]
struct StoreHold {
    store: Arc<ExclusiveStore>,
    id: u64,
}

#[async_trait]
impl Hold for StoreHold {
    async fn release(&self) -> Result<()> {
        self.store.releases.fetch_add(1, SeqCst);
        let mut h = self.store.holder.lock();
        if *h == Some(self.id) {
            *h = None;
            drop(h);
            self.store.freed.notify_waiters();
            Ok(())
        } else {
            Err(Error::lock_lost("x"))
        }
    }
    async fn extend(&self, _: Duration) -> Result<()> {
        if *self.store.holder.lock() == Some(self.id) {
            Ok(())
        } else {
            Err(Error::lock_lost("x"))
        }
    }
}

#[derive(Debug, Default)]
struct Exclusive(Arc<ExclusiveStore>);

#[async_trait]
impl RawLock for Exclusive {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        loop {
            let freed = self.0.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut h = self.0.holder.lock();
                if h.is_none() {
                    let id = self.0.next.fetch_add(1, SeqCst) + 1;
                    *h = Some(id);
                    let signal = HoldSignal::new();
                    *self.0.last.lock() = Some(signal.clone());
                    let hold = StoreHold {
                        store: Arc::clone(&self.0),
                        id,
                    };
                    return Ok(Some(LockGuard::new(
                        NewHold::new(
                            "fake",
                            LockKind::Mutex,
                            req.name.clone(),
                            FencingToken::new(id),
                            req.options.lease,
                            Instant::now(),
                            Arc::new(hold),
                        )
                        .with_signal(signal),
                    )));
                }
            }
            match req.deadline.instant() {
                Some(d) => {
                    if tokio::time::timeout_at(d, freed).await.is_err() {
                        return Ok(None);
                    }
                }
                None => freed.await,
            }
        }
    }
}

fn exclusive(opts: LockOptions) -> Arc<Lock<Exclusive>> {
    let info = HandleInfo::new("fake", "fake://", LockName::new("x").unwrap(), opts);
    Arc::new(Lock::new(info, Exclusive::default()))
}

/// A hold that counts releases; `fail_release` makes each release a connection error.
#[derive(Debug, Default)]
struct Counting {
    releases: AtomicUsize,
    fail_release: bool,
}

#[async_trait]
impl Hold for Counting {
    async fn release(&self) -> Result<()> {
        self.releases.fetch_add(1, SeqCst);
        if self.fail_release {
            return Err(Error::no_answer("fake", "store unreachable"));
        }
        Ok(())
    }
    async fn extend(&self, _: Duration) -> Result<()> {
        Ok(())
    }
}

fn counting_hold(hold: Arc<Counting>, lease: Lease) -> NewHold {
    NewHold::new(
        "fake",
        LockKind::Mutex,
        LockName::new("x").unwrap(),
        FencingToken::new(1),
        lease,
        Instant::now(),
        hold,
    )
}

/// A task that holds a reentrant lock and acquires again while its session is briefly
/// suspended (a ZooKeeper reconnect) does not wait at the store behind its own hold: it waits
/// for the session, then re-enters.
#[tokio::test]
async fn a_reentry_during_a_brief_suspension_waits_for_the_session() {
    let lock = exclusive(LockOptions::new().with_reentrant(true));
    let g1 = lock.acquire().await.unwrap();
    let signal = lock.raw().0.last.lock().clone().unwrap();
    signal.set_suspended(true);
    let back = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        signal.set_suspended(false);
    };
    let again = tokio::time::timeout(Duration::from_secs(3), lock.acquire());
    let ((), r) = tokio::join!(back, again);
    let g2 = r
        .expect("the task's second acquire waited at the store behind its own hold, 3 s after the session came back")
        .unwrap();
    assert_eq!(g2.fencing_token(), g1.fencing_token());
}

/// The drift allowance of a session's horizon is taken from the session's span, not from the
/// lease: a 1 h lease in a live 10 s session is held (1 % of an hour is 36 s).
#[tokio::test(start_paused = true)]
async fn a_long_lease_in_a_live_session_is_held() {
    let horizon = Horizon::new(
        from_now(Duration::from_secs(10)),
        LossReason::SessionTimedOut,
    );
    let g = LockGuard::new(
        counting_hold(Arc::default(), Lease::Fixed(Duration::from_secs(3600)))
            .with_horizon(horizon),
    );
    assert!(
        g.is_held(),
        "a fresh grant in a session that answered just now is not held: {:?}",
        g.loss_reason()
    );
}

/// The same through a handle: a 20-minute watchdog lease in a 10 s session is granted.
#[derive(Debug)]
struct InSession;

#[async_trait]
impl RawLock for InSession {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let horizon = Horizon::new(
            from_now(Duration::from_secs(10)),
            LossReason::SessionTimedOut,
        );
        Ok(Some(LockGuard::new(
            counting_hold(Arc::default(), req.options.lease).with_horizon(horizon),
        )))
    }
}

#[tokio::test]
async fn a_long_watchdog_lease_on_a_session_store_is_granted() {
    let opts = LockOptions::default().with_lease(Lease::watchdog(Duration::from_secs(1200)));
    dlock_core::Capabilities::all("fake").check(&opts).unwrap(); // the options are valid
    let info = HandleInfo::new("fake", "fake://", LockName::new("x").unwrap(), opts);
    let lock = Lock::new(info, InSession);
    let r = lock.acquire().await;
    assert!(r.is_ok(), "{r:?}");
}

/// A guard whose runtime is gone, dropped on a live one, is released on the live one.
#[test]
fn a_guard_whose_runtime_is_gone_is_released_on_the_current_one() {
    let home = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let hold = Arc::new(Counting::default());
    let g = home.block_on({
        let hold = Arc::clone(&hold);
        async move {
            LockGuard::new(counting_hold(
                hold,
                Lease::watchdog(Duration::from_secs(30)),
            ))
        }
    });
    drop(home);
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    other.block_on(async move {
        drop(g);
        let deadline = from_now(Duration::from_secs(2));
        while hold.releases.load(SeqCst) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            hold.releases.load(SeqCst),
            1,
            "nothing sent: the clean-up went to the dead runtime"
        );
    });
}

/// `expiring(margin)` follows an `extend` that shortened a fixed lease: it resolves `margin`
/// before the new end (about 4.9 s), not at the loss.
#[tokio::test(start_paused = true)]
async fn expiring_follows_a_shortened_lease() {
    let g = LockGuard::new(counting_hold(
        Arc::default(),
        Lease::Fixed(Duration::from_secs(60)),
    ));
    let t0 = Instant::now();
    let expiring = tokio::spawn(g.expiring(Duration::from_secs(5)));
    tokio::task::yield_now().await;
    g.extend(Duration::from_secs(10)).await.unwrap();
    expiring.await.unwrap();
    let at = t0.elapsed();
    assert!(
        at <= Duration::from_millis(5_100),
        "expiring(5 s) resolved {at:?} after the lease was cut to 10 s (lost at {:?})",
        g.loss_reason()
    );
}

/// A release that failed leaves the hold on the store, renewed by nobody: it is reported lost
/// (a lingering `lost()` resolves), unlike a clean release.
#[tokio::test(start_paused = true)]
async fn a_failed_release_is_reported_lost() {
    let hold = Arc::new(Counting {
        fail_release: true,
        ..Counting::default()
    });
    let g = LockGuard::new(counting_hold(hold, Lease::watchdog(Duration::from_secs(3))));
    let lost = tokio::spawn(g.lost());
    assert!(g.release().await.is_err());
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        lost.is_finished(),
        "the hold is still on the store, never renewed, and never reported lost"
    );
}

/// A dispatcher that acquires and hands each guard to a worker task waits for the worker
/// before its next acquire (handles are not reentrant by default), as with a
/// `tokio::sync::Mutex`: never two workers inside at once.
#[tokio::test]
async fn a_guard_handed_to_a_worker_keeps_the_dispatcher_out() {
    let lock = exclusive(LockOptions::default());
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let g = lock.acquire().await.unwrap();
        let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
        workers.push(tokio::spawn(async move {
            let n = inside.fetch_add(1, SeqCst) + 1;
            most.fetch_max(n, SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            inside.fetch_sub(1, SeqCst);
            g.release().await.unwrap();
        }));
        tokio::task::yield_now().await;
    }
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(most.load(SeqCst), 1, "workers inside at once");
}

/// A renewal that hangs on a session store is not cut off at the horizon it saw when it was
/// sent: answers keep moving the horizon, and the hold lasts to its lease end.
#[derive(Debug)]
struct HungRenewal;

#[async_trait]
impl Hold for HungRenewal {
    async fn release(&self) -> Result<()> {
        Ok(())
    }
    async fn extend(&self, _: Duration) -> Result<()> {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_renewal_is_not_lost_at_a_stale_horizon() {
    let horizon = Horizon::new(
        from_now(Duration::from_secs(10)),
        LossReason::SessionTimedOut,
    );
    let g = LockGuard::new(
        NewHold::new(
            "fake",
            LockKind::Mutex,
            LockName::new("x").unwrap(),
            FencingToken::new(1),
            Lease::watchdog(Duration::from_secs(30)),
            Instant::now(),
            Arc::new(HungRenewal),
        )
        .with_horizon(horizon.clone()),
    );
    let t0 = Instant::now();
    let h2 = horizon.clone();
    let pinger = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            h2.advance(from_now(Duration::from_secs(10)));
        }
    });
    g.lost().await;
    let at = t0.elapsed();
    pinger.abort();
    // The renewal began at 10 s; the lease set at the grant ends at 30 s (less 0.305 s).
    assert!(
        at >= Duration::from_secs(29),
        "lost at {at:?} ({:?}) while the session answered and the lease ran to 30 s",
        g.loss_reason()
    );
}
