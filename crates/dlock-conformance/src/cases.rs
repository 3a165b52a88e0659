//! The cases, one `pub async fn` per behaviour of the contract (DESIGN.md §3). Each panics
//! with a message that names what broke.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dlock_core::{
    Capabilities, DynLock, DynLockProvider, Error, Lease, LockGuard, LockName, LockOptions,
    MultiLock,
};
use futures::future::join_all;
use tokio::time::Instant;

use crate::Factory;
use crate::support::{Names, eventually, must};

const ZERO: Duration = Duration::ZERO;

// ---------------------------------------------------------------- helpers

async fn client(f: &impl Factory) -> DynLockProvider {
    match f.connect().await {
        Ok(p) => p,
        Err(e) => panic!("{}: connect failed: {e}", f.label()),
    }
}

fn caps(p: &DynLockProvider) -> Capabilities {
    p.capabilities()
}

fn skip(f: &impl Factory, why: &str) {
    eprintln!("skipped for {}: {why}", f.label());
}

fn lock(p: &DynLockProvider, name: &str) -> DynLock {
    lock_with(p, name, LockOptions::default())
}

fn lock_with(p: &DynLockProvider, name: &str, options: LockOptions) -> DynLock {
    match p.lock(name, options) {
        Ok(l) => l,
        Err(e) => panic!("lock({name:?}, {options:?}) failed: {e}"),
    }
}

async fn take(f: &impl Factory, l: &DynLock) -> LockGuard {
    let limit = f.slack() * 2;
    match must(limit, "acquire of a free lock", l.try_acquire(limit)).await {
        Ok(Some(g)) => g,
        Ok(None) => panic!("{:?} was not free", l.name()),
        Err(e) => panic!("acquire {:?} failed: {e}", l.name()),
    }
}

async fn is_free(l: &DynLock) -> bool {
    match l.try_acquire(ZERO).await {
        Ok(Some(g)) => {
            g.release()
                .await
                .unwrap_or_else(|e| panic!("release failed: {e}"));
            true
        }
        Ok(None) => false,
        Err(e) => panic!("try_acquire {:?} failed: {e}", l.name()),
    }
}

async fn assert_busy(l: &DynLock, why: &str) {
    match l.try_acquire(ZERO).await {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{:?} was acquired although {why}", l.name()),
        Err(e) => panic!("try_acquire {:?} failed: {e}", l.name()),
    }
}

async fn release(g: LockGuard) {
    let name = g.name().clone();
    g.release()
        .await
        .unwrap_or_else(|e| panic!("release of {name:?} failed: {e}"));
}

/// Waits until the lock is free for another handle (background releases, expiry).
async fn until_free(f: &impl Factory, l: &DynLock, limit: Duration, what: &str) {
    eventually(limit + f.slack(), what, || async {
        if is_free(l).await {
            Ok(())
        } else {
            Err("still held")
        }
    })
    .await;
}

async fn residue_is(f: &impl Factory, name: &str, expected: usize, what: &str) {
    if f.residue(name).await.is_none() {
        return;
    }
    eventually(f.slack(), what, || async {
        match f.residue(name).await {
            Some(Ok(n)) if n == expected => Ok(()),
            Some(Ok(n)) => Err(format!("{n} entries, expected {expected}")),
            Some(Err(e)) => Err(format!("residue failed: {e}")),
            None => Ok(()),
        }
    })
    .await;
}

fn fixed(f: &impl Factory) -> LockOptions {
    LockOptions::new().with_lease(Lease::Fixed(f.short_lease()))
}

fn short_watchdog(f: &impl Factory) -> LockOptions {
    LockOptions::new().with_lease(Lease::watchdog(f.short_lease()))
}

// ---------------------------------------------------------------- exclusion

