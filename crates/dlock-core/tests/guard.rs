//! The guard and its lease keeper on a store-less hold: time, loss, and the types' bounds.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use dlock_core::backend::{Hold, NewHold};
use dlock_core::{
    Error, FencingToken, Lease, LockGuard, LockKind, LockName, LossReason, MultiGuard, Result,
    async_trait,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A hold whose store always answers yes (or, with `gone`, "not yours"), counting calls.
#[derive(Debug, Default)]
struct Fake {
    gone: AtomicBool,
    extends: AtomicUsize,
    releases: AtomicUsize,
    /// When set, `extend` waits for it before answering.
    gate: Option<Arc<Notify>>,
    /// Told of every release.
    released: Notify,
}

#[async_trait]
impl Hold for Fake {
    async fn release(&self) -> Result<()> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.released.notify_one();
        if self.gone.load(Ordering::SeqCst) {
            return Err(Error::lock_lost("fake"));
        }
        Ok(())
    }

    async fn extend(&self, _ttl: Duration) -> Result<()> {
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        self.extends.fetch_add(1, Ordering::SeqCst);
        if self.gone.load(Ordering::SeqCst) {
            return Err(Error::lock_lost("fake"));
        }
        Ok(())
    }
}

fn guard(hold: Arc<Fake>, lease: Lease) -> LockGuard {
    LockGuard::new(NewHold::new(
        "fake",
        LockKind::Mutex,
        LockName::new("fake").unwrap(),
        FencingToken::new(1),
        lease,
        Instant::now(),
        hold,
    ))
}

/// A runtime of one thread, with time.
fn current_thread() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::config)
}

fn check_send_sync_static<T: Send + Sync + 'static>(_: &T) {}
fn check_send<T: Send>(_: &T) {}

/// The types a user moves between tasks, and the futures a user spawns, are `Send`, `Sync`
/// and `'static` where they should be (as tokio's `bounds()` test pins its guards).
#[tokio::test]
async fn bounds() {
    fn types<T: Send + Sync + 'static>() {}
    types::<LockGuard>();
    types::<MultiGuard>();
    types::<dlock_core::DynLock>();
    types::<dlock_core::DynReadWriteLock>();
    types::<dlock_core::DynSemaphore>();
    types::<dlock_core::DynLockProvider>();
    types::<dlock_core::MultiLock>();
    types::<Error>();
    let g = guard(Arc::default(), Lease::default());
    check_send_sync_static(&g.lost());
    let extend = g.extend(Duration::from_secs(1));
    check_send(&extend);
    drop(extend);
    let release = g.release();
    check_send(&release);
    fn is_static<F: Future + 'static>(_: &F) {}
    is_static(&release);
    release.await.unwrap();
}

/// Without any keeper (the guard was built outside a runtime), `is_held()` is false once the
/// lease end passed, and `lost()` resolves then.
#[test]
fn a_guard_without_a_keeper_is_lost_at_its_lease_end() {
    let g = guard(Arc::default(), Lease::Fixed(Duration::from_millis(50)));
    assert!(g.is_held());
    // The stall under test (nothing runs: there is no runtime), not a wait for an event.
    std::thread::sleep(Duration::from_millis(80));
    assert!(!g.is_held());
    assert_eq!(g.loss_reason(), Some(LossReason::FixedLeaseEnded));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(1), g.lost())
            .await
            .expect("lost() resolves");
    });
}

/// A keeper whose runtime is dropped reports `KeeperStopped`, even if it never ran.
#[test]
fn a_keeper_whose_runtime_is_dropped_reports_the_loss() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let g = rt.block_on(async { guard(Arc::default(), Lease::default()) });
    assert!(g.is_held());
    drop(rt);
    assert!(!g.is_held());
    assert_eq!(g.loss_reason(), Some(LossReason::KeeperStopped));
}

/// A guard released normally does not report a loss when its keeper is stopped.
#[tokio::test]
async fn a_released_guard_is_not_reported_lost() {
    let hold = Arc::new(Fake::default());
    let g = guard(Arc::clone(&hold), Lease::default());
    let lost = g.lost();
    g.release().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(100), lost)
            .await
            .is_err(),
        "a released hold was reported lost"
    );
    assert_eq!(hold.releases.load(Ordering::SeqCst), 1);
}

