//! Reentrancy: the handle (and its clones) is the owner.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::LockOptions;

use super::{
    ZERO, assert_busy, caps, client, is_free, lock, lock_with, release, take, unsupported,
};
use crate::Factory;
use crate::support::{Names, must};

/// The owner re-acquires at once and gets the same token.
pub async fn reentrant_acquire_returns_same_token(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).reentrant {
        return unsupported(f, "no reentrant locks");
    }
    let l = lock(&a, &Names::new().name("re"));
    let g1 = take(f, &l).await;
    let g2 = must(f.slack(), "re-entry", l.acquire()).await.unwrap();
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
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).reentrant {
        return unsupported(f, "no reentrant locks");
    }
    let name = Names::new().name("count");
    let l = lock(&a, &name);
    let other = lock(&b, &name);
    let g1 = take(f, &l).await;
    let g2 = take(f, &l).await;
    release(g1).await;
    assert_busy(&other, "the owner still has one guard").await;
    assert!(g2.is_held());
    release(g2).await;
    assert!(is_free(f, &b, &name).await, "free after the last guard");
}

/// Clones of a handle are one owner: a clone in another task re-enters.
pub async fn clones_share_the_owner(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).reentrant {
        return unsupported(f, "no reentrant locks");
    }
    let l = lock(&a, &Names::new().name("clone"));
    let g = take(f, &l).await;
    let clone = Arc::clone(&l);
    let token = must(
        f.slack(),
        "re-entry through a clone in another task",
        tokio::spawn(async move {
            let g = clone.acquire().await.unwrap();
            let t = g.fencing_token();
            release(g).await;
            t
        }),
    )
    .await
    .unwrap();
    assert_eq!(token, g.fencing_token());
    assert!(g.is_held());
    release(g).await;
}

/// Two tasks of one handle acquire a free lock at the same moment: one goes to the store, the
/// other re-enters its hold (same token); nobody else gets in until both released.
pub async fn concurrent_first_acquires_of_one_handle_share_the_hold(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).reentrant {
        return unsupported(f, "no reentrant locks");
    }
    let name = Names::new().name("twins");
    let l = lock(&a, &name);
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let tasks = (0..2).map(|_| {
        let (l, barrier) = (Arc::clone(&l), Arc::clone(&barrier));
        tokio::spawn(async move {
            barrier.wait().await;
            l.acquire().await
        })
    });
    let results = must(
        f.slack() * 2,
        "two tasks of one handle",
        futures::future::join_all(tasks),
    )
    .await;
    let guards: Vec<_> = results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
                .unwrap_or_else(|e| panic!("acquire: {e}"))
        })
        .collect();
    assert_eq!(
        guards[0].fencing_token(),
        guards[1].fencing_token(),
        "the second task re-entered the first one's hold"
    );
    let other = lock(&b, &name);
    let mut guards = guards.into_iter();
    let first = guards.next().unwrap();
    let second = guards.next().unwrap();
    release(first).await;
    assert_busy(&other, "the handle's second guard still holds it").await;
    release(second).await;
    assert!(is_free(f, &b, &name).await, "free after both guards");
}

/// `reentrant(false)`: the same handle waits for itself.
pub async fn non_reentrant_waits_for_itself(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).non_reentrant {
        return unsupported(f, "no non-reentrant locks");
    }
    let l = lock_with(
        &a,
        &Names::new().name("nr"),
        LockOptions::new().with_reentrant(false),
    );
    let g = take(f, &l).await;
    let second = l.try_acquire(Duration::from_millis(200)).await.unwrap();
    assert!(second.is_none(), "a non-reentrant lock must not re-enter");
    release(g).await;
    release(take(f, &l).await).await;
}