/// Exclusion: a second handle, in this client or another, cannot take a held lock.
pub async fn try_acquire_excludes_other_handles(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let name = Names::new().name("x");
    let g = take(f, &lock(&a, &name)).await;
    assert!(g.is_held());
    assert_busy(&lock(&b, &name), "another client holds it").await;
    assert_busy(
        &lock(&a, &name),
        "another handle of the same client holds it",
    )
    .await;
    release(g).await;
    assert!(is_free(&lock(&b, &name)).await, "free after release");
}

/// Exclusion under contention: 16 tasks × 200 cycles on one name (over two clients), each
/// updating a shared counter with read / yield / write. Any lost update or overlap fails.
pub async fn exclusion_under_contention(f: &impl Factory) {
    const TASKS: usize = 16;
    const CYCLES: usize = 200;
    let clients = [client(f).await, client(f).await];
    let name = Names::new().name("contended");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let tasks = (0..TASKS).map(|i| {
        let l = lock(&clients[i % 2], &name);
        let (counter, inside) = (Arc::clone(&counter), Arc::clone(&inside));
        tokio::spawn(async move {
            for _ in 0..CYCLES {
                let g = l.acquire().await.unwrap_or_else(|e| panic!("acquire: {e}"));
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                release(g).await;
            }
        })
    });
    let limit = Duration::from_secs(240);
    for r in must(limit, "contention run", join_all(tasks)).await {
        r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        (TASKS * CYCLES) as u64,
        "lost updates"
    );
}

/// N handles racing `try_acquire(0)` on a free lock: exactly one wins.
pub async fn concurrent_try_acquire_has_one_winner(f: &impl Factory) {
    let clients = [client(f).await, client(f).await];
    let name = Names::new().name("race");
    let locks: Vec<_> = (0..8).map(|i| lock(&clients[i % 2], &name)).collect();
    let barrier = Arc::new(tokio::sync::Barrier::new(locks.len()));
    let tries = locks.into_iter().map(|l| {
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move {
            barrier.wait().await;
            l.try_acquire(ZERO).await
        })
    });
    let results = must(f.slack() * 3, "racing try_acquire", join_all(tries)).await;
    let guards: Vec<LockGuard> = results
        .into_iter()
        .filter_map(|r| match r {
            Ok(Ok(g)) => g,
            Ok(Err(e)) => panic!("try_acquire failed: {e}"),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        })
        .collect();
    assert_eq!(guards.len(), 1, "exactly one winner");
}

/// A released lock can be taken again, by the same handle and by another.
pub async fn release_then_reacquire(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let name = Names::new().name("again");
    let la = lock(&a, &name);
    for _ in 0..3 {
        release(take(f, &la).await).await;
    }
    let lb = lock(&b, &name);
    release(take(f, &lb).await).await;
    release(take(f, &la).await).await;
}

// ---------------------------------------------------------------- waiting

/// `try_acquire(0)` on a held lock answers without waiting.
pub async fn try_acquire_zero_does_not_wait(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let name = Names::new().name("zero");
    let g = take(f, &lock(&a, &name)).await;
    let lb = lock(&b, &name);
    let started = Instant::now();
    assert_busy(&lb, "it is held").await;
    assert!(
        started.elapsed() < f.slack(),
        "try_acquire(0) took {:?}",
        started.elapsed()
    );
    release(g).await;
}

