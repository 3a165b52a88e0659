//! Time: a lease runs from the grant, and no duration, however large, makes anything panic.

use std::time::Duration;

use dlock_core::backend::later;
use dlock_core::{Error, Lease, LockOptions, LossReason, MultiLock};
use tokio::time::Instant;

use super::{
    ZERO, assert_busy, caps, client, fixed, lock, lock_with, release, residue_is, rw, sem,
    short_watchdog, take, unsupported, until_free,
};
use crate::Factory;
use crate::support::{Names, StallProbe, StoreProbe, must};

/// A waiter that waited twice its own (watchdog) lease before the holder let go holds a live
/// lock: held on arrival, and kept by its watchdog for three more leases.
pub async fn waiter_longer_than_its_lease_keeps_it(f: &impl Factory) {
    let (a, b, c) = (client(f).await, client(f).await, client(f).await);
    if !caps(&a).watchdog {
        return unsupported(f, "no watchdog leases");
    }
    let name = Names::new().name("long-wait");
    let lease = f.short_lease();
    let holder = take(f, &lock(&a, &name)).await;
    let lb = lock_with(&b, &name, short_watchdog(f));
    let mut waiter = tokio::spawn(async move { lb.acquire().await });
    let early = tokio::time::timeout(lease * 2, &mut waiter).await;
    assert!(early.is_err(), "the waiter did not wait: {early:?}");
    // From here the waiter's watchdog must keep a live hold: a runtime stalled for most of the
    // lease loses it, as it should (see `watchdog_keeps_hold_past_three_ttls`).
    let probe = StallProbe::start();
    release(holder).await;
    let g = must(f.slack(), "the waiter after the release", waiter)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .unwrap_or_else(|e| panic!("acquire: {e}"));
    let what = "waiter_longer_than_its_lease_keeps_it";
    assert!(
        g.is_held(),
        "lost on arrival ({:?}): the lease was counted from the start of the wait",
        g.loss_reason()
    );
    let store = StoreProbe::start(lock(&c, &name));
    let lost = tokio::time::timeout(lease * 3, g.lost()).await;
    if lost.is_ok()
        && (probe.explains_a_loss(what, lease, g.loss_reason())
            || store.explains_a_loss(what, lease, g.loss_reason()))
    {
        return;
    }
    assert!(
        lost.is_err(),
        "lost after the grant although its watchdog runs: {:?} (the runtime stalled {:?} at \
         most; the store answered another client within {:?})",
        g.loss_reason(),
        probe.worst_within(lease * 4),
        store.slowest_within(lease * 4)
    );
    drop(store);
    assert!(g.is_held());
    assert_busy(&lock(&c, &name), "the waiter holds it now").await;
    release(g).await;
}

/// A waiter that waited twice its own fixed lease holds the lock for a whole lease from the
/// grant: exclusive, and lost when that lease ends, not before. Judged by when the loss is
/// seen, which a slow machine only makes later (a stress run saw the guard half a lease
/// after the grant, and "not lost within half a lease of seeing it" ran past its end).
pub async fn waiter_longer_than_its_fixed_lease_keeps_it(f: &impl Factory) {
    let (a, b, c) = (client(f).await, client(f).await, client(f).await);
    if !caps(&a).fixed_lease {
        return unsupported(f, "no fixed leases");
    }
    let name = Names::new().name("long-wait-fixed");
    let lease = f.short_lease();
    let holder = take(f, &lock(&a, &name)).await;
    let lb = lock_with(&b, &name, fixed(f));
    let mut waiter = tokio::spawn(async move { lb.acquire().await });
    let early = tokio::time::timeout(lease * 2, &mut waiter).await;
    assert!(early.is_err(), "the waiter did not wait: {early:?}");
    let releasing = Instant::now();
    release(holder).await;
    let g = must(f.slack(), "the waiter after the release", waiter)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .unwrap_or_else(|e| panic!("acquire: {e}"));
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
        let p = must(
            f.slack(),
            "semaphore try_acquire(MAX)",
            s.try_acquire(Duration::MAX),
        )
        .await
        .unwrap()
        .expect("a free permit");
        release(p).await;
    }
}

