//! Leases, expiry, loss and owner-only release.

use std::time::Duration;

use dlock_core::backend::{from_now, later};
use dlock_core::{DynLockProvider, Error, Lease, LockGuard, LockOptions, LossReason};
use tokio::time::Instant;

use super::{
    FIXED_LEASES, Need, WATCHDOG_LEASES, WATCHDOG_LEASES_WITH_LOSS_DETECTION, WatchdogProbes, ZERO,
    acquired, assert_busy, assert_lock_lost, client, clients, clients_if, cuttable_clients_if,
    dropped_behind_the_back, expiry_wait, fixed, granted_within, lease_wait, lock, lock_with,
    named_clients_if, on_a_runtime_of_its_own, release, short_watchdog, take, until_free,
};
use crate::Factory;
use crate::record::inconclusive_by_chance;
use crate::support::{Names, StallProbe, must};

/// A fixed lease runs out, another takes the lock, and the old guard's release is
/// `LockLost` and does not disturb the new holder.
pub async fn release_after_takeover_is_lock_lost(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, FIXED_LEASES, "takeover").await else {
        return;
    };
    let old = take(f, &lock_with(&a, &name, fixed(f))).await;
    must(lease_wait(f), "fixed lease end", old.lost()).await;
    let lb = lock(&b, &name);
    let new = acquired(expiry_wait(f), "takeover", lb.acquire()).await;
    assert_lock_lost(old.release().await, "release after takeover must fail");
    assert!(new.is_held());
    assert_busy(&lock(&a, &name), "the new holder must be undisturbed").await;
    release(new).await;
}

/// The store drops a hold behind its holder's back and another client takes the lock; the
/// old guard, whose keeper has not noticed yet (a 30 s watchdog lease), releases: the store
/// itself must refuse (`LockLost`) and leave the new holder alone.
pub async fn stale_release_reaches_the_store(f: &impl Factory) {
    let [a, b, c] = clients(f).await;
    let name = Names::new().name("stale-release");
    let taken_over = taken_over_behind_the_back(f, [&a, &b], &name, LockOptions::default());
    let Some((old, new)) = taken_over.await else {
        return;
    };
    assert_lock_lost(
        old.release().await,
        "the store must refuse a release by the old owner",
    );
    assert_undisturbed(&c, &name, new).await;
}

/// As [`stale_release_reaches_the_store`], for `extend` on a long fixed lease.
pub async fn stale_extend_reaches_the_store(f: &impl Factory) {
    let Some(([a, b, c], name)) = named_clients_if(f, FIXED_LEASES, "stale-extend").await else {
        return;
    };
    let long = LockOptions::new().with_lease(Lease::Fixed(Duration::from_secs(60)));
    let Some((old, new)) = taken_over_behind_the_back(f, [&a, &b], &name, long).await else {
        return;
    };
    assert_lock_lost(
        old.extend(Duration::from_secs(60)).await,
        "the store must refuse an extend by the old owner",
    );
    assert!(!old.is_held(), "a refused extend means the hold is lost");
    assert_undisturbed(&c, &name, new).await;
}

/// A hold on `name` taken through `a` with `options`, which the store then drops behind its
/// holder's back, and the hold `b` takes at once after it: the old guard (its keeper has not
/// noticed) and the new one. `None` where the factory cannot drop a hold (the case is then
/// noted skipped, and the caller returns).
async fn taken_over_behind_the_back(
    f: &impl Factory,
    [a, b]: [&DynLockProvider; 2],
    name: &str,
    options: LockOptions,
) -> Option<(LockGuard, LockGuard)> {
    let old = take(f, &lock_with(a, name, options)).await;
    if !dropped_behind_the_back(f, name).await {
        return None;
    }
    let what = "takeover after the store dropped the hold: the lock is free once it did";
    let new = granted_within(f.slack(), what, lock(b, name).try_acquire(f.slack())).await;
    Some((old, new))
}

/// Asserts that `new`, the holder that took `name` over, was left alone by the old owner's
/// refused call: it still holds, and excludes the client `c`. Then releases it.
async fn assert_undisturbed(c: &DynLockProvider, name: &str, new: LockGuard) {
    assert!(new.is_held(), "the new holder was disturbed");
    assert_busy(&lock(c, name), "the new holder must keep excluding").await;
    release(new).await;
}

