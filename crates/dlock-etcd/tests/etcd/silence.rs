//! A silent network (nothing sent arrives, nothing comes back, the connection stays open):
//! a holder is told of its loss before anyone else gets its lock, and a try is an error,
//! never "held".

use std::time::Duration;

use dlock_conformance::{Names, Partition, eventually, must, service_url};
use dlock_core::backend::CALL_GRACE;
use dlock_core::{Error, LockOptions, LockProvider, LossReason};
use dlock_etcd::{DEFAULT_LEASE_TTL, EtcdProvider};
use tokio::time::Instant;

use crate::support::{
    SERIAL, SHORT_TTL, await_queued, behind_partition, hold, reached_at, signed, with_ttl,
};

/// A holder with the default settings (the provider's 10 s etcd lease, the lock's 30 s
/// watchdog lease) whose network goes silent: nothing it sends arrives, nothing comes back,
/// and its connection stays open. Its guard's `lost()` resolves, as `SessionTimedOut` (no
/// answer moved its horizon), strictly before another client's `acquire()` returns, by at
/// least 1 % of the lock's lease less what a loaded machine may add to a timer: the guard
/// stops at its horizon (the send of the last keep-alive the server answered, plus the
/// time-to-live the server answered with) less the lease's drift allowance (1 % of the lease
/// plus 5 ms, at most a quarter of the 10 s the horizon spans), and the server ends the etcd
/// lease no sooner than that keep-alive's arrival plus the time-to-live (and then within its
/// revoke loop's 500 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_holder_is_told_before_anyone_else_gets_the_lock() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    // Timed to the millisecond: no process-killing test beside it.
    let _serial = SERIAL.lock().await;
    let (cut, holder) = behind_partition(&url, "").await.unwrap();
    assert_eq!(holder.config().lease_ttl, DEFAULT_LEASE_TTL);
    let other = EtcdProvider::connect(&url).await.unwrap();
    let name = Names::new().name("silent-holder");
    let lock_name = other.config().etcd_lock_name(&name).unwrap();
    let g = hold(&holder, &name).await;
    let lost = g.lost();
    let lost = tokio::spawn(async move {
        lost.await;
        Instant::now()
    });
    let lock = other.lock(&name, LockOptions::default()).unwrap();
    let waiter = tokio::spawn(async move {
        let got = lock.acquire().await;
        (Instant::now(), got)
    });
    await_queued(&url, &lock_name, 2, "the other client waits").await;

    cut.set_partitioned(true);
    let silent = Instant::now();
    let bound = DEFAULT_LEASE_TTL + Duration::from_secs(5);
    let lost_at = must(bound, "the silent holder is told", lost)
        .await
        .unwrap();
    let (granted_at, got) = must(bound, "the other client gets the lock", waiter)
        .await
        .unwrap();
    let taken = got.unwrap();
    eprintln!(
        "network silent at 0: holder told at {}, other client granted at {}; margin {}",
        signed(silent, lost_at),
        signed(silent, granted_at),
        signed(lost_at, granted_at),
    );
    assert!(
        lost_at < granted_at,
        "the lock passed on {} before its silent holder was told",
        signed(granted_at, lost_at)
    );
    let lease = LockOptions::default().lease.ttl();
    let least = (lease / 100).saturating_sub(Duration::from_millis(50));
    assert!(
        granted_at - lost_at >= least,
        "the silent holder was told only {} before the lock passed on (at least {least:?})",
        signed(lost_at, granted_at)
    );
    assert_eq!(g.loss_reason(), Some(LossReason::SessionTimedOut));
    assert!(!g.is_held());
    cut.set_partitioned(false);
    taken.release().await.unwrap();
}