/// `extend` that answers after the hold was lost meanwhile does not count.
#[tokio::test]
async fn extend_rechecks_the_loss_after_its_call() {
    let gate = Arc::new(Notify::new());
    let hold = Arc::new(Fake {
        gate: Some(Arc::clone(&gate)),
        ..Fake::default()
    });
    let g = Arc::new(guard(
        Arc::clone(&hold),
        Lease::Fixed(Duration::from_millis(300)),
    ));
    let extending = {
        let g = Arc::clone(&g);
        tokio::spawn(async move { g.extend(Duration::from_secs(60)).await })
    };
    // The fixed lease ends while the extend is in flight.
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("the fixed lease ends");
    gate.notify_one();
    let r = extending.await.unwrap();
    assert!(matches!(r, Err(Error::LockLost { .. })), "got {r:?}");
    assert!(!g.is_held());
}

/// The watchdog renews every ttl/3 and reports `Gone` when the store says the hold is not ours.
#[tokio::test(start_paused = true)]
async fn the_watchdog_renews_and_reports_a_gone_hold() {
    let hold = Arc::new(Fake::default());
    let g = guard(Arc::clone(&hold), Lease::watchdog(Duration::from_secs(3)));
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(g.is_held());
    assert!(
        hold.extends.load(Ordering::SeqCst) >= 3,
        "renewed every second"
    );
    hold.gone.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost within a renewal period");
    assert_eq!(g.loss_reason(), Some(LossReason::Gone));
}

/// A hold whose batched renewals always fail (a batch the store refuses) while a renewal of
/// its own goes through, counting both.
#[derive(Debug, Default)]
struct BatchFails {
    renews: AtomicUsize,
    extends: AtomicUsize,
    /// Told of every renewal that went through alone.
    extended: Notify,
}

#[async_trait]
impl Hold for BatchFails {
    async fn release(&self) -> Result<()> {
        Ok(())
    }

    async fn extend(&self, _ttl: Duration) -> Result<()> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.extended.notify_one();
        Ok(())
    }

    async fn renew(&self, _ttl: Duration) -> Result<()> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        Err(Error::no_answer("fake", "the batch was refused"))
    }
}

/// The watchdog's tries are batched renewals while more than a third of the lease is left;
/// after that they go alone (`extend`), so a batch that keeps failing does not cost the hold.
#[tokio::test(start_paused = true)]
async fn a_batch_that_keeps_failing_is_retried_alone_in_the_last_third() {
    let hold = Arc::new(BatchFails::default());
    let g = LockGuard::new(NewHold::new(
        "fake",
        LockKind::Mutex,
        LockName::new("fake").unwrap(),
        FencingToken::new(1),
        Lease::watchdog(Duration::from_secs(3)),
        Instant::now(),
        Arc::clone(&hold) as Arc<dyn Hold>,
    ));
    // Three periods' renewals (a second each), each retried alone at last, within four
    // leases.
    tokio::time::timeout(Duration::from_secs(12), async {
        while hold.extends.load(Ordering::SeqCst) < 3 {
            hold.extended.notified().await;
        }
    })
    .await
    .expect("three renewals went through alone");
    assert!(g.is_held(), "kept by the retries: {:?}", g.loss_reason());
    let (renews, extends) = (
        hold.renews.load(Ordering::SeqCst),
        hold.extends.load(Ordering::SeqCst),
    );
    assert!(
        renews >= 3 && extends >= 3,
        "{renews} batched, {extends} alone"
    );
    g.release().await.unwrap();
}

/// A hold renewed through a provider's batcher, as the batching backends renew; counting the
/// renewals sent alone (`extend`) in `alone`.
#[derive(Debug)]
struct Batched {
    renewals: Arc<dlock_core::backend::Batcher<(), ()>>,
    alone: Arc<AtomicUsize>,
}

#[async_trait]
impl Hold for Batched {
    async fn release(&self) -> Result<()> {
        Ok(())
    }