/// `try_acquire(wait)` on a held lock returns `None` after about `wait`, no later than
/// `wait` plus the slack.
pub async fn try_acquire_returns_within_wait(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let name = Names::new().name("bounded");
    let g = take(f, &lock(&a, &name)).await;
    let lb = lock(&b, &name);
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

/// A waiter gets the lock once the holder releases it.
pub async fn waiter_gets_lock_after_release(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let name = Names::new().name("handoff");
    let g = take(f, &lock(&a, &name)).await;
    let lb = lock(&b, &name);
    let waiter = tokio::spawn(async move { lb.acquire().await });
    tokio::task::yield_now().await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    release(g).await;
    let got = must(f.slack(), "waiter after release", waiter).await;
    let g2 = got
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .unwrap_or_else(|e| panic!("acquire: {e}"));
    release(g2).await;
}

// ---------------------------------------------------------------- reentrancy

/// The owner re-acquires at once and gets the same token.
pub async fn reentrant_acquire_returns_same_token(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).reentrant {
        return skip(f, "no reentrant locks");
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
        return skip(f, "no reentrant locks");
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
    assert!(is_free(&other).await, "free after the last guard");
}

/// Clones of a handle are one owner: a clone in another task re-enters.
pub async fn clones_share_the_owner(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).reentrant {
        return skip(f, "no reentrant locks");
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

/// `reentrant(false)`: the same handle waits for itself.
pub async fn non_reentrant_waits_for_itself(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).non_reentrant {
        return skip(f, "no non-reentrant locks");
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

// ---------------------------------------------------------------- leases and loss

/// A fixed lease runs out, another takes the lock, and the old guard's release is
/// `LockLost` and does not disturb the new holder.
pub async fn release_after_takeover_is_lock_lost(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).fixed_lease {
        return skip(f, "no fixed leases");
    }
    let name = Names::new().name("takeover");
    let old = take(f, &lock_with(&a, &name, fixed(f))).await;
    must(f.short_lease() + f.slack(), "fixed lease end", old.lost()).await;
    let lb = lock(&b, &name);
    let new = must(f.slack() * 2, "takeover", lb.acquire()).await.unwrap();
    let err = old
        .release()
        .await
        .expect_err("release after takeover must fail");
    assert!(
        matches!(err, Error::LockLost { .. }),
        "expected LockLost, got {err:?}"
    );
    assert!(new.is_held());
    assert_busy(&lock(&a, &name), "the new holder must be undisturbed").await;
    release(new).await;
}

/// A holder that dies (stops renewing without releasing) frees the lock within its lease
/// (some backends free it at once: a dead connection ends a row lock).
pub async fn abandoned_hold_expires(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).watchdog {
        return skip(f, "no watchdog leases");
    }
    let name = Names::new().name("abandoned");
    let g = take(f, &lock_with(&a, &name, short_watchdog(f))).await;
    let _token = g.leak();
    let lb = lock(&b, &name);
    let got = must(
        f.short_lease() + f.slack() * 2,
        "abandoned lock frees itself",
        lb.acquire(),
    )
    .await
    .unwrap();
    release(got).await;
}

/// The watchdog keeps a live holder's lock well past its TTL.
pub async fn watchdog_keeps_hold_past_three_ttls(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).watchdog {
        return skip(f, "no watchdog leases");
    }
    let name = Names::new().name("watchdog");
    let g = take(f, &lock_with(&a, &name, short_watchdog(f))).await;
    let span = f.short_lease() * 7 / 2;
    let lost = tokio::time::timeout(span, g.lost()).await;
    assert!(lost.is_err(), "the watchdog let the hold go");
    assert!(g.is_held());
    assert_busy(&lock(&b, &name), "the watchdog keeps it").await;
    release(g).await;
}

/// A fixed lease ends on time: `lost()` resolves, `is_held()` turns false, others get in.
pub async fn fixed_lease_ends_and_reports_loss(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).fixed_lease {
        return skip(f, "no fixed leases");
    }
    let name = Names::new().name("fixed");
    let g = take(f, &lock_with(&a, &name, fixed(f))).await;
    assert!(g.is_held());
    must(
        f.short_lease() + f.slack(),
        "lost() at the end of a fixed lease",
        g.lost(),
    )
    .await;
    assert!(!g.is_held());
    until_free(
        f,
        &lock(&b, &name),
        f.short_lease(),
        "free after the fixed lease",
    )
    .await;
}

/// `extend` moves the end of a fixed lease.
pub async fn extend_keeps_fixed_lease(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).fixed_lease {
        return skip(f, "no fixed leases");
    }
    let name = Names::new().name("extend");
    let lease = f.short_lease();
    let g = take(f, &lock_with(&a, &name, fixed(f))).await;
    g.extend(lease * 4).await.unwrap();
    let lost = tokio::time::timeout(lease * 2, g.lost()).await;
    assert!(lost.is_err(), "lost although extended");
    assert!(g.is_held());
    assert_busy(&lock(&b, &name), "the extended lease has not run out").await;
    release(g).await;
}