/// A client whose network went silent cannot tell whether a lock is held: `try_acquire`
/// returns a retryable error, never `Ok(None)` ("held by someone"; here nobody holds the
/// lock), both while its etcd lease may still live (its put is never answered) and once the
/// lease has ended (no new one can be granted). An `acquire()` made while the network is
/// silent gets the lock once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_through_a_silent_network_is_an_error_not_held() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let ttl = SHORT_TTL;
    let (cut, p) = behind_partition(&url, &with_ttl("", ttl)).await.unwrap();
    let lock = p
        .lock(&Names::new().name("silent-try"), LockOptions::default())
        .unwrap();
    let wait = Duration::from_millis(500);
    let bound = wait + CALL_GRACE + Duration::from_secs(3);
    let no_answer = |got: Result<Option<dlock_core::LockGuard>, Error>, when: &str| match got {
        Err(e) => {
            eprintln!("{when}: {e}");
            assert!(e.is_retryable(), "{when}: {e:?}");
        }
        Ok(None) => panic!("{when}: Ok(None), \"held\", from a store that did not answer"),
        Ok(Some(_)) => panic!("{when}: acquired through a silent network"),
    };
    cut.set_partitioned(true);
    let got = must(
        bound,
        "a try while the lease may live",
        lock.try_acquire(wait),
    )
    .await;
    no_answer(got, "while the lease may live");
    eventually(ttl * 3, "the provider's lease ends", || async {
        match p.lease_id() {
            None => Ok(()),
            Some(l) => Err(l),
        }
    })
    .await;
    let got = must(bound, "a try once the lease ended", lock.try_acquire(wait)).await;
    no_answer(got, "once the lease ended");

    let waiter = tokio::spawn({
        let lock = std::sync::Arc::clone(&lock);
        async move { lock.acquire().await }
    });
    cut.set_partitioned(false);
    let g = must(
        ttl * 3 + Duration::from_secs(5),
        "an acquire once the network is back",
        waiter,
    )
    .await
    .unwrap()
    .unwrap();
    g.release().await.unwrap();
}

/// A waiter whose watch rides a connection gone silent (nothing arrives, nothing comes back,
/// the connection stays open) to a member host that vanished (new connections to it are
/// turned away), while its provider reaches the cluster through another endpoint too, gets
/// the lock after the holder releases, within a few time-to-lives: its client pings its
/// connections and ends the silent one within a little less than one (a ping every 6 s, 3.3 s
/// to answer it), and its wait is bounded by one. A waiter that never heard the release would
/// hold everyone out for good: its key is first in the queue.
///
/// An endpoint that keeps accepting connections and then stays silent is not bounded so:
/// the client's balancer sends each new call to either endpoint, and each that lands on the
/// silent one costs its time limit (a lease whose keep-alives land there twice in a row is
/// lost, and the acquisition starts over).
///
/// The provider has two endpoints, two proxies of one member; one of them vanishes. The
/// client spreads its calls over both, so the watch lands on the silent one in about half
/// the rounds: a round whose waiter is granted at once had it on the other, and another
/// round runs, until one had it on the silent proxy (12 rounds at most).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_watch_went_silent_still_gets_the_lock() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let member = dlock_etcd::EtcdConfig::from_url(&url).unwrap().endpoints[0].clone();
    let holder = EtcdProvider::connect(&url).await.unwrap();
    for round in 1..=12 {
        let silent = dlock_proxy::Proxy::start(member.clone()).await.unwrap();
        let healthy = dlock_proxy::Proxy::start(member.clone()).await.unwrap();
        let both = format!("{},{}", silent.addr(), healthy.addr());
        let waiter = EtcdProvider::connect(&reached_at(&url, &both, ""))
            .await
            .unwrap();
        assert_eq!(waiter.config().lease_ttl, DEFAULT_LEASE_TTL);
        let name = Names::new().name("silent-watch");
        let lock_name = holder.config().etcd_lock_name(&name).unwrap();
        let g = hold(&holder, &name).await;
        let lock = waiter.lock(&name, LockOptions::default()).unwrap();
        let waiting = tokio::spawn(async move { lock.acquire().await });
        await_queued(&url, &lock_name, 2, "the waiter queues").await;
        silent.set_fault(dlock_proxy::Fault::Vanished);
        g.release().await.unwrap();
        let released = Instant::now();
        let mut waiting = std::pin::pin!(waiting);
        if let Ok(got) = tokio::time::timeout(Duration::from_secs(2), &mut waiting).await {
            // Its watch was on the healthy proxy: no silence to show. (Healed first: the
            // release could land on the silent one.)
            silent.set_fault(dlock_proxy::Fault::None);
            got.unwrap().unwrap().release().await.unwrap();
            continue;
        }
        let bound = DEFAULT_LEASE_TTL * 4 + Duration::from_secs(5);
        let got = must(
            bound,
            "the waiter whose watch went silent gets the lock",
            waiting,
        )
        .await
        .unwrap()
        .unwrap();
        eprintln!(
            "round {round}: granted {} after the release, its watch silent",
            signed(released, Instant::now())
        );
        silent.set_fault(dlock_proxy::Fault::None);
        got.release().await.unwrap();
        return;
    }
    panic!("in 12 rounds the waiter's watch never landed on the proxy that went silent");
}
