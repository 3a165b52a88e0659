//! Reentrancy: the owner of a hold is the task that took it through a handle; tasks that
//! share a handle exclude each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_core::LockOptions;

use super::{
    Need, REENTRANT_LOCKS, ZERO, acquired, assert_busy, caps, client, clients, clients_if, is_free,
    lock, lock_with, named_clients_if, release, take,
};
use crate::Factory;
use crate::support::{Names, must};

/// A handle built `reentrant(true)`.
fn reentrant() -> LockOptions {
    LockOptions::new().with_reentrant(true)
}

/// The owner re-acquires at once and gets the same token.
pub async fn reentrant_acquire_returns_same_token(f: &impl Factory) {
    let Some([a]) = clients_if(f, REENTRANT_LOCKS).await else {
        return;
    };
    let l = lock_with(&a, &Names::new().name("re"), reentrant());
    let g1 = take(f, &l).await;
    let g2 = acquired(f.slack(), "re-entry", l.acquire()).await;
    let g3 = l
        .try_acquire(ZERO)
        .await
        .unwrap()
        .expect("re-entry with zero wait");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    assert_eq!(g1.fencing_token(), g3.fencing_token());
    release(g3).await;
    release(g2).await;
    release(g1).await;
}

/// The lock is free for others only when the owner's last guard is released.
pub async fn reentrant_lock_freed_by_last_guard(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, REENTRANT_LOCKS, "count").await else {
        return;
    };
    let l = lock_with(&a, &name, reentrant());
    let other = lock(&b, &name);
    let g1 = take(f, &l).await;
    let g2 = take(f, &l).await;
    release(g1).await;
    assert_busy(&other, "the owner still has one guard").await;
    assert!(g2.is_held());
    release(g2).await;
    assert!(is_free(f, &b, &name).await, "free after the last guard");
}

/// Tasks that share one handle (an `Arc`, as they would a `tokio::sync::Mutex`) exclude each
/// other: eight tasks acquire it at once and at most one is inside at a time. Within its own
/// task a holder still re-enters, with the same token (where the backend is reentrant).
pub async fn tasks_sharing_a_handle_exclude_each_other(f: &impl Factory) {
    let a = client(f).await;
    let reentrant = caps(&a).reentrant;
    let options = LockOptions::new().with_reentrant(reentrant);
    let l = lock_with(&a, &Names::new().name("shared"), options);
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks = (0..8).map(|_| {
        let (l, inside, most) = (Arc::clone(&l), Arc::clone(&inside), Arc::clone(&most));
        tokio::spawn(async move {
            let g = l.acquire().await.unwrap_or_else(|e| panic!("acquire: {e}"));
            let again = if reentrant {
                let again = l
                    .try_acquire(ZERO)
                    .await
                    .unwrap_or_else(|e| panic!("re-entry: {e}"))
                    .expect("the holder's own task re-enters");
                assert_eq!(again.fencing_token(), g.fencing_token(), "re-entry token");
                Some(again)
            } else {
                None
            };
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            if let Some(again) = again {
                release(again).await;
            }
            release(g).await;
        })
    });
    let done = must(
        f.slack() * 8,
        "eight tasks of one handle, one after the other",
        futures::future::join_all(tasks),
    )
    .await;
    for r in done {
        r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "tasks that share one handle were inside the lock together"
    );
}

/// A guard's explicit re-entry hands the hold to another task: same token, and nobody else
/// gets in until both guards are released; a clone of the handle in a third task waits
/// for them like anyone else.
pub async fn explicit_reentry_hands_the_hold_to_another_task(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("handed");
    let l = lock(&a, &name);
    let g = take(f, &l).await;
    let handed = g.reenter().unwrap_or_else(|e| panic!("reenter: {e}"));
    assert_eq!(handed.fencing_token(), g.fencing_token());
    let clone = Arc::clone(&l);
    let waited = tokio::spawn(async move {
        // A store that must open a connection for the wait (the connection-bound SQL
        // strategies) may not open it within the wait on a loaded machine: that is a
        // retryable error, not an answer, and the wait is tried again.
        let mut tries = 0;
        loop {
            tries += 1;
            match clone.try_acquire(Duration::from_millis(200)).await {
                Err(e) if e.is_retryable() && tries < 3 => {}
                result => break result.map(|g| g.is_some()),
            }
        }
    });
    let waited = must(f.slack() * 3, "a clone's wait in another task", waited)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .unwrap_or_else(|e| panic!("try_acquire: {e}"));
    assert!(
        !waited,
        "a clone in another task got the lock its sibling holds"
    );
    let token = must(
        f.slack(),
        "the handed guard's release in another task",
        tokio::spawn(async move {
            let t = handed.fencing_token();
            release(handed).await;
            t
        }),
    )
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    assert_eq!(token, g.fencing_token());
    assert!(g.is_held(), "the first guard still holds");
    assert_busy(&lock(&b, &name), "one guard of the hold is left").await;
    release(g).await;
    assert!(is_free(f, &b, &name).await, "free after both guards");
}

/// `reentrant(false)`: the same handle waits for itself.
pub async fn non_reentrant_waits_for_itself(f: &impl Factory) {
    let Some([a]) = clients_if(f, Need(|c| c.non_reentrant, "no non-reentrant locks")).await else {
        return;
    };
    let not_reentrant = LockOptions::new().with_reentrant(false);
    let l = lock_with(&a, &Names::new().name("nr"), not_reentrant);
    let g = take(f, &l).await;
    let second = l.try_acquire(Duration::from_millis(200)).await.unwrap();
    assert!(second.is_none(), "a non-reentrant lock must not re-enter");
    release(g).await;
    release(take(f, &l).await).await;
}