/// `extend` after the hold was lost is `LockLost`.
pub async fn extend_after_loss_is_lock_lost(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).fixed_lease {
        return skip(f, "no fixed leases");
    }
    let g = take(f, &lock_with(&a, &Names::new().name("late"), fixed(f))).await;
    must(f.short_lease() + f.slack(), "fixed lease end", g.lost()).await;
    let err = g
        .extend(f.short_lease())
        .await
        .expect_err("extend after loss");
    assert!(matches!(err, Error::LockLost { .. }), "got {err:?}");
}

/// `extend` is for fixed leases; on a watchdog lease it is an invalid argument.
pub async fn extend_on_watchdog_lease_is_invalid(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).watchdog {
        return skip(f, "no watchdog leases");
    }
    let g = take(f, &lock(&a, &Names::new().name("wd-extend"))).await;
    let err = g
        .extend(Duration::from_secs(1))
        .await
        .expect_err("extend on watchdog");
    assert!(matches!(err, Error::InvalidArgument { .. }), "got {err:?}");
    assert!(g.is_held());
    release(g).await;
}

/// A hold removed behind the holder's back is reported lost, within one renewal period.
pub async fn forced_expiry_reports_loss(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).loss_detection {
        return skip(f, "no loss detection");
    }
    let name = Names::new().name("forced");
    let g = take(f, &lock_with(&a, &name, short_watchdog(f))).await;
    match f.force_expire(&name).await {
        None => return skip(f, "the factory cannot force expiry"),
        Some(r) => r.unwrap_or_else(|e| panic!("force_expire: {e}")),
    }
    must(
        f.short_lease() + f.slack(),
        "lost() after forced expiry",
        g.lost(),
    )
    .await;
    assert!(!g.is_held());
    let lb = lock(&b, &name);
    let g2 = must(f.slack(), "acquire after forced expiry", lb.acquire())
        .await
        .unwrap();
    let err = g.release().await.expect_err("release of a lost hold");
    assert!(matches!(err, Error::LockLost { .. }), "got {err:?}");
    assert!(g2.is_held());
    release(g2).await;
}

// ---------------------------------------------------------------- fencing

/// Tokens strictly increase over 100 handoffs between two clients.
pub async fn fencing_increases_across_handoffs(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).fencing {
        return skip(f, "no fencing tokens");
    }
    let name = Names::new().name("fence");
    let (la, lb) = (lock(&a, &name), lock(&b, &name));
    let mut last = None;
    for i in 0..100 {
        let l = if i % 2 == 0 { &la } else { &lb };
        let g = must(f.slack(), "handoff", l.acquire()).await.unwrap();
        let t = g.fencing_token();
        if let Some(prev) = last {
            assert!(t > prev, "token {t} after {prev} at handoff {i}");
        }
        last = Some(t);
        release(g).await;
    }
}

/// Tokens keep increasing for a client that connects after the lock was released.
pub async fn fencing_increases_across_clients(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).fencing {
        return skip(f, "no fencing tokens");
    }
    let name = Names::new().name("fence-new");
    let g = take(f, &lock(&a, &name)).await;
    let t1 = g.fencing_token();
    release(g).await;
    drop(a);
    let b = client(f).await;
    let g = take(f, &lock(&b, &name)).await;
    assert!(g.fencing_token() > t1, "{} after {t1}", g.fencing_token());
    release(g).await;
}

// ---------------------------------------------------------------- fairness

