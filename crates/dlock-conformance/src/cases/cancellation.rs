//! Cancellation and drop: a dropped acquire future, or a dropped guard, leaves nothing behind.

use std::time::Duration;

use dlock_core::{Error, LockOptions, LossReason, MultiLock};

use super::{
    FAIR_LOCKS, READ_WRITE_LOCKS, SEMAPHORES, WATCHDOG_LEASES, ZERO, assert_busy, assert_cut_off,
    caps, client, clients, clients_if, contended, cuts, granted_within, lock, lock_with,
    named_clients_if, on_a_runtime_of_its_own, release, residue_is, residue_reaches, rw, sem,
    short_watchdog, take, take_permit, take_read, take_write, until_free,
};
use crate::Factory;
use crate::support::Names;

/// A waiter whose acquire future is dropped leaves no queue entry and never takes the lock.
pub async fn cancelled_waiter_leaves_nothing(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("cancel");
    let (g, lb) = contended(f, [&a, &b], &name).await;
    let r = tokio::time::timeout(Duration::from_millis(100), lb.acquire()).await;
    assert!(r.is_err(), "the waiter should still be waiting");
    residue_is(f, &name, 1, "only the holder is left").await;
    release(g).await;
    residue_is(f, &name, 0, "nothing is left after release").await;
    let lc = lock(&a, &name);
    let g = take(f, &lc).await;
    assert_busy(&lb, "the cancelled waiter must not hold anything").await;
    release(g).await;
}

/// Acquire futures dropped at many different moments (free and held lock) leave nothing
/// behind: the lock ends up free and the store empty.
pub async fn cancel_at_every_point_leaves_nothing(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("cancel-points");
    let la = lock(&a, &name);
    let lb = lock(&b, &name);
    for cut in cuts() {
        // On a free lock: may win, and then the guard is dropped at once.
        let _ = tokio::time::timeout(cut, la.acquire()).await;
        // On a held lock: must lose.
        let g = take(f, &lb).await;
        assert_cut_off(cut, la.acquire(), "acquired a held lock").await;
        release(g).await;
    }
    until_free(f, &lb, ZERO, "free after cancelled acquires").await;
    residue_is(f, &name, 0, "no residue after cancelled acquires").await;
}

/// Fair waiters cancelled while queued, and at many points of their acquisition, leave no
/// queue entry: the queue is back to the holder alone, and a newcomer is not blocked later.
pub async fn cancelled_fair_waiters_leave_nothing(f: &impl Factory) {
    let Some(([a, b, c], name)) = named_clients_if(f, FAIR_LOCKS, "cancel-fair").await else {
        return;
    };
    let opts = LockOptions::new().with_fair(true);
    let holder = take(f, &lock_with(&a, &name, opts)).await;
    residue_is(f, &name, 1, "the holder alone").await;
    let lb = lock_with(&b, &name, opts);
    let queued = {
        let lb = std::sync::Arc::clone(&lb);
        tokio::spawn(async move { lb.acquire().await })
    };
    residue_reaches(f, &name, 2, "the fair waiter is queued").await;
    queued.abort();
    assert!(
        queued.await.is_err_and(|e| e.is_cancelled()),
        "the waiter was cancelled"
    );
    residue_is(f, &name, 1, "the cancelled fair waiter left the queue").await;
    for cut in cuts() {
        assert_cut_off(cut, lb.acquire(), "a fair waiter acquired a held lock").await;
    }
    residue_is(f, &name, 1, "only the holder after cancelled fair waiters").await;
    release(holder).await;
    residue_is(f, &name, 0, "nothing after the release").await;
    let newcomer = lock_with(&c, &name, opts);
    let what = "a newcomer after cancelled fair waiters: no cancelled waiter blocks the queue";
    release(granted_within(f.slack(), what, newcomer.try_acquire(f.slack())).await).await;
}