    async fn extend(&self, _ttl: Duration) -> Result<()> {
        self.alone.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn renew(&self, ttl: Duration) -> Result<()> {
        let window = dlock_core::backend::renewal_window(ttl);
        self.renewals.call((), window).await
    }

    fn renews_in_batches(&self) -> bool {
        true
    }
}

impl Batched {
    /// A guard with the default watchdog lease on a hold renewed through `renewals`, counting
    /// its renewals alone in `alone`.
    fn guard(
        renewals: &Arc<dlock_core::backend::Batcher<(), ()>>,
        alone: &Arc<AtomicUsize>,
    ) -> LockGuard {
        LockGuard::new(NewHold::new(
            "fake",
            LockKind::Mutex,
            LockName::new("fake").unwrap(),
            FencingToken::new(1),
            Lease::default(),
            Instant::now(),
            Arc::new(Self {
                renewals: Arc::clone(renewals),
                alone: Arc::clone(alone),
            }),
        ))
    }
}

/// Waits until `done` holds, looking every 10 ms, for at most `limit` (of the test's paused
/// clock, which each look moves on, firing the timers due on the way in order).
async fn polled(limit: Duration, what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(limit, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"));
}

/// Asserts every guard still held, and releases it.
async fn all_held_then_released(guards: Vec<LockGuard>) {
    for g in guards {
        assert!(g.is_held(), "{:?}", g.loss_reason());
        g.release().await.unwrap();
    }
}

/// Holds of one provider taken at different moments of a renewal period (the default 30 s
/// watchdog, granted 1.3 s apart, further apart than a batch's window) renew on common beats:
/// their first renewals on at most two beats of half a period (two or three batches where
/// each would go alone), then one batch a period, not one per hold.
#[tokio::test(start_paused = true)]
async fn holds_taken_apart_renew_in_one_batch_a_period() {
    let renewals = Arc::new(dlock_core::backend::Batcher::new(
        "fake",
        |items: Vec<()>| async move { items.into_iter().map(|_| Ok(())).collect() },
    ));
    // The clock is paused: each `sleep` below moves it on to its end, firing every timer
    // due on the way in order; nothing waits on real time or hopes for an event.
    let mut guards = Vec::new();
    for _ in 0..8 {
        guards.push(Batched::guard(&renewals, &Arc::default()));
        tokio::time::sleep(Duration::from_millis(1_300)).await;
    }
    // Every hold has renewed by a period after the last grant (the first ones twice); the
    // first renewals went in two or three batches, where alone they would be eight.
    tokio::time::sleep(Duration::from_millis(10_200)).await;
    let first = renewals.batches();
    assert!(
        (2..=3).contains(&first),
        "{first} batches of first renewals"
    );
    tokio::time::sleep(Duration::from_millis(4_800)).await;
    let before = renewals.batches();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let batches = renewals.batches() - before;
    assert!(
        (5..=7).contains(&batches),
        "{batches} batches in six renewal periods of eight holds"
    );
    all_held_then_released(guards).await;
}

/// When a provider's batch of renewals fails (a store too busy to answer), its holds try
/// again in batches, not each with a call of its own: a failed batch of 200 holds (the
/// default 30 s watchdog) is retried in a few batches, and no hold goes alone while the store
/// answers again before the last third of its lease.
#[tokio::test(start_paused = true)]
async fn a_failed_batch_is_retried_in_batches() {
    const HOLDS: usize = 200;
    let failing = Arc::new(AtomicUsize::new(2));
    let renewed = Arc::new(AtomicUsize::new(0));
    let renewals = {
        let (failing, renewed) = (Arc::clone(&failing), Arc::clone(&renewed));
        Arc::new(dlock_core::backend::Batcher::new(
            "fake",
            move |items: Vec<()>| {
                // The first two batches fail, each hold's renewal with a retryable error.
                let fail = failing
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                if !fail {
                    renewed.fetch_add(items.len(), Ordering::SeqCst);
                }
                async move {
                    items
                        .into_iter()
                        .map(|()| {
                            if fail {
                                Err(Error::no_answer("fake", "the store is busy"))
                            } else {
                                Ok(())
                            }
                        })
                        .collect()
                }
            },
        ))
    };
    let alone = Arc::new(AtomicUsize::new(0));
    let guards: Vec<LockGuard> = (0..HOLDS)
        .map(|_| Batched::guard(&renewals, &alone))
        .collect();
    // The first renewals fail, their retries too, then the store answers: every hold is
    // renewed within its first lease.
    polled(Duration::from_secs(30), "every hold renewed", || {
        renewed.load(Ordering::SeqCst) >= HOLDS
    })
    .await;
    assert_eq!(
        failing.load(Ordering::SeqCst),
        0,
        "both failing batches went"
    );
    let (batches, alone) = (renewals.batches(), alone.load(Ordering::SeqCst));
    assert_eq!(alone, 0, "{alone} renewals alone");
    // The first batch, its retries (each hold's jittered pause of 25-50 ms, then 50-100 ms,
    // gathered by 1 s windows).
    assert!(
        (3..=8).contains(&batches),
        "{batches} batches for {HOLDS} holds"
    );
    all_held_then_released(guards).await;
}

/// A batch of renewals that hangs (a store that never answers the batch's call) is cut off at
/// the last third of the lease, and the hold renews alone: it is not lost for its batch.
#[tokio::test(start_paused = true)]
async fn a_hanging_batch_is_cut_off_and_the_hold_renews_alone() {
    let renewals = Arc::new(dlock_core::backend::Batcher::new("fake", |_: Vec<()>| {
        std::future::pending::<Vec<Result<()>>>()
    }));
    let alone = Arc::new(AtomicUsize::new(0));
    let g = Batched::guard(&renewals, &alone);
    // Every batch hangs, every renewal goes alone at the last third: two within two leases.
    polled(Duration::from_secs(60), "two renewals alone", || {
        alone.load(Ordering::SeqCst) >= 2
    })
    .await;
    let alone = alone.load(Ordering::SeqCst);
    assert!(alone >= 2, "{alone} renewals alone");
    all_held_then_released(vec![g]).await;
}

/// A hold that renews alone, recording when.
#[derive(Debug, Default)]
struct Alone {
    at: std::sync::Mutex<Vec<Instant>>,
    renewed: Notify,
}

#[async_trait]
impl Hold for Alone {
    async fn release(&self) -> Result<()> {
        Ok(())
    }

    async fn extend(&self, _ttl: Duration) -> Result<()> {
        self.at.lock().unwrap().push(Instant::now());
        self.renewed.notify_one();
        Ok(())
    }
}

/// A hold that renews alone is renewed a third of its lease after its grant and after each
/// renewal, wherever the process's beats fall: a provider's single renewals stay spread as
/// its grants were. (On the beats, both gaps would be a third of the lease only for a grant
/// that fell on a beat of the process's clock.)
#[tokio::test(start_paused = true)]
async fn a_hold_that_renews_alone_renews_a_third_of_its_lease_after_the_last() {
    let hold = Arc::new(Alone::default());
    let granted = Instant::now();
    let g = LockGuard::new(NewHold::new(
        "fake",
        LockKind::Mutex,
        LockName::new("fake").unwrap(),
        FencingToken::new(1),
        Lease::default(),
        granted,
        Arc::clone(&hold) as Arc<dyn Hold>,
    ));
    tokio::time::timeout(Duration::from_secs(25), async {
        while hold.at.lock().unwrap().len() < 2 {
            hold.renewed.notified().await;
        }
    })
    .await
    .expect("two renewals in two periods");
    let at = hold.at.lock().unwrap().clone();
    let period = Duration::from_secs(10);
    let off = |a: Instant, b: Instant| a.max(b) - a.min(b);
    assert!(
        off(at[0], granted + period) < Duration::from_millis(5),
        "{at:?}"
    );
    assert!(
        off(at[1], at[0] + period) < Duration::from_millis(5),
        "{at:?}"
    );
    g.release().await.unwrap();
}

/// Huge durations: extend by `Duration::MAX` is refused, by `Lease::MAX` works; a hold of
/// `Lease::MAX` has a far lease end.
#[tokio::test]
async fn huge_durations_never_panic() {
    let g = guard(Arc::default(), Lease::Fixed(Lease::MAX));
    assert!(g.remaining() > Duration::from_secs(300 * 24 * 3600));
    assert!(matches!(
        g.extend(Duration::MAX).await,
        Err(Error::InvalidArgument { .. })
    ));
    g.extend(Lease::MAX).await.unwrap();
    assert!(g.is_held());
    g.release().await.unwrap();
}

/// A backend whose first grant comes back after its lease ended (a reply delayed past the
/// lease: found by `dlock torture` on Redis as a token granted "backwards"): the handle drops
/// that hold (its store ends it with its lease, which is over) and acquires again, so the
/// caller only ever gets a live guard.
#[tokio::test]
async fn a_grant_lost_on_arrival_is_dropped_and_tried_again() {
    use dlock_core::backend::{HandleInfo, Lock, RawLock, Request};
    use dlock_core::{DistributedLock, LockOptions};

    #[derive(Debug, Default)]
    struct SlowFirstReply {
        calls: AtomicUsize,
    }

    #[async_trait]
    impl RawLock for SlowFirstReply {
        async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let lease = Lease::watchdog(Duration::from_millis(300));
            // The first grant was sent a whole lease ago: lost on arrival.
            let sent = if n == 0 {
                Instant::now().checked_sub(Duration::from_secs(1)).unwrap()
            } else {
                Instant::now()
            };
            let hold = Arc::new(Fake::default());
            Ok(Some(LockGuard::new(NewHold::new(
                "fake",
                LockKind::Mutex,
                req.name.clone(),
                FencingToken::new(n as u64 + 1),
                lease,
                sent,
                hold,
            ))))
        }
    }

    let name = LockName::new("slow-reply").unwrap();
    let info = HandleInfo::new("fake", "fake://", name, LockOptions::default());
    let lock = Lock::new(info, SlowFirstReply::default());
    let g = lock
        .try_acquire(Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert!(g.is_held(), "handed a guard lost on arrival");
    assert_eq!(g.fencing_token().get(), 2, "the second grant");
    assert_eq!(lock.raw().calls.load(Ordering::SeqCst), 2);
    g.release().await.unwrap();
}

/// A timed acquisition whose call to the store hangs returns by its wait plus `CALL_GRACE`,
/// with a retryable connection error: a store that does not answer is not a lock held by
/// someone else.
#[tokio::test]
async fn a_hung_store_call_cannot_outlast_the_wait() {
    use dlock_core::backend::{CALL_GRACE, HandleInfo, Lock, RawLock, Request};
    use dlock_core::{DistributedLock, LockOptions};

    #[derive(Debug)]
    struct Hung;

    #[async_trait]
    impl RawLock for Hung {
        async fn acquire(&self, _req: &Request<'_>) -> Result<Option<LockGuard>> {
            std::future::pending().await
        }
    }

    let info = HandleInfo::new(
        "fake",
        "fake://",
        LockName::new("hung").unwrap(),
        LockOptions::default(),
    );
    let lock = Lock::new(info, Hung);
    let started = Instant::now();
    let got = tokio::time::timeout(CALL_GRACE * 3, lock.try_acquire(Duration::from_millis(100)))
        .await
        .expect("try_acquire(100 ms) outlasted its wait and grace");
    match got {
        Err(e @ Error::Connection { .. }) => {
            assert!(e.is_retryable());
            assert!(e.to_string().contains("no answer"), "{e}");
        }
        other => panic!("a hung store must be an error, not {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(100));
}

/// A store whose every grant arrives after its lease (the lease is shorter than the round
/// trip): `acquire()` says so with an error instead of retrying for ever.
#[tokio::test]
async fn grants_that_always_arrive_dead_end_in_an_error() {
    use dlock_core::backend::{HandleInfo, Lock, RawLock, Request};
    use dlock_core::{DistributedLock, LockOptions};

    #[derive(Debug, Default)]
    struct AlwaysLate(AtomicUsize);

    #[async_trait]
    impl RawLock for AlwaysLate {
        async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(Some(LockGuard::new(NewHold::new(
                "fake",
                LockKind::Mutex,
                req.name.clone(),
                FencingToken::new(1),
                Lease::watchdog(Duration::from_millis(100)),
                Instant::now().checked_sub(Duration::from_secs(1)).unwrap(),
                Arc::new(Fake::default()),
            ))))
        }
    }

    let info = HandleInfo::new(
        "fake",
        "fake://",
        LockName::new("late").unwrap(),
        LockOptions::default(),
    );
    let lock = Lock::new(info, AlwaysLate::default());
    let got = tokio::time::timeout(Duration::from_secs(10), lock.acquire())
        .await
        .expect("acquire() kept retrying grants that arrive dead");
    let e = got.expect_err("a guard lost on arrival");
    assert!(e.to_string().contains("round trip"), "{e}");
    assert_eq!(lock.raw().0.load(Ordering::SeqCst), 5);
}

/// A fixed lease whose end the guard notices before its keeper does (`is_held()` or `lost()`
/// wins the race at the lease end) is still cleaned up on the store: a backend without a
/// server-side lease (ZooKeeper) would otherwise keep the node until its session ends. It used
/// to be left behind whenever the guard saw the end first.
#[test]
fn a_lease_end_seen_by_the_guard_first_still_cleans_up() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let hold = Arc::new(Fake::default());
        let g = guard(Arc::clone(&hold), Lease::Fixed(Duration::from_millis(50)));
        tokio::task::yield_now().await;
        // The stall under test: the keeper cannot run while the thread sleeps past the lease
        // end, so the guard's own check sees the end first.
        std::thread::sleep(Duration::from_millis(80));
        assert!(!g.is_held());
        assert_eq!(g.loss_reason(), Some(LossReason::FixedLeaseEnded));
        let deadline = dlock_core::backend::from_now(Duration::from_secs(5));
        while hold.releases.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "the hold was never released on the store after its fixed lease ended"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(g);
    });
}

