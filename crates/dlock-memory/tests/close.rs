//! `LockProvider::close`: what it does with acquisitions under way, and what it says when its
//! bound cuts the releases off.

use std::time::Duration;

use dlock_conformance::{Names, eventually};
use dlock_core::{Error, LockOptions, LockProvider};
use dlock_memory::MemoryProvider;

/// A fair waiter queued when its provider's close begins ends with `Error::Closed`, and its
/// queue entry is gone when `close` returns (the close ends the wait and waits for its undo):
/// a queue entry left there would keep every later fair waiter out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_under_way_ends_and_leaves_no_queue_entry() {
    let store = Names::new().name("close-wait");
    let (a, b) = (MemoryProvider::named(&store), MemoryProvider::named(&store));
    let fair = LockOptions::new().with_fair(true);
    let holder = b.lock("job", fair).unwrap().acquire().await.unwrap();
    let waiter = a.lock("job", fair).unwrap();
    let waiting = tokio::spawn(async move { waiter.acquire().await.map(|_| ()) });
    eventually(Duration::from_secs(5), "the waiter is queued", || async {
        if b.waiters("job") == 1 {
            Ok(())
        } else {
            Err(b.waiters("job"))
        }
    })
    .await;
    let closed = a.close(Duration::from_secs(5)).await;
    assert!(closed.is_clean(), "{closed:?}");
    assert_eq!(
        b.waiters("job"),
        0,
        "the waiter's queue entry outlived the close"
    );
    let ended = waiting.await.unwrap();
    assert!(matches!(ended, Err(Error::Closed { .. })), "{ended:?}");
    holder.release().await.unwrap();
}

/// A close whose bound runs out before the store answered its releases says so (the holds
/// are unreleased, not clean), and the releases go on in the background: the lock comes free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_cut_off_by_its_bound_says_what_it_left() {
    let store = Names::new().name("close-slow");
    let (a, b) = (MemoryProvider::named(&store), MemoryProvider::named(&store));
    let g = a
        .lock("job", LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    a.set_latency(Duration::from_millis(300));
    let closed = a.close(Duration::from_millis(50)).await;
    assert!(
        !closed.is_clean() && closed.unreleased == 1 && closed.released == 0,
        "{closed:?}"
    );
    assert!(!g.is_held());
    eventually(Duration::from_secs(5), "the release goes on", || async {
        if b.holders("job") == 0 {
            Ok(())
        } else {
            Err(b.holders("job"))
        }
    })
    .await;
    a.set_latency(Duration::ZERO);
}