/// Readers and writers cancelled while a writer holds, and writers cancelled while a reader
/// holds, leave nothing behind.
pub async fn cancelled_readers_and_writers_leave_nothing(f: &impl Factory) {
    let Some(([a, b, c], name)) = named_clients_if(f, READ_WRITE_LOCKS, "cancel-rw").await else {
        return;
    };
    let writer = take_write(f, &rw(&a, &name), "the writer").await;
    let other = rw(&b, &name);
    for cut in cuts() {
        assert_cut_off(cut, other.read(), "a reader got in beside a writer").await;
        assert_cut_off(cut, other.write(), "a writer got in beside a writer").await;
    }
    let what = "only the writer after cancelled readers and writers";
    residue_is(f, &name, 1, what).await;
    release(writer).await;
    residue_is(f, &name, 0, "nothing after the writer's release").await;
    let reader = take_read(f, &rw(&a, &name), "the reader").await;
    for cut in cuts() {
        assert_cut_off(cut, other.write(), "a writer got in beside a reader").await;
    }
    residue_is(f, &name, 1, "only the reader after cancelled writers").await;
    release(reader).await;
    residue_is(f, &name, 0, "nothing after the reader's release").await;
    release(take_write(f, &rw(&c, &name), "nothing blocks a writer now").await).await;
}

/// Semaphore waiters cancelled while every permit is held leave nothing behind and take no
/// permit.
pub async fn cancelled_semaphore_waiters_leave_nothing(f: &impl Factory) {
    let Some(([a, b, c], name)) = named_clients_if(f, SEMAPHORES, "cancel-sem").await else {
        return;
    };
    let opts = LockOptions::default();
    let held = take_permit(f, &sem(&a, &name, 1, opts), "the permit").await;
    let waiter = sem(&b, &name, 1, opts);
    for cut in cuts() {
        assert_cut_off(cut, waiter.acquire(), "a second permit of one").await;
    }
    let what = "only the holder's permit after cancelled waiters";
    residue_is(f, &name, 1, what).await;
    release(held).await;
    residue_is(f, &name, 0, "nothing after the release").await;
    let last = sem(&c, &name, 1, opts);
    let what = "the permit is free: no cancelled waiter took it";
    release(take_permit(f, &last, what).await).await;
}

/// A MultiLock cancelled while it waits for a busy member gives back the members it took.
pub async fn cancelled_multilock_leaves_nothing(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let names = Names::new();
    let (n1, n2) = (names.name("m1"), names.name("m2"));
    let blocker = take(f, &lock(&b, &n2)).await;
    let multi = MultiLock::new(vec![lock(&a, &n1), lock(&a, &n2)]).unwrap();
    for cut in cuts() {
        assert_cut_off(cut, multi.acquire(), "a MultiLock got a held member").await;
    }
    let what = "the cancelled MultiLock gave its first member back";
    residue_is(f, &n1, 0, what).await;
    residue_is(f, &n2, 1, "only the blocker holds the second member").await;
    release(blocker).await;
    let what = "the MultiLock after the blocker left: both free";
    let all = granted_within(f.slack(), what, multi.try_acquire(f.slack())).await;
    all.release().await.unwrap();
}

/// A dropped guard is released in the background, soon.
pub async fn dropped_guard_is_released_in_background(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("dropped");
    let g = take(f, &lock(&a, &name)).await;
    drop(g);
    until_free(f, &lock(&b, &name), ZERO, "background release after drop").await;
}