/// A hold released before its first renewal is due costs no task: its keeper waits in the
/// runtime's starter, which spawns it only a sixth of the lease after the grant (a keeper
/// spawned at the grant and aborted at the release would cost two wake-ups of a worker
/// thread per lock cycle).
#[tokio::test]
async fn holds_released_before_their_first_renewal_cost_no_task() -> Result<()> {
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    // The runtime's starter, spawned with its first hold.
    guard(Arc::default(), Lease::default()).release().await?;
    let before = tasks();
    let guards: Vec<_> = (0..100)
        .map(|_| guard(Arc::default(), Lease::default()))
        .collect();
    tokio::task::yield_now().await;
    assert!(
        tasks() <= before,
        "{} tasks for 100 holds waiting for their first renewal",
        tasks().saturating_sub(before)
    );
    for g in guards {
        g.release().await?;
    }
    Ok(())
}

/// Each runtime's holds are kept by that runtime: a hold on one runtime keeps being renewed
/// while another runtime, whose starter exists, is not driven.
#[test]
fn a_runtime_keeps_its_own_holds_while_another_one_idles() -> Result<()> {
    let (idle, busy) = (current_thread()?, current_thread()?);
    let lease = Lease::watchdog(Duration::from_millis(300));
    let parked = idle.block_on(async { guard(Arc::default(), lease) });
    busy.block_on(async {
        let hold = Arc::new(Fake::default());
        let g = guard(Arc::clone(&hold), lease);
        tokio::time::timeout(Duration::from_secs(1), g.lost())
            .await
            .expect_err("the hold was kept past three leases");
        assert!(
            hold.extends.load(Ordering::SeqCst) >= 3,
            "renewed every 100 ms"
        );
        g.release().await
    })?;
    drop(parked);
    Ok(())
}

