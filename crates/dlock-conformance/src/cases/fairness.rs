//! Fairness: a fair lock grants in waiting order, or is refused.

use std::sync::Arc;

use dlock_core::LockOptions;
use futures::future::join_all;

use super::{
    FAIR_LOCKS, ZERO, assert_unsupported, caps, client, lock_with, named_clients_if,
    not_applicable, release, residue_is, take,
};
use crate::Factory;
use crate::support::{Names, must};

/// A fair lock grants 8 waiters in the order they started waiting, and a newcomer cannot
/// barge past them.
pub async fn fair_lock_grants_in_waiting_order(f: &impl Factory) {
    const WAITERS: usize = 8;
    let Some(([a, b], name)) = named_clients_if(f, FAIR_LOCKS, "fair").await else {
        return;
    };
    let opts = LockOptions::new().with_fair(true);
    let holder = take(f, &lock_with(&a, &name, opts)).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    // The first waiter keeps its hold until the newcomer has tried: otherwise, on a loaded
    // machine, all waiters may pass before the newcomer runs, and an empty queue lets anyone in.
    let (go, gate) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let l = lock_with(if i % 2 == 0 { &a } else { &b }, &name, opts);
        let order = Arc::clone(&order);
        let mut gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let g = l.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            gate.wait_for(|open| *open).await.unwrap();
            release(g).await;
        }));
        // The waiting order is set by waiting until each waiter is queued in the store.
        residue_is(f, &name, i + 2, "the waiter is queued").await;
    }
    let newcomer = lock_with(&b, &name, opts);
    release(holder).await;
    // A newcomer may not barge past the queue, even in the instant after a release.
    let barged = newcomer.try_acquire(ZERO).await.unwrap();
    assert!(
        barged.is_none(),
        "a fair lock let a newcomer pass 8 queued waiters"
    );
    go.send_replace(true);
    for t in must(f.slack() * 4, "fair waiters", join_all(tasks)).await {
        t.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "grant order");
}

/// A backend without fairness rejects `fair(true)` instead of pretending.
pub async fn fair_option_rejected_when_unsupported(f: &impl Factory) {
    let a = client(f).await;
    if caps(&a).fair {
        return not_applicable(f, "fair locks are supported");
    }
    let fair = LockOptions::new().with_fair(true);
    let made = a.lock(&Names::new().name("unfair"), fair);
    assert_unsupported(made, "fair(true) must be rejected");
}