/// `try_acquire(Duration::MAX)` on a held lock waits (as `acquire` does) until the holder
/// releases; cancelled meanwhile, it leaves nothing behind.
pub async fn try_acquire_max_on_a_held_lock_waits(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let name = Names::new().name("max-held");
    let holder = take(f, &lock(&a, &name)).await;
    let lb = lock(&b, &name);
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), lb.try_acquire(Duration::MAX)).await;
    assert!(
        cancelled.is_err(),
        "try_acquire(MAX) on a held lock answered: {cancelled:?}"
    );
    residue_is(
        f,
        &name,
        1,
        "only the holder after a cancelled try_acquire(MAX)",
    )
    .await;
    let lb2 = lock(&b, &name);
    let mut waiter = tokio::spawn(async move { lb2.try_acquire(Duration::MAX).await });
    let early = tokio::time::timeout(Duration::from_millis(300), &mut waiter).await;
    assert!(early.is_err(), "try_acquire(MAX) did not wait: {early:?}");
    release(holder).await;
    let g = must(f.slack(), "try_acquire(MAX) after the release", waiter)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .unwrap_or_else(|e| panic!("try_acquire(MAX): {e}"))
        .expect("try_acquire(MAX) waits as long as it takes");
    release(g).await;
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
        let e = a.lock(&name, opts).expect_err("a lease over Lease::MAX");
        assert!(
            matches!(e, Error::InvalidArgument { .. }),
            "{lease:?}: {e:?}"
        );
        if c.read_write {
            let e = a
                .read_write_lock(&name, opts)
                .expect_err("rw: a lease over Lease::MAX");
            assert!(
                matches!(e, Error::InvalidArgument { .. }),
                "{lease:?}: {e:?}"
            );
        }
        if c.semaphore {
            let e = a
                .semaphore(&name, 2, opts)
                .expect_err("semaphore: a lease over Lease::MAX");
            assert!(
                matches!(e, Error::InvalidArgument { .. }),
                "{lease:?}: {e:?}"
            );
        }
    }
    if c.fixed_lease {
        let opts = LockOptions::new().with_lease(Lease::Fixed(Lease::MAX));
        let g = take(f, &lock_with(&a, &name, opts)).await;
        assert!(g.is_held());
        // Vouched for to the lease end on a lease store, to the session's horizon on a
        // session store (ZooKeeper, etcd): either way well ahead, with no overflow.
        assert!(
            g.remaining() > Duration::from_secs(1),
            "remaining {:?}",
            g.remaining()
        );
        release(g).await;
    }
}

/// `extend(Duration::MAX)` is `InvalidArgument` and leaves the hold as it was;
/// `extend(Lease::MAX)` works.
pub async fn extend_by_huge_durations_never_panics(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).fixed_lease {
        return unsupported(f, "no fixed leases");
    }
    // A long lease: a short one could end on a loaded machine before the extends reach the
    // store, and the case is about the arguments, not the lease's end.
    let long = LockOptions::new().with_lease(Lease::Fixed(Duration::from_secs(60)));
    let g = take(f, &lock_with(&a, &Names::new().name("huge-extend"), long)).await;
    let e = g.extend(Duration::MAX).await.expect_err("extend(MAX)");
    assert!(matches!(e, Error::InvalidArgument { .. }), "got {e:?}");
    assert!(g.is_held(), "a refused extend lost the hold");
    g.extend(Lease::MAX)
        .await
        .unwrap_or_else(|e| panic!("extend(Lease::MAX): {e}"));
    assert!(g.is_held(), "extend(Lease::MAX) lost the hold");
    assert!(
        g.remaining() > Duration::from_secs(1),
        "remaining {:?}",
        g.remaining()
    );
    release(g).await;
}

/// A MultiLock's `try_acquire(Duration::MAX)`: the locks when they are free; waits (and leaves
/// nothing when cancelled) when one is held.
pub async fn multilock_with_huge_waits(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
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