/// A holder that dies (stops renewing without releasing) frees the lock within its lease
/// (some backends free it at once: a dead connection ends a row lock).
pub async fn abandoned_hold_expires(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, WATCHDOG_LEASES, "abandoned").await else {
        return;
    };
    let _token = take(f, &lock_with(&a, &name, short_watchdog(f)))
        .await
        .leak();
    let lb = lock(&b, &name);
    let got = acquired(expiry_wait(f), "abandoned lock frees itself", lb.acquire()).await;
    release(got).await;
}

/// The watchdog keeps a live holder's lock well past its TTL.
pub async fn watchdog_keeps_hold_past_three_ttls(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, WATCHDOG_LEASES, "watchdog").await else {
        return;
    };
    // Keeping a hold is promised to a live holder: a runtime stalled for most of the lease (a
    // stress run on two cores saw one) loses it, as it should.
    // So does a store that answers too slowly for renewals to get through in time (a stress
    // run saw a Redis Cluster node do so): another client's tries measure it.
    let stalls = StallProbe::start();
    let g = take(f, &lock_with(&a, &name, short_watchdog(f))).await;
    let lease = f.short_lease();
    let what = "watchdog_keeps_hold_past_three_ttls";
    let probes = WatchdogProbes::new(what, lease, stalls, lock(&b, &name));
    let span = lease * 7 / 2;
    let why = "the watchdog let the hold go";
    if !probes.kept(&g, span, span, why).await {
        return;
    }
    assert!(g.is_held());
    assert_busy(&lock(&b, &name), "the watchdog keeps it").await;
    // The probes run until the release: a release that finds the hold gone says what the
    // runtime and the store did meanwhile (a stress run saw SQLite's once, unexplained).
    let released = g.release().await;
    assert!(
        released.is_ok(),
        "the release failed: {released:?} (the runtime stalled {:?} at most in the last two \
         leases; the store answered another client within {:?})",
        probes.runtime.worst_within(lease * 2),
        probes.store.slowest_within(lease * 2)
    );
}

/// A fixed lease is exclusive exactly until its end and no longer: others are refused while
/// it runs, `lost()` resolves no earlier than a lease after the acquire started (and says
/// why), `is_held()` turns false, and others get in.
///
/// The first probe goes as soon as the acquire returns. If even it is answered only after the
/// lease could end, nothing was probed: that fails the case (a `try_acquire(ZERO)` that
/// waits for the lock looks like this), unless the runtime was kept from running for half
/// the lease or more meanwhile (a stall probe); then the case says so and checks the rest.
pub async fn fixed_lease_is_exclusive_until_its_end(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, FIXED_LEASES, "fixed").await else {
        return;
    };
    let lease = f.short_lease();
    let stalls = StallProbe::start();
    let started = Instant::now();
    let g = take(f, &lock_with(&a, &name, fixed(f))).await;
    assert!(g.is_held());
    let other = lock(&b, &name);
    let lost = g.lost();
    tokio::pin!(lost);
    let mut probes = 0;
    let mut resolved = false;
    let deadline = from_now(lease + f.slack());
    let mut first_answer = None;
    let mut stalled = Duration::ZERO;
    loop {
        let r = other.try_acquire(ZERO).await;
        let answered = Instant::now();
        if first_answer.is_none() {
            first_answer = Some(answered - started);
            stalled = stalls.stalled_within(answered - started);
        }
        match r {
            Ok(None) => probes += 1,
            // The store granted it before the lease could have ended there: no exclusion.
            Ok(Some(_)) if answered < later(started, lease) => {
                panic!(
                    "another client got the lock {:?} into a {lease:?} fixed lease",
                    answered - started
                )
            }
            Ok(Some(g2)) => {
                release(g2).await;
                break;
            }
            Err(e) => panic!("try_acquire: {e}"),
        }
        tokio::select! {
            () = &mut lost => {
                resolved = true;
                break;
            }
            // The pause between probes of this poll: `lost()` ends it, and the deadline
            // below bounds the poll.
            () = tokio::time::sleep(lease / 8) => {}
        }
        assert!(
            Instant::now() < deadline,
            "lost() did not resolve by the end of the lease"
        );
    }
    if !resolved {
        must(f.slack(), "lost() at the end of the fixed lease", &mut lost).await;
    }
    let lost_at = Instant::now();
    // The guard stops vouching a drift allowance before the lease end, never sooner.
    let vouched = lease.saturating_sub(LockOptions::default().drift.of(lease));
    assert!(
        lost_at >= later(started, vouched),
        "lost {:?} after the acquire started, before the {lease:?} lease less its drift \
         allowance ({vouched:?}) could end",
        lost_at - started
    );
    if probes == 0 {
        // Only a first probe answered after the lease could end grants without a panic above.
        let took = first_answer.unwrap_or_default();
        assert!(
            stalled >= lease / 2,
            "the lease was never probed while it ran: the acquire and the first probe took \
             {took:?} of a {lease:?} lease, and the runtime stalled only {stalled:?} meanwhile \
             (does try_acquire(ZERO) wait?)"
        );
        let why = format!(
            "the acquire and the first probe took {took:?} of the {lease:?} lease, {stalled:?} \
             of it with the runtime stalled: no probe could be answered while it ran, so this \
             run proves nothing about exclusion"
        );
        eprintln!("fixed_lease_is_exclusive_until_its_end: {why}");
        inconclusive_by_chance(why);
    }
    assert!(!g.is_held());
    assert_eq!(g.loss_reason(), Some(LossReason::FixedLeaseEnded));
    until_free(f, &other, f.holder_timeout(), "free after the fixed lease").await;
}