/// A fair lock grants 8 waiters in the order they started waiting.
pub async fn fair_lock_grants_in_waiting_order(f: &impl Factory) {
    const WAITERS: usize = 8;
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).fair {
        return skip(f, "no fair locks");
    }
    let name = Names::new().name("fair");
    if f.residue(&name).await.is_none() {
        return skip(
            f,
            "the factory cannot count waiters, so waiting order cannot be set up",
        );
    }
    let opts = LockOptions::new().with_fair(true);
    let holder = take(f, &lock_with(&a, &name, opts)).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let l = lock_with(if i % 2 == 0 { &a } else { &b }, &name, opts);
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let g = l.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            release(g).await;
        }));
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
        return skip(f, "fair locks are supported");
    }
    let err = a
        .lock(
            &Names::new().name("unfair"),
            LockOptions::new().with_fair(true),
        )
        .expect_err("fair(true) must be rejected");
    assert!(matches!(err, Error::Unsupported { .. }), "got {err:?}");
}

// ---------------------------------------------------------------- cancellation and drop

/// A waiter whose acquire future is dropped leaves no queue entry and never takes the lock.
pub async fn cancelled_waiter_leaves_nothing(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let name = Names::new().name("cancel");
    let g = take(f, &lock(&a, &name)).await;
    let lb = lock(&b, &name);
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
    let (a, b) = (client(f).await, client(f).await);
    let name = Names::new().name("cancel-points");
    let la = lock(&a, &name);
    let lb = lock(&b, &name);
    for step in 0..24u64 {
        let cut = Duration::from_micros(step * step * 150);
        // On a free lock: may win, and then the guard is dropped at once.
        let _ = tokio::time::timeout(cut, la.acquire()).await;
        // On a held lock: must lose.
        let g = take(f, &lb).await;
        let r = tokio::time::timeout(cut, la.acquire()).await;
        assert!(!matches!(r, Ok(Ok(_))), "acquired a held lock");
        release(g).await;
    }
    until_free(f, &lb, ZERO, "free after cancelled acquires").await;
    residue_is(f, &name, 0, "no residue after cancelled acquires").await;
}

/// A dropped guard is released in the background, soon.
pub async fn dropped_guard_is_released_in_background(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let name = Names::new().name("dropped");
    let g = take(f, &lock(&a, &name)).await;
    drop(g);
    until_free(f, &lock(&b, &name), ZERO, "background release after drop").await;
}

// ---------------------------------------------------------------- names

/// Holding one name does not block another.
pub async fn independent_names_do_not_interfere(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let names = Names::new();
    let g = take(f, &lock(&a, &names.name("one"))).await;
    release(take(f, &lock(&b, &names.name("two"))).await).await;
    release(g).await;
}

/// Names are exact: case, punctuation, wildcards, brackets, unicode and prefixes all make
/// different locks, and each one excludes itself.
pub async fn names_are_exact_and_case_sensitive(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let names = Names::new();
    let suffixes = [
        "Key",
        "key",
        "KEY",
        "a%",
        "a_",
        "ab",
        "a*",
        "a?",
        "a.b",
        "a/b",
        "a:b",
        "a{b}",
        "{a}b",
        "a b",
        "a'b",
        "a\"b",
        "a\\b",
        "a;b",
        "a-b",
        "a\u{e9}",
        "ae\u{301}",
        "🔒",
        "a/",
        "a//b",
        "a/./b",
        "a/../b",
        "-",
        "0",
        "x",
        "x/y",
        "x/y/z",
        "__READ__",
        "lock-",
        "_c_",
    ];
    let mut guards = Vec::new();
    for s in suffixes {
        let name = names.name(s);
        guards.push(take(f, &lock(&a, &name)).await);
        assert_busy(&lock(&b, &name), "it is held").await;
    }
    let tokens: BTreeSet<_> = guards.iter().map(|g| g.name().clone()).collect();
    assert_eq!(tokens.len(), suffixes.len());
    for g in guards {
        release(g).await;
    }
}

