//! Semaphores.

use std::collections::BTreeSet;

use dlock_core::{Capabilities, Error, LockGuard, LockOptions};

use super::{
    Need, SEMAPHORES, ZERO, acquired, assert_not_granted, caps, expiry_wait, granted_within,
    named_clients_if, release, sem, short_watchdog, take_permit,
};
use crate::Factory;
use crate::support::must;

/// At most `permits` holders; a released permit lets the next one in.
pub async fn semaphore_limits_holders(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, SEMAPHORES, "sem").await else {
        return;
    };
    let opts = LockOptions::default();
    let mut held = Vec::new();
    for i in 0..3 {
        let s = sem(if i % 2 == 0 { &a } else { &b }, &name, 3, opts);
        held.push(take_permit(f, &s, "a free permit").await);
    }
    let fourth = sem(&b, &name, 3, opts);
    assert_not_granted(fourth.try_acquire(ZERO).await, "a 4th permit of 3");
    let tokens: BTreeSet<_> = held.iter().map(LockGuard::fencing_token).collect();
    assert_eq!(tokens.len(), 3, "each permit has its own token");
    release(held.pop().unwrap()).await;
    release(take_permit(f, &fourth, "the freed permit").await).await;
    for g in held {
        release(g).await;
    }
}

/// Every acquisition takes a permit, even through the same handle.
pub async fn semaphore_each_acquire_takes_a_permit(f: &impl Factory) {
    let Some(([a], name)) = named_clients_if(f, SEMAPHORES, "sem-same").await else {
        return;
    };
    let s = sem(&a, &name, 2, LockOptions::default());
    let g1 = take_permit(f, &s, "permit 1").await;
    let g2 = take_permit(f, &s, "permit 2").await;
    assert_not_granted(s.try_acquire(ZERO).await, "a 3rd permit of 2");
    release(g1).await;
    release(g2).await;
}

/// A permit whose holder died comes back after its lease.
pub async fn semaphore_permits_of_dead_holders_return(f: &impl Factory) {
    let offered = |c: &Capabilities| c.semaphore && c.watchdog;
    let why = "no semaphores with watchdog leases";
    let Some(([a, b], name)) = named_clients_if(f, Need(offered, why), "sem-dead").await else {
        return;
    };
    let _ = take_permit(f, &sem(&a, &name, 1, short_watchdog(f)), "the permit")
        .await
        .leak();
    let s = sem(&b, &name, 1, LockOptions::default());
    assert_not_granted(s.try_acquire(ZERO).await, "the dead holder's lease runs");
    let g = acquired(expiry_wait(f), "the permit comes back", s.acquire()).await;
    release(g).await;
}

/// One rule for permit counts on every backend: while permits of a semaphore are held, a
/// handle that counts a different number of permits gets `InvalidArgument` (instead of each
/// handle enforcing its own limit); handles that agree go on, and once every permit is back
/// the count may change.
pub async fn semaphore_handles_must_agree_on_permits(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, SEMAPHORES, "sem-count").await else {
        return;
    };
    let opts = LockOptions::default();
    let held = take_permit(f, &sem(&a, &name, 3, opts), "a permit of 3").await;
    for (permits, wait) in [(5, ZERO), (1, ZERO), (5, f.slack())] {
        let other = sem(&b, &name, permits, opts);
        let e = must(
            f.slack() * 2,
            "a disagreeing handle",
            other.try_acquire(wait),
        )
        .await
        .expect_err("a handle with another permit count while permits are held");
        assert!(
            matches!(e, Error::InvalidArgument { .. }),
            "{permits} permits: {e:?}"
        );
    }
    let agreeing = take_permit(f, &sem(&b, &name, 3, opts), "a handle that agrees on 3").await;
    release(agreeing).await;
    release(held).await;
    let five = sem(&b, &name, 5, opts);
    let what = "a free semaphore with a new count once every permit is back";
    release(granted_within(f.slack(), what, five.try_acquire(f.slack())).await).await;
}

/// `available()` counts free permits as the store does: all at first, one fewer per holder
/// (of any handle), one more per release, and a leaked permit whose fixed lease ended counts as
/// free although nobody released it.
pub async fn semaphore_counts_available_permits(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, SEMAPHORES, "sem-available").await else {
        return;
    };
    let s = sem(&a, &name, 3, LockOptions::default());
    let other = sem(&b, &name, 3, LockOptions::default());
    let free = |s: &dlock_core::DynSemaphore| {
        let s = std::sync::Arc::clone(s);
        async move { s.available().await.expect("available()") }
    };
    assert_eq!(free(&s).await, 3, "a fresh semaphore");
    let g1 = take_permit(f, &s, "permit 1").await;
    let g2 = take_permit(f, &other, "permit 2").await;
    assert_eq!(free(&s).await, 1, "two of three taken");
    assert_eq!(free(&other).await, 1, "the same count from another client");
    release(g1).await;
    assert_eq!(free(&s).await, 2, "one returned");
    if caps(&a).fixed_lease {
        let g3 = take_permit(f, &sem(&a, &name, 3, super::fixed(f)), "permit 3").await;
        assert_eq!(free(&s).await, 1);
        // Leaked, as by a crashed holder: nobody releases it, so only the store's own
        // reckoning of the ended lease can make it free.
        g3.leak();
        let limit = f.short_lease() + f.holder_timeout() + f.slack();
        crate::support::eventually(limit, "a leaked permit whose lease ended is free", || {
            let s = std::sync::Arc::clone(&s);
            async move {
                match s.available().await {
                    Ok(2) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        })
        .await;
    }
    release(g2).await;
    assert_eq!(free(&s).await, 3, "all returned");
}