/// `extend` moves the end of a fixed lease, and the extended lease ends in its turn.
///
/// The first lease is three short leases: the extend has to reach the store before it ends,
/// and on a loaded machine a short lease can run out between the acquire and the extend (a
/// loss the contract calls for, not the case under test).
pub async fn extend_keeps_fixed_lease(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, FIXED_LEASES, "extend").await else {
        return;
    };
    let lease = f.short_lease();
    let first = LockOptions::new().with_lease(Lease::Fixed(lease * 3));
    let g = take(f, &lock_with(&a, &name, first)).await;
    let extending = Instant::now();
    g.extend(lease * 6).await.unwrap();
    // Past the end of the first lease (at most three leases after `extending`).
    let lost = tokio::time::timeout(lease * 4, g.lost()).await;
    assert!(
        lost.is_err(),
        "lost although extended: {:?}",
        g.loss_reason()
    );
    assert!(g.is_held());
    assert_busy(&lock(&b, &name), "the extended lease has not run out").await;
    must(
        lease * 2 + f.slack(),
        "the extended lease ends in its turn",
        g.lost(),
    )
    .await;
    let drift = LockOptions::default().drift.of(lease * 3);
    assert!(
        extending.elapsed() >= (lease * 6).saturating_sub(drift),
        "the extended lease ended early: {:?} of {:?} less the {drift:?} drift allowance",
        extending.elapsed(),
        lease * 6
    );
    assert_eq!(g.loss_reason(), Some(LossReason::FixedLeaseEnded));
    until_free(
        f,
        &lock(&b, &name),
        f.holder_timeout(),
        "free after the extended lease",
    )
    .await;
}

/// `extend` after the hold was lost is `LockLost`.
pub async fn extend_after_loss_is_lock_lost(f: &impl Factory) {
    let Some([a]) = clients_if(f, FIXED_LEASES).await else {
        return;
    };
    let g = take(f, &lock_with(&a, &Names::new().name("late"), fixed(f))).await;
    must(lease_wait(f), "fixed lease end", g.lost()).await;
    assert_lock_lost(g.extend(f.short_lease()).await, "extend after loss");
}

