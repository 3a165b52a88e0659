//! `LockOptions::lock_delay` (Chubby's lock-delay): a holder cut off from the store is told
//! its hold is lost at least the delay before anyone else can take the name; a release frees
//! it at once. With the default 30 s watchdog lease.

use std::time::Duration;

use dlock_conformance::{Names, must};
use dlock_core::{LockOptions, LockProvider};
use dlock_memory::MemoryProvider;
use tokio::time::Instant;

const DELAY: Duration = Duration::from_secs(5);

/// A holder partitioned from the store: its `lost()` resolves at least `DELAY` before the
/// other client's waiting `acquire()` returns (with no delay the margin is the drift
/// allowance, 305 ms: the test fails then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_is_told_the_delay_before_the_name_passes_on() {
    let store = Names::new().name("lock-delay");
    let (a, b) = (MemoryProvider::named(&store), MemoryProvider::named(&store));
    let opts = LockOptions::default().with_lock_delay(DELAY);
    let g = a.lock("job", opts).unwrap().acquire().await.unwrap();
    let lost = g.lost();
    let told = tokio::spawn(async move {
        lost.await;
        Instant::now()
    });
    let other = b.lock("job", LockOptions::default()).unwrap();
    let waiting = tokio::spawn(async move {
        let g = other.acquire().await;
        (Instant::now(), g)
    });
    a.set_partitioned(true);
    let (granted_at, g2) = must(Duration::from_secs(60), "the other client's grant", waiting)
        .await
        .unwrap();
    let told_at = must(Duration::from_secs(1), "the holder's loss", told)
        .await
        .unwrap();
    assert!(
        granted_at.saturating_duration_since(told_at) >= DELAY,
        "told only {:?} before the name passed on",
        granted_at.saturating_duration_since(told_at)
    );
    assert!(!g.is_held());
    g2.unwrap().release().await.unwrap();
}

/// A release frees the name at once, whatever the delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_frees_the_name_at_once() {
    let store = Names::new().name("lock-delay-release");
    let (a, b) = (MemoryProvider::named(&store), MemoryProvider::named(&store));
    let opts = LockOptions::default().with_lock_delay(DELAY);
    let g = a.lock("job", opts).unwrap().acquire().await.unwrap();
    g.release().await.unwrap();
    let other = b.lock("job", LockOptions::default()).unwrap();
    assert!(
        other.try_acquire(Duration::ZERO).await.unwrap().is_some(),
        "the released name is not free at once"
    );
}

/// A delay that, with the drift allowance, passes half the lease is refused: the hold would
/// be vouched for less than the watchdog's renewal period.
#[tokio::test]
async fn a_delay_past_half_the_lease_is_refused() {
    let p = MemoryProvider::new();
    let opts = LockOptions::default().with_lock_delay(Duration::from_secs(15));
    let e = p.lock("job", opts).unwrap_err();
    assert!(
        e.to_string().contains("lock-delay"),
        "the error says why: {e}"
    );
}
