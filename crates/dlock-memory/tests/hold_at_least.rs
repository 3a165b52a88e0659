//! `LockOptions::hold_at_least` (ShedLock's `lockAtLeastFor`): a release, or the drop of the
//! last guard, that comes before the least time keeps the hold until then.

use std::time::Duration;

use dlock_conformance::Names;
use dlock_core::{Lease, LockOptions, LockProvider, MultiLock};
use dlock_memory::MemoryProvider;
use tokio::time::Instant;

const LEAST: Duration = Duration::from_secs(2);

/// An explicit release right after the grant returns only once the least time is up, and
/// until then another client cannot take the lock; after it, it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_release_keeps_the_hold_for_its_least_time() {
    let store = Names::new().name("hold-at-least");
    let (a, b) = (MemoryProvider::named(&store), MemoryProvider::named(&store));
    let opts = LockOptions::default().with_hold_at_least(LEAST);
    let g = a.lock("job", opts).unwrap().acquire().await.unwrap();
    let granted = Instant::now();
    let releasing = tokio::spawn(g.release());
    let other = b.lock("job", LockOptions::default()).unwrap();
    assert!(
        other.try_acquire(LEAST / 4).await.unwrap().is_none(),
        "taken while the released hold's least time runs"
    );
    releasing.await.unwrap().unwrap();
    assert!(
        granted.elapsed() >= LEAST - Duration::from_millis(50),
        "released {:?} after the grant",
        granted.elapsed()
    );
    let g = other.try_acquire(Duration::from_secs(1)).await.unwrap();
    assert!(g.is_some(), "free after the least time");
}

/// A dropped guard is released in the background once its least time is up, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_keeps_the_hold_for_its_least_time() {
    let store = Names::new().name("hold-at-least-drop");
    let (a, b) = (MemoryProvider::named(&store), MemoryProvider::named(&store));
    let opts = LockOptions::default().with_hold_at_least(LEAST);
    let g = a.lock("job", opts).unwrap().acquire().await.unwrap();
    let granted = Instant::now();
    drop(g);
    let other = b.lock("job", LockOptions::default()).unwrap();
    assert!(other.try_acquire(LEAST / 4).await.unwrap().is_none());
    let g = other.try_acquire(LEAST * 2).await.unwrap();
    assert!(g.is_some(), "never freed");
    assert!(granted.elapsed() >= LEAST - Duration::from_millis(50));
}

/// A hold released after its least time is released at once, as without the option (a
/// least time of a nanosecond is over by the time the grant is handed over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_least_time_is_immediate() {
    let a = MemoryProvider::new();
    let opts = LockOptions::default().with_hold_at_least(Duration::from_nanos(1));
    let lock = a.lock("job", opts).unwrap();
    let g = lock.acquire().await.unwrap();
    let started = Instant::now();
    g.release().await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(100));
}

/// The keeper renews the hold through its least time: a 1 s watchdog lease kept 3 s after
/// an early release, no other client getting it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hold_is_renewed_through_its_least_time() {
    let store = Names::new().name("hold-at-least-renewed");
    let (a, b) = (MemoryProvider::named(&store), MemoryProvider::named(&store));
    let least = Duration::from_secs(3);
    let opts = LockOptions::default()
        .with_lease(Lease::watchdog(Duration::from_secs(1)))
        .with_hold_at_least(least);
    let g = a.lock("job", opts).unwrap().acquire().await.unwrap();
    let granted = Instant::now();
    let releasing = tokio::spawn(g.release());
    let other = b.lock("job", LockOptions::default()).unwrap();
    assert!(
        other.try_acquire(least / 2).await.unwrap().is_none(),
        "the lease ran out during the least time"
    );
    releasing.await.unwrap().unwrap();
    assert!(granted.elapsed() >= least - Duration::from_millis(50));
}

/// A hold lost during its least time ends the wait at once: the release says it was lost.
/// On one thread, the spawned release runs to its wait (it does not return: nothing has
/// ended it yet) before the loss comes.
#[tokio::test]
async fn a_hold_lost_during_its_least_time_ends_the_wait() {
    let store = Names::new().name("hold-at-least-lost");
    let a = MemoryProvider::named(&store);
    let opts = LockOptions::default().with_hold_at_least(Duration::from_secs(30));
    let g = a.lock("job", opts).unwrap().acquire().await.unwrap();
    let lost = g.lost();
    let releasing = tokio::spawn(g.release());
    tokio::task::yield_now().await;
    assert!(
        !releasing.is_finished(),
        "the release did not wait for its least time"
    );
    assert_eq!(a.force_expire("job"), 1);
    let released = tokio::time::timeout(Duration::from_secs(5), releasing)
        .await
        .expect("the release still waited for its least time after the loss")
        .unwrap();
    assert!(
        matches!(released, Err(dlock_core::Error::LockLost { .. })),
        "{released:?}"
    );
    tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .expect("lost() did not resolve");
}

/// `release_now` skips the least time; a fixed lease shorter than it is refused; and holds
/// a MultiLock rolls back (the caller never got them) are released at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_now_rollbacks_and_fixed_leases_keep_no_least_time() {
    let store = Names::new().name("hold-at-least-now");
    let (a, b) = (MemoryProvider::named(&store), MemoryProvider::named(&store));
    let opts = LockOptions::default().with_hold_at_least(Duration::from_secs(30));
    let g = a.lock("now", opts).unwrap().acquire().await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), g.release_now())
        .await
        .expect("release_now waited")
        .unwrap();
    let fixed = opts.with_lease(Lease::Fixed(Duration::from_secs(5)));
    let e = a.lock("fixed", fixed).unwrap_err();
    assert!(
        matches!(e, dlock_core::Error::InvalidArgument { .. }),
        "{e}"
    );
    // The MultiLock takes "m1" (free), then cannot have "m2" (held): "m1" is rolled back at
    // once, not kept 30 s.
    let held = b
        .lock("m2", LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let multi = MultiLock::new(vec![
        a.lock("m1", opts).unwrap(),
        a.lock("m2", opts).unwrap(),
    ])
    .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), multi.try_acquire(Duration::ZERO))
        .await
        .expect("the rollback kept its least time")
        .unwrap();
    assert!(got.is_none());
    let m1 = b.lock("m1", LockOptions::default()).unwrap();
    assert!(
        m1.try_acquire(Duration::from_secs(1))
            .await
            .unwrap()
            .is_some()
    );
    held.release().await.unwrap();
}
