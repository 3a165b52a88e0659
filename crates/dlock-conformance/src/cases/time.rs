//! Time: a lease runs from the grant, and no duration, however large, makes anything panic.

use std::time::Duration;

use dlock_core::backend::later;
use dlock_core::{DynLockProvider, Error, Lease, LockGuard, LockOptions, LossReason, MultiLock};
use tokio::time::Instant;

use super::{
    FIXED_LEASES, WATCHDOG_LEASES, WatchdogProbes, ZERO, acquired, assert_busy, caps, client,
    clients, clients_if, contended, fixed, granted_within, joined, lock, lock_with,
    named_clients_if, refusals, release, residue_is, rw, sem, short_watchdog, take, until_free,
    waiting,
};
use crate::Factory;
use crate::support::{Names, StallProbe, must};

/// A hold granted after a long wait: a lock held through the first client, and a waiter for it
/// through the second, with `options` (a lease of the factory's short lease), that must still
/// wait after twice that lease; then `at_release` is called, the holder releases, and the
/// waiter must get the lock within the slack. The waiter's guard, and what `at_release` gave.
async fn after_a_long_wait<T>(
    f: &impl Factory,
    [a, b]: [&DynLockProvider; 2],
    name: &str,
    options: LockOptions,
    at_release: impl FnOnce() -> T,
) -> (LockGuard, T) {
    let holder = take(f, &lock(a, name)).await;
    let lb = lock_with(b, name, options);
    let wait = async move { lb.acquire().await };
    let waiter = waiting(f.short_lease() * 2, "the waiter did not wait", wait).await;
    let at = at_release();
    release(holder).await;
    let g = acquired(f.slack(), "the waiter after the release", joined(waiter)).await;
    (g, at)
}

/// A waiter that waited twice its own (watchdog) lease before the holder let go holds a live
/// lock: held on arrival, and kept by its watchdog for three more leases.
pub async fn waiter_longer_than_its_lease_keeps_it(f: &impl Factory) {
    let Some(([a, b, c], name)) = named_clients_if(f, WATCHDOG_LEASES, "long-wait").await else {
        return;
    };
    // The stall probe starts at the release: from there the waiter's watchdog must keep a live
    // hold, and a runtime stalled for most of the lease loses it, as it should (see
    // `watchdog_keeps_hold_past_three_ttls`).
    let watchdog = short_watchdog(f);
    let (g, stalls) = after_a_long_wait(f, [&a, &b], &name, watchdog, StallProbe::start).await;
    let what = "waiter_longer_than_its_lease_keeps_it";
    assert!(
        g.is_held(),
        "lost on arrival ({:?}): the lease was counted from the start of the wait",
        g.loss_reason()
    );
    let lease = f.short_lease();
    let probes = WatchdogProbes::new(what, lease, stalls, lock(&c, &name));
    let why = "lost after the grant although its watchdog runs";
    if !probes.kept(&g, lease * 3, lease * 4, why).await {
        return;
    }
    drop(probes.store);
    assert!(g.is_held());
    assert_busy(&lock(&c, &name), "the waiter holds it now").await;
    release(g).await;
}

/// A waiter that waited twice its own fixed lease holds the lock for a whole lease from the
/// grant: exclusive, and lost when that lease ends, not before. Judged by when the loss is
/// seen, which a slow machine only makes later (a stress run saw the guard half a lease
/// after the grant, and "not lost within half a lease of seeing it" ran past its end).
pub async fn waiter_longer_than_its_fixed_lease_keeps_it(f: &impl Factory) {
    let Some(([a, b, c], name)) = named_clients_if(f, FIXED_LEASES, "long-wait-fixed").await else {
        return;
    };
    let (g, releasing) = after_a_long_wait(f, [&a, &b], &name, fixed(f), Instant::now).await;
    let lease = f.short_lease();
    if g.remaining() > lease / 2 {
        assert_busy(&lock(&c, &name), "the fixed lease runs").await;
    }
    must(lease + f.slack(), "the fixed lease ends", g.lost()).await;
    // A lease counted from the start of the wait would have ended two leases before the
    // release; one counted from the grant ends a lease after it. Half a lease of margin: the
    // request the store granted may have been sent just before the release began.
    let lost_at = Instant::now();
    assert!(
        lost_at >= later(releasing, lease / 2),
        "lost {:?} after the release began: the lease was not counted from the grant",
        lost_at - releasing
    );
    assert_eq!(g.loss_reason(), Some(LossReason::FixedLeaseEnded));
}

/// `try_acquire(Duration::MAX)` on a free lock, read-write lock and semaphore: the lock, no
/// panic.
pub async fn try_acquire_max_on_a_free_lock(f: &impl Factory) {
    let a = client(f).await;
    let c = caps(&a);
    let names = Names::new();
    let g = must(
        f.slack(),
        "try_acquire(MAX) on a free lock",
        lock(&a, &names.name("max")).try_acquire(Duration::MAX),
    )
    .await
    .unwrap_or_else(|e| panic!("try_acquire(MAX): {e}"))
    .expect("a free lock");
    release(g).await;
    if c.read_write {
        let l = rw(&a, &names.name("max-rw"));
        let r = must(f.slack(), "try_read(MAX)", l.try_read(Duration::MAX))
            .await
            .unwrap()
            .expect("a free read lock");
        release(r).await;
        let w = must(f.slack(), "try_write(MAX)", l.try_write(Duration::MAX))
            .await
            .unwrap()
            .expect("a free write lock");
        release(w).await;
    }
    if c.semaphore {
        let s = sem(&a, &names.name("max-sem"), 2, LockOptions::default());
        let what = "semaphore try_acquire(MAX): a free permit";
        release(granted_within(f.slack(), what, s.try_acquire(Duration::MAX)).await).await;
    }
}