/// Closing a provider releases every hold its handles handed out and still had, and waits
/// for the clean-ups its dropped futures left to the background (a dropped guard's release, a
/// cut-off waiter's undo; a fair one where the store has fair locks). The closing client runs
/// on a runtime of its own, dropped as soon as `close` returns (as when `main` returns), so a
/// clean-up `close` did not wait for dies unfinished. Then another client takes the names at
/// once (the waiter is gone: after the holder's release a newcomer gets the lock without
/// waiting), the kept guard reports [`LossReason::Closed`], and the closed provider's handles
/// refuse to acquire.
pub async fn close_releases_every_hold_and_waits_for_clean_ups(f: &impl Factory) {
    let [b] = clients(f).await;
    let names = Names::new();
    let (kept, dropped, queued) = (
        names.name("close-kept"),
        names.name("close-dropped"),
        names.name("close-queued"),
    );
    let opts = LockOptions::new().with_fair(caps(&b).fair);
    let holder = take(f, &lock_with(&b, &queued, opts)).await;
    let (closed, held, reason, refused, released_again) = on_a_runtime_of_its_own(|rt| {
        let out = rt.block_on(async {
            let a = client(f).await;
            let la = lock(&a, &kept);
            let g = take(f, &la).await;
            let gone = take(f, &lock(&a, &dropped)).await;
            let waiter = lock_with(&a, &queued, opts);
            assert_cut_off(
                Duration::from_millis(50),
                waiter.acquire(),
                "a waiter acquired a held lock",
            )
            .await;
            drop(gone);
            let closed = a.close(Duration::from_secs(10) + f.slack()).await;
            let refused = la.try_acquire(ZERO).await;
            let (held, reason) = (g.is_held(), g.loss_reason());
            (closed, held, reason, refused, g.release().await)
        });
        drop(rt);
        out
    });
    assert!(
        closed.is_clean() && closed.released >= 1,
        "{}: close left something: {closed:?}",
        f.label()
    );
    assert!(!held, "a closed provider's hold is still held");
    assert_eq!(reason, Some(LossReason::Closed));
    assert!(
        matches!(refused, Err(Error::Closed { .. })),
        "a closed provider's handle acquired: {refused:?}"
    );
    assert!(
        matches!(released_again, Err(Error::LockLost { .. })),
        "a hold its provider's close ended was released again: {released_again:?}"
    );
    for name in [&kept, &dropped] {
        match lock(&b, name).try_acquire(ZERO).await {
            Ok(Some(g)) => release(g).await,
            other => panic!("{name:?} is not free when close returns: {other:?}"),
        }
    }
    release(holder).await;
    match lock_with(&b, &queued, opts).try_acquire(ZERO).await {
        Ok(Some(g)) => release(g).await,
        other => panic!("a waiter of the closed provider kept {queued:?}: {other:?}"),
    }
    for name in [&kept, &dropped, &queued] {
        residue_is(f, name, 0, "nothing left of the closed provider").await;
    }
}

/// A release cut off at many points (the future dropped while the call is under way)
/// finishes in the background: the lock comes free, and the hold is not reported lost (a
/// release sent twice would be answered "not yours").
pub async fn a_cancelled_release_finishes_and_is_no_loss(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("cancel-release");
    let la = lock(&a, &name);
    let lb = lock(&b, &name);
    for cut in cuts().step_by(4) {
        let g = take(f, &la).await;
        let lost = g.lost();
        let _ = tokio::time::timeout(cut, g.release()).await;
        until_free(f, &lb, ZERO, "free after a cancelled release").await;
        assert!(
            tokio::time::timeout(Duration::from_millis(20), lost)
                .await
                .is_err(),
            "a release cancelled after {cut:?} was reported as a loss"
        );
    }
}

/// A released hold is never reported lost: a `lost()` future that outlives a clean release
/// stays pending past the old lease end.
pub async fn lost_never_resolves_after_a_clean_release(f: &impl Factory) {
    let Some([a]) = clients_if(f, WATCHDOG_LEASES).await else {
        return;
    };
    let g = take(
        f,
        &lock_with(&a, &Names::new().name("released"), short_watchdog(f)),
    )
    .await;
    let lost = g.lost();
    release(g).await;
    assert!(
        tokio::time::timeout(f.short_lease() * 2, lost)
            .await
            .is_err(),
        "lost() resolved after a clean release"
    );
}

/// A guard dropped on a thread with no runtime is released in the background on the runtime
/// the hold was taken on: the lock comes free without waiting for the lease.
pub async fn a_guard_dropped_off_runtime_is_released(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("dropped-off-runtime");
    let g = take(f, &lock(&a, &name)).await;
    std::thread::spawn(move || drop(g))
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    until_free(
        f,
        &lock(&b, &name),
        ZERO,
        "released after a drop off the runtime",
    )
    .await;
}
