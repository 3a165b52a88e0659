//! Waiting: bounded waits end on time, unbounded ones end with the lock.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::LockGuard;
use dlock_core::backend::CALL_GRACE;
use futures::future::join_all;
use tokio::time::Instant;

use super::{
    ZERO, acquired, assert_busy, client, clients, contended, joined, lock, release, waiting,
};
use crate::Factory;
use crate::support::{Names, must};

/// `try_acquire(0)` on a held lock answers without waiting.
pub async fn try_acquire_zero_does_not_wait(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("zero");
    let (g, lb) = contended(f, [&a, &b], &name).await;
    // The first try opens the client's connections; the second is one round trip.
    assert_busy(&lb, "it is held").await;
    let started = Instant::now();
    assert_busy(&lb, "it is held").await;
    // Well under the 2 s a call may run past its wait before the handle cuts it off (that
    // cut-off alone would pass a bound of the factory's slack).
    let bound = (f.slack() / 3).min(CALL_GRACE / 2);
    assert!(
        started.elapsed() < bound,
        "try_acquire(0) took {:?} (bound {bound:?})",
        started.elapsed()
    );
    release(g).await;
}

/// `try_acquire(0)` on the first use of a name (no row, key or node yet), by 8 clients at
/// once: each answers within the slack, and exactly one wins.
pub async fn try_acquire_zero_on_first_use_is_bounded(f: &impl Factory) {
    let clients: Vec<_> = join_all((0..4).map(|_| client(f))).await;
    let name = Names::new().name("first-use");
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let tries = (0..8).map(|i| {
        let l = lock(&clients[i % clients.len()], &name);
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move {
            barrier.wait().await;
            let started = Instant::now();
            let r = l.try_acquire(ZERO).await;
            (r, started.elapsed())
        })
    });
    let results = must(f.slack() * 3, "first-use try_acquire(0)", join_all(tries)).await;
    let mut guards: Vec<LockGuard> = Vec::new();
    for r in results {
        let (r, took) = r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        assert!(
            took < f.slack(),
            "try_acquire(0) on first use took {took:?}"
        );
        match r {
            Ok(Some(g)) => guards.push(g),
            Ok(None) => {}
            Err(e) => panic!("try_acquire(0) on first use failed: {e}"),
        }
    }
    assert_eq!(
        guards.len(),
        1,
        "exactly one of 8 racers wins a free lock on its first use"
    );
    for g in guards {
        release(g).await;
    }
}

/// `try_acquire(wait)` on a held lock returns `None` after about `wait`, no later than
/// `wait` plus the slack.
pub async fn try_acquire_returns_within_wait(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("bounded");
    let (g, lb) = contended(f, [&a, &b], &name).await;
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let r = must(wait + f.slack(), "try_acquire(300ms)", lb.try_acquire(wait)).await;
    let took = started.elapsed();
    assert!(matches!(r, Ok(None)), "expected Ok(None), got {r:?}");
    assert!(
        took + Duration::from_millis(5) >= wait,
        "gave up early, after {took:?}"
    );
    release(g).await;
}

/// A waiter waits while the lock is held (it is still pending 300 ms later) and gets the lock
/// once the holder releases it.
pub async fn waiter_gets_lock_after_release(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("handoff");
    let (g, lb) = contended(f, [&a, &b], &name).await;
    let why = "the waiter must wait while the lock is held";
    let wait = async move { lb.acquire().await };
    let waiter = waiting(Duration::from_millis(300), why, wait).await;
    release(g).await;
    let g2 = acquired(f.slack(), "waiter after release", joined(waiter)).await;
    assert!(g2.is_held());
    release(g2).await;
}
