//! Who owns a hold on the reference backend: tasks that share a handle exclude each other,
//! the writer can read (downgrade) even on a fair lock with writers queued, and kinds on one
//! name exclude each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use dlock_core::{LockOptions, LockProvider};
use dlock_memory::MemoryProvider;

/// Eight tasks share one handle through an `Arc`, as they would a `tokio::sync::Mutex`: at
/// most one is inside at a time, and a task of a reentrant handle re-enters its own hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_sharing_one_handle_exclude_each_other() {
    let locks = MemoryProvider::new();
    let reentrant = LockOptions::new().with_reentrant(true);
    let lock = locks.lock("orders/42", reentrant).unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (lock, inside, most) = (Arc::clone(&lock), Arc::clone(&inside), Arc::clone(&most));
            tokio::spawn(async move {
                let g = lock.acquire().await.unwrap();
                // Re-entry within the task still works, with the same token.
                let again = lock.try_acquire(Duration::ZERO).await.unwrap().unwrap();
                assert_eq!(again.fencing_token(), g.fencing_token());
                let n = inside.fetch_add(1, SeqCst) + 1;
                most.fetch_max(n, SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                inside.fetch_sub(1, SeqCst);
                again.release().await.unwrap();
                g.release().await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        most.load(SeqCst),
        1,
        "tasks of one handle were inside together"
    );
}

/// The owner of a fair write lock reads (downgrades) although a fair writer is queued behind
/// it: that writer waits for this very write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_downgrade_is_not_queued_behind_a_waiting_writer() {
    let p = MemoryProvider::new();
    let fair = LockOptions::new().with_fair(true);
    let mine = p.read_write_lock("doc", fair).unwrap();
    let other = p.read_write_lock("doc", fair).unwrap();
    let w = mine.write().await.unwrap();
    let queued = tokio::spawn(async move { other.write().await });
    while p.waiters("doc") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = mine.try_read(Duration::from_secs(2)).await.unwrap();
    assert!(
        r.is_some(),
        "the fair downgrade waited behind a queued writer"
    );
    drop(w);
    drop(r);
    queued.await.unwrap().unwrap().release().await.unwrap();
}

/// A sibling task's read makes a writer of the same handle wait (it is no deadlock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sibling_tasks_read_makes_a_writer_wait() {
    let p = MemoryProvider::new();
    let rw = p.read_write_lock("doc", LockOptions::default()).unwrap();
    let r = rw.read().await.unwrap();
    let sibling = Arc::clone(&rw);
    let w = tokio::spawn(async move { sibling.try_write(Duration::from_millis(100)).await })
        .await
        .unwrap();
    assert!(matches!(w, Ok(None)), "{w:?}");
    let writer = {
        let rw = Arc::clone(&rw);
        tokio::spawn(async move { rw.write().await })
    };
    r.release().await.unwrap();
    writer.await.unwrap().unwrap().release().await.unwrap();
}

/// A default handle is not reentrant: the task that holds it waits for itself, as with a
/// `tokio::sync::Mutex`, and a dispatcher that hands each guard to a worker waits for that
/// worker before its next acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_handle_does_not_reenter() {
    let locks = MemoryProvider::new();
    let lock = locks.lock("jobs", LockOptions::default()).unwrap();
    let g = lock.acquire().await.unwrap();
    assert!(
        lock.try_acquire(Duration::from_millis(50))
            .await
            .unwrap()
            .is_none(),
        "a default handle re-entered"
    );
    // The worker releases once told to: the dispatcher's next acquire must still be waiting
    // then. `releasing` is set as the worker begins its release: the store frees the lock
    // before the release returns, so "the worker's task has finished" would race with the
    // dispatcher's grant.
    let releasing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (go, told) = tokio::sync::oneshot::channel::<()>();
    let worker = {
        let releasing = Arc::clone(&releasing);
        tokio::spawn(async move {
            told.await.unwrap();
            releasing.store(true, std::sync::atomic::Ordering::SeqCst);
            g.release().await.unwrap();
        })
    };
    let mut next = std::pin::pin!(lock.acquire());
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut next)
            .await
            .is_err(),
        "the dispatcher got in while the worker held the guard"
    );
    go.send(()).unwrap();
    let next = next.await.unwrap();
    assert!(
        releasing.load(std::sync::atomic::Ordering::SeqCst),
        "the dispatcher got in before the worker released"
    );
    worker.await.unwrap();
    next.release().await.unwrap();
}