/// A name of exactly 255 bytes works; 256 bytes is rejected before any I/O.
pub async fn longest_name_works(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let prefix = Names::new().name("");
    let name = format!("{prefix}{}", "n".repeat(LockName::MAX_LEN - prefix.len()));
    assert_eq!(name.len(), 255);
    let g = take(f, &lock(&a, &name)).await;
    assert_busy(&lock(&b, &name), "it is held").await;
    release(g).await;
    let too_long = format!("{name}n");
    let err = a
        .lock(&too_long, LockOptions::default())
        .expect_err("256 bytes");
    assert!(matches!(err, Error::InvalidName { .. }), "got {err:?}");
}

/// Empty names, NUL, control characters and over-long names are `InvalidName` for every
/// primitive.
pub async fn bad_names_are_rejected(f: &impl Factory) {
    let a = client(f).await;
    let c = caps(&a);
    let long = "x".repeat(256);
    for bad in [
        "",
        "a\0b",
        "tab\t",
        "new\nline",
        "\u{1b}[31m",
        long.as_str(),
    ] {
        let opts = LockOptions::default();
        let e = a.lock(bad, opts).expect_err("lock with a bad name");
        assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e:?}");
        if c.read_write {
            let e = a
                .read_write_lock(bad, opts)
                .expect_err("rw with a bad name");
            assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e:?}");
        }
        if c.semaphore {
            let e = a
                .semaphore(bad, 2, opts)
                .expect_err("semaphore with a bad name");
            assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e:?}");
        }
    }
}

/// Zero and too-short leases and zero permits are `InvalidArgument`.
pub async fn bad_options_are_rejected(f: &impl Factory) {
    let a = client(f).await;
    let c = caps(&a);
    let name = Names::new().name("opts");
    let mut leases = vec![Lease::Fixed(ZERO), Lease::watchdog(ZERO)];
    if let Some(short) = c.min_lease.checked_sub(Duration::from_nanos(1))
        && !short.is_zero()
    {
        leases.push(Lease::watchdog(short));
        leases.push(Lease::Fixed(short));
    }
    for lease in leases {
        let e = a
            .lock(&name, LockOptions::new().with_lease(lease))
            .expect_err("a zero or too-short lease");
        assert!(
            matches!(e, Error::InvalidArgument { .. } | Error::Unsupported { .. }),
            "{lease:?}: {e:?}"
        );
    }
    if c.semaphore {
        let e = a
            .semaphore(&name, 0, LockOptions::default())
            .expect_err("zero permits");
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    }
}

// ---------------------------------------------------------------- read-write

fn rw(p: &DynLockProvider, name: &str) -> dlock_core::DynReadWriteLock {
    p.read_write_lock(name, LockOptions::default())
        .unwrap_or_else(|e| panic!("read_write_lock: {e}"))
}

/// Readers of different clients share.
pub async fn rw_readers_share(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).read_write {
        return skip(f, "no read-write locks");
    }
    let name = Names::new().name("rw-share");
    let r1 = rw(&a, &name)
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("reader 1");
    let r2 = rw(&b, &name)
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("reader 2");
    release(r1).await;
    release(r2).await;
}

/// A writer excludes readers and writers.
pub async fn rw_writer_excludes_everyone(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).read_write {
        return skip(f, "no read-write locks");
    }
    let name = Names::new().name("rw-write");
    let w = rw(&a, &name)
        .try_write(f.slack())
        .await
        .unwrap()
        .expect("writer");
    let other = rw(&b, &name);
    assert!(
        other.try_read(ZERO).await.unwrap().is_none(),
        "read during a write"
    );
    assert!(
        other.try_write(ZERO).await.unwrap().is_none(),
        "write during a write"
    );
    release(w).await;
    let r = other
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("read after the write");
    release(r).await;
}

/// A reader blocks writers; the writer gets in after the reader leaves.
pub async fn rw_reader_blocks_writer(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).read_write {
        return skip(f, "no read-write locks");
    }
    let name = Names::new().name("rw-read");
    let r = rw(&a, &name)
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("reader");
    let writer = rw(&b, &name);
    assert!(
        writer.try_write(ZERO).await.unwrap().is_none(),
        "write during a read"
    );
    release(r).await;
    let w = writer
        .try_write(f.slack())
        .await
        .unwrap()
        .expect("write after the read");
    release(w).await;
}