/// A fixed lease shortened by `extend` before its keeper started ends at its new end: the
/// keeper starts with the extension, marks the hold lost then and cleans up on the store
/// (it would otherwise wait for its start, a sixth of the original lease in).
#[tokio::test(start_paused = true)]
async fn a_shortened_fixed_lease_ends_and_cleans_up_at_its_new_end() -> Result<()> {
    let hold = Arc::new(Fake::default());
    let g = guard(Arc::clone(&hold), Lease::Fixed(Duration::from_secs(60)));
    g.extend(Duration::from_secs(1)).await?;
    tokio::time::timeout(Duration::from_millis(1500), g.lost())
        .await
        .map_err(|_| Error::config("not lost at the new end"))?;
    tokio::time::timeout(Duration::from_millis(500), hold.released.notified())
        .await
        .map_err(|_| Error::config("the store was not cleaned up at the new end"))?;
    assert_eq!(hold.releases.load(Ordering::SeqCst), 1);
    assert_eq!(g.loss_reason(), Some(LossReason::FixedLeaseEnded));
    Ok(())
}

/// A hold lost before its keeper started (the runtime stalled past the lease end), then
/// released: the release cleans up on the store, as the keeper would have.
#[test]
fn a_loss_no_keeper_saw_is_cleaned_up_at_the_release() -> Result<()> {
    let rt = current_thread()?;
    rt.block_on(async {
        let hold = Arc::new(Fake::default());
        // Its keeper would start 100 ms in.
        let g = guard(Arc::clone(&hold), Lease::Fixed(Duration::from_millis(600)));
        tokio::task::yield_now().await;
        // The stall under test: nothing runs while the thread sleeps past the lease end.
        std::thread::sleep(Duration::from_millis(650));
        assert!(!g.is_held());
        let released = g.release().await;
        assert!(
            matches!(released, Err(Error::LockLost { .. })),
            "got {released:?}"
        );
        assert_eq!(
            hold.releases.load(Ordering::SeqCst),
            1,
            "the release cleaned up on the store"
        );
    });
    Ok(())
}

/// Holds waiting in a starter that ran report `KeeperStopped` when its runtime is dropped.
#[test]
fn holds_waiting_for_their_keeper_report_the_loss_when_the_runtime_ends() -> Result<()> {
    let rt = current_thread()?;
    let g = rt.block_on(async {
        let g = guard(Arc::default(), Lease::default());
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        g
    });
    assert!(g.is_held());
    drop(rt);
    assert_eq!(g.loss_reason(), Some(LossReason::KeeperStopped));
    Ok(())
}