/// `try_acquire(Duration::MAX)` on a held lock waits (as `acquire` does) until the holder
/// releases; cancelled meanwhile, it leaves nothing behind.
pub async fn try_acquire_max_on_a_held_lock_waits(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("max-held");
    let (holder, lb) = contended(f, [&a, &b], &name).await;
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), lb.try_acquire(Duration::MAX)).await;
    assert!(
        cancelled.is_err(),
        "try_acquire(MAX) on a held lock answered: {cancelled:?}"
    );
    let what = "only the holder after a cancelled try_acquire(MAX)";
    residue_is(f, &name, 1, what).await;
    let lb2 = lock(&b, &name);
    let wait = async move { lb2.try_acquire(Duration::MAX).await };
    let why = "try_acquire(MAX) did not wait";
    let waiter = waiting(Duration::from_millis(300), why, wait).await;
    release(holder).await;
    let what = "try_acquire(MAX) after the release: it waits as long as it takes";
    release(granted_within(f.slack(), what, joined(waiter)).await).await;
}

/// Asserts that a hold on a huge lease is vouched for well ahead (more than a second), with no
/// overflow: to the lease end on a lease store, to the session's horizon on a session store
/// (ZooKeeper, etcd).
fn assert_vouched_well_ahead(g: &LockGuard) {
    assert!(
        g.remaining() > Duration::from_secs(1),
        "remaining {:?}",
        g.remaining()
    );
}

/// Leases over [`Lease::MAX`] (`Duration::MAX` among them) are `InvalidArgument` for every
/// primitive; a lease of exactly `Lease::MAX` is held.
pub async fn huge_leases_are_invalid_arguments(f: &impl Factory) {
    let a = client(f).await;
    let c = caps(&a);
    let name = Names::new().name("huge-lease");
    let over = Lease::MAX + Duration::from_secs(1);
    for lease in [
        Lease::Fixed(Duration::MAX),
        Lease::watchdog(Duration::MAX),
        Lease::Fixed(over),
        Lease::watchdog(over),
    ] {
        let opts = LockOptions::new().with_lease(lease);
        for e in refusals(&a, &name, opts, "a lease over Lease::MAX") {
            assert!(
                matches!(e, Error::InvalidArgument { .. }),
                "{lease:?}: {e:?}"
            );
        }
    }
    if c.fixed_lease {
        // The longest lease the backend takes: Lease::MAX, or its store's own bound.
        let opts = LockOptions::new().with_lease(Lease::Fixed(c.max_lease));
        let g = take(f, &lock_with(&a, &name, opts)).await;
        assert!(g.is_held());
        assert_vouched_well_ahead(&g);
        release(g).await;
    }
}

/// `extend(Duration::MAX)`, and one past the backend's `max_lease`, are `InvalidArgument`
/// and leave the hold as it was; `extend(max_lease)` works.
pub async fn extend_by_huge_durations_never_panics(f: &impl Factory) {
    let Some([a]) = clients_if(f, FIXED_LEASES).await else {
        return;
    };
    // A long lease: a short one could end on a loaded machine before the extends reach the
    // store, and the case is about the arguments, not the lease's end.
    let long = LockOptions::new().with_lease(Lease::Fixed(Duration::from_secs(60)));
    let g = take(f, &lock_with(&a, &Names::new().name("huge-extend"), long)).await;
    let e = g.extend(Duration::MAX).await.expect_err("extend(MAX)");
    assert!(matches!(e, Error::InvalidArgument { .. }), "got {e:?}");
    assert!(g.is_held(), "a refused extend lost the hold");
    let longest = caps(&a).max_lease;
    if longest < Lease::MAX {
        let e = g
            .extend(longest + Duration::from_secs(1))
            .await
            .expect_err("an extend past the backend's max_lease");
        assert!(matches!(e, Error::InvalidArgument { .. }), "got {e:?}");
        assert!(g.is_held(), "a refused extend lost the hold");
    }
    g.extend(longest)
        .await
        .unwrap_or_else(|e| panic!("extend({longest:?}): {e}"));
    assert!(g.is_held(), "extend(max_lease) lost the hold");
    assert_vouched_well_ahead(&g);
    release(g).await;
}

/// A MultiLock's `try_acquire(Duration::MAX)`: the locks when they are free; waits (and leaves
/// nothing when cancelled) when one is held.
pub async fn multilock_with_huge_waits(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let names = Names::new();
    let (n1, n2) = (names.name("m1"), names.name("m2"));
    let multi = MultiLock::new(vec![lock(&a, &n1), lock(&a, &n2)]).unwrap();
    let all = must(
        f.slack(),
        "MultiLock try_acquire(MAX)",
        multi.try_acquire(Duration::MAX),
    )
    .await
    .unwrap_or_else(|e| panic!("MultiLock try_acquire(MAX): {e}"))
    .expect("both free");
    all.release().await.unwrap();
    let blocker = take(f, &lock(&b, &n2)).await;
    let r =
        tokio::time::timeout(Duration::from_millis(300), multi.try_acquire(Duration::MAX)).await;
    assert!(
        r.is_err(),
        "MultiLock try_acquire(MAX) answered with a member held: {r:?}"
    );
    until_free(
        f,
        &lock(&b, &n1),
        ZERO,
        "the cancelled MultiLock gave m1 back",
    )
    .await;
    release(blocker).await;
}