/// The writer may take the read lock (downgrade) and keep reading after releasing the write.
pub async fn rw_downgrade(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).read_write || !caps(&a).reentrant {
        return skip(f, "no reentrant read-write locks");
    }
    let name = Names::new().name("rw-down");
    let l = rw(&a, &name);
    let w = l.try_write(f.slack()).await.unwrap().expect("writer");
    let r = must(f.slack(), "downgrade", l.try_read(ZERO))
        .await
        .unwrap();
    let r = r.expect("the writer may read");
    release(w).await;
    let other = rw(&b, &name);
    assert!(
        other.try_write(ZERO).await.unwrap().is_none(),
        "the downgraded read holds"
    );
    let r2 = other
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("readers share after downgrade");
    release(r2).await;
    release(r).await;
}

/// A reader asking for the write lock gets `WouldDeadlock` at once.
pub async fn rw_upgrade_would_deadlock(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).read_write {
        return skip(f, "no read-write locks");
    }
    let l = rw(&a, &Names::new().name("rw-up"));
    let r = l.try_read(f.slack()).await.unwrap().expect("reader");
    let e = must(f.slack(), "upgrade answers at once", l.write()).await;
    assert!(matches!(e, Err(Error::WouldDeadlock { .. })), "got {e:?}");
    release(r).await;
    release(
        l.try_write(f.slack())
            .await
            .unwrap()
            .expect("write after read"),
    )
    .await;
}

// ---------------------------------------------------------------- semaphore

fn sem(
    p: &DynLockProvider,
    name: &str,
    permits: u32,
    opts: LockOptions,
) -> dlock_core::DynSemaphore {
    p.semaphore(name, permits, opts)
        .unwrap_or_else(|e| panic!("semaphore: {e}"))
}

/// At most `permits` holders; a released permit lets the next one in.
pub async fn semaphore_limits_holders(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).semaphore {
        return skip(f, "no semaphores");
    }
    let name = Names::new().name("sem");
    let opts = LockOptions::default();
    let mut held = Vec::new();
    for i in 0..3 {
        let s = sem(if i % 2 == 0 { &a } else { &b }, &name, 3, opts);
        held.push(
            s.try_acquire(f.slack())
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }
    let fourth = sem(&b, &name, 3, opts);
    assert!(
        fourth.try_acquire(ZERO).await.unwrap().is_none(),
        "a 4th permit of 3"
    );
    let tokens: BTreeSet<_> = held.iter().map(LockGuard::fencing_token).collect();
    assert_eq!(tokens.len(), 3, "each permit has its own token");
    release(held.pop().unwrap()).await;
    let g = fourth
        .try_acquire(f.slack())
        .await
        .unwrap()
        .expect("the freed permit");
    release(g).await;
    for g in held {
        release(g).await;
    }
}

/// Every acquisition takes a permit, even through the same handle.
pub async fn semaphore_each_acquire_takes_a_permit(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).semaphore {
        return skip(f, "no semaphores");
    }
    let s = sem(
        &a,
        &Names::new().name("sem-same"),
        2,
        LockOptions::default(),
    );
    let g1 = s.try_acquire(f.slack()).await.unwrap().expect("permit 1");
    let g2 = s.try_acquire(f.slack()).await.unwrap().expect("permit 2");
    assert!(
        s.try_acquire(ZERO).await.unwrap().is_none(),
        "a 3rd permit of 2"
    );
    release(g1).await;
    release(g2).await;
}