/// `extend` is for fixed leases; on a watchdog lease it is an invalid argument.
pub async fn extend_on_watchdog_lease_is_invalid(f: &impl Factory) {
    let Some([a]) = clients_if(f, WATCHDOG_LEASES).await else {
        return;
    };
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
    let Some(([a, b], name)) =
        named_clients_if(f, Need(|c| c.loss_detection, "no loss detection"), "forced").await
    else {
        return;
    };
    let g = take(f, &lock_with(&a, &name, short_watchdog(f))).await;
    if !dropped_behind_the_back(f, &name).await {
        return;
    }
    must(lease_wait(f), "lost() after forced expiry", g.lost()).await;
    assert!(!g.is_held());
    assert!(g.loss_reason().is_some(), "a loss without a reason");
    let lb = lock(&b, &name);
    let g2 = acquired(f.slack(), "acquire after forced expiry", lb.acquire()).await;
    assert_lock_lost(g.release().await, "release of a lost hold");
    assert!(g2.is_held());
    release(g2).await;
}

/// The store becomes unreachable for one client for longer than its lease: its guard reports
/// the loss by the lease end, others get the lock once the store lets the hold go, and after
/// the outage the old guard's release is `LockLost`.
pub async fn renewal_outage_longer_than_the_lease_reports_loss(f: &impl Factory) {
    let Some((p, cut, b)) = cuttable_clients_if(f, WATCHDOG_LEASES_WITH_LOSS_DETECTION).await
    else {
        return;
    };
    let name = Names::new().name("outage");
    let g = take(f, &lock_with(&p, &name, short_watchdog(f))).await;
    cut.set_partitioned(true);
    must(
        lease_wait(f),
        "lost() by the end of the lease during the outage",
        g.lost(),
    )
    .await;
    assert!(!g.is_held());
    let reason = g.loss_reason();
    assert!(
        matches!(
            reason,
            Some(
                LossReason::RenewalFailed
                    | LossReason::LeaseEnded
                    | LossReason::SessionExpired
                    | LossReason::ConnectionLost
            )
        ),
        "lost for an unexpected reason: {reason:?}"
    );
    let other = lock(&b, &name);
    let got = acquired(
        expiry_wait(f),
        "another client gets the lock after the partitioned holder's lease",
        other.acquire(),
    )
    .await;
    cut.set_partitioned(false);
    assert_lock_lost(g.release().await, "release of a hold lost in an outage");
    assert!(got.is_held());
    release(got).await;
}

/// A hold taken on a runtime that then stops running (as in a stalled or paused process: its
/// lease keeper never runs again): `is_held()` is false once the lease end has passed, and says
/// why.
pub async fn is_held_is_false_at_the_lease_end_on_a_stalled_runtime(f: &impl Factory) {
    let Some([probe]) = clients_if(f, WATCHDOG_LEASES).await else {
        return;
    };
    drop(probe);
    let name = Names::new().name("stalled");
    let lease = f.short_lease();
    let (held, reason, released) = on_a_runtime_of_its_own(|rt| {
        // Everything of this client runs on `rt`, which runs only inside `block_on`.
        let (p, g) = rt.block_on(async {
            let p = client(f).await;
            let g = take(f, &lock_with(&p, &name, short_watchdog(f))).await;
            assert!(g.is_held());
            (p, g)
        });
        // The stall itself (the fault this case injects, not a wait for an event): the
        // runtime does not run for one and a half leases.
        std::thread::sleep(lease.saturating_add(lease / 2));
        let held = g.is_held();
        let reason = g.loss_reason();
        let released = rt.block_on(g.release());
        drop(p);
        (held, reason, released)
    });
    assert!(
        !held,
        "is_held() was true after the lease end on a stalled runtime"
    );
    assert_eq!(reason, Some(LossReason::LeaseEnded));
    assert_lock_lost(released, "release after the lease end");
}

/// The runtime the hold was taken on is shut down while the guard lives on: the keeper dies
/// with it and the guard reports the loss instead of claiming a hold nobody renews.
pub async fn keeper_runtime_dropped_reports_loss(f: &impl Factory) {
    let name = Names::new().name("orphan");
    let (held, reason, guard, provider) = on_a_runtime_of_its_own(|rt| {
        let (p, g) = rt.block_on(async {
            let p = client(f).await;
            let g = take(f, &lock(&p, &name)).await;
            (p, g)
        });
        drop(rt);
        (g.is_held(), g.loss_reason(), g, p)
    });
    assert!(!held, "is_held() after the keeper's runtime was shut down");
    assert_eq!(reason, Some(LossReason::KeeperStopped));
    assert_lock_lost(guard.release().await, "release of an orphaned hold");
    drop(provider);
}
