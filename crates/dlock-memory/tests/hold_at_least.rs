//! `LockOptions::hold_at_least` (ShedLock's `lockAtLeastFor`): a release, or the drop of the
//! last guard, that comes before the least time keeps the hold until then.

use std::time::Duration;

use dlock_conformance::Names;
use dlock_core::{LockOptions, LockProvider};
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

/// A hold released after its least time is released at once, as without the option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_least_time_is_immediate() {
    let a = MemoryProvider::new();
    let opts = LockOptions::default().with_hold_at_least(Duration::from_millis(100));
    let lock = a.lock("job", opts).unwrap();
    let g = lock.acquire().await.unwrap();
    // Past the least time, by the clock (what is under test is the release that follows).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    g.release().await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(100));
}