/// A permit whose holder died comes back after its lease.
pub async fn semaphore_permits_of_dead_holders_return(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).semaphore || !caps(&a).watchdog {
        return skip(f, "no semaphores with watchdog leases");
    }
    let name = Names::new().name("sem-dead");
    let g = sem(&a, &name, 1, short_watchdog(f))
        .try_acquire(f.slack())
        .await
        .unwrap()
        .expect("the permit");
    let _ = g.leak();
    let s = sem(&b, &name, 1, LockOptions::default());
    assert!(
        s.try_acquire(ZERO).await.unwrap().is_none(),
        "the dead holder's lease runs"
    );
    let g = must(
        f.short_lease() + f.slack() * 2,
        "the permit comes back",
        s.acquire(),
    )
    .await
    .unwrap();
    release(g).await;
}

// ---------------------------------------------------------------- MultiLock

/// If one lock is busy, a MultiLock takes none (the ones it got are rolled back).
pub async fn multilock_is_all_or_nothing(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let names = Names::new();
    let (n1, n2, n3) = (names.name("m1"), names.name("m2"), names.name("m3"));
    let blocker = take(f, &lock(&b, &n2)).await;
    let multi = MultiLock::new(vec![lock(&a, &n3), lock(&a, &n1), lock(&a, &n2)]).unwrap();
    let r = multi.try_acquire(Duration::from_millis(200)).await.unwrap();
    assert!(r.is_none(), "a MultiLock with a busy member must fail");
    assert!(is_free(&lock(&b, &n1)).await, "m1 must be rolled back");
    assert!(is_free(&lock(&b, &n3)).await, "m3 must not be held");
    release(blocker).await;
    let all = multi
        .try_acquire(f.slack())
        .await
        .unwrap()
        .expect("all free now");
    assert_eq!(all.guards().len(), 3);
    all.release().await.unwrap();
}

/// Two MultiLocks over the same names given in opposite orders never deadlock.
pub async fn multilock_opposite_orders_do_not_deadlock(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let names = Names::new();
    let (n1, n2) = (names.name("d1"), names.name("d2"));
    let m1 = MultiLock::new(vec![lock(&a, &n1), lock(&a, &n2)]).unwrap();
    let m2 = MultiLock::new(vec![lock(&b, &n2), lock(&b, &n1)]).unwrap();
    let run = |m: MultiLock| {
        tokio::spawn(async move {
            for _ in 0..20 {
                let g = m.acquire().await.unwrap();
                tokio::task::yield_now().await;
                g.release().await.unwrap();
            }
        })
    };
    let (r1, r2) = must(f.slack() * 10, "opposite-order MultiLocks", async {
        tokio::join!(run(m1), run(m2))
    })
    .await;
    r1.unwrap();
    r2.unwrap();
}

/// Releasing a MultiGuard frees every lock.
pub async fn multilock_releases_everything(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    let names = Names::new();
    let ns: Vec<String> = (0..4).map(|i| names.name(&format!("r{i}"))).collect();
    let multi = MultiLock::new(ns.iter().map(|n| lock(&a, n)).collect()).unwrap();
    let g = must(f.slack(), "MultiLock acquire", multi.acquire())
        .await
        .unwrap();
    assert!(g.is_held());
    let tokens = g.fencing_tokens();
    assert_eq!(tokens.len(), 4);
    for n in &ns {
        assert_busy(&lock(&b, n), "the MultiLock holds it").await;
    }
    g.release().await.unwrap();
    for n in &ns {
        assert!(
            is_free(&lock(&b, n)).await,
            "{n} must be free after release"
        );
    }
}

/// The same lock twice in one MultiLock is an invalid argument, not a self-deadlock.
pub async fn multilock_rejects_duplicates(f: &impl Factory) {
    let a = client(f).await;
    let name = Names::new().name("dup");
    let e = MultiLock::new(vec![lock(&a, &name), lock(&a, &name)]).expect_err("duplicate");
    assert!(matches!(e, Error::InvalidArgument { .. }), "got {e:?}");
    let e = MultiLock::new(Vec::new()).expect_err("empty");
    assert!(matches!(e, Error::InvalidArgument { .. }), "got {e:?}");
}
