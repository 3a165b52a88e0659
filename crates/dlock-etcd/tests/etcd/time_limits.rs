//! The time limit on calls: a call to a member that stopped answering ends within the lease's
//! time-to-live, while the streams (keep-alives, watches) run for as long as they are needed.

use std::time::Duration;

use dlock_conformance::{Names, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_etcd::etcd_client::Client;
use dlock_etcd::{EtcdConfig, EtcdProvider};
use tokio::time::Instant;

use crate::support::{SHORT_TTL, hold, proxied, with_ttl};

/// A member that stops answering while its TCP connection stays open (a partition, a frozen
/// member) holds no call longer than the lease's time-to-live, rather than until the kernel
/// gives the connection up: a release through it returns an error in time, and the lock is
/// free once the partition heals (or the lease runs out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_through_a_partition_end_within_the_lease() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let ttl = SHORT_TTL;
    let (proxy, p) = proxied(&url, &with_ttl("", ttl)).await;
    let name = Names::new().name("partitioned");
    let g = hold(&p, &name).await;
    proxy.set_fault(dlock_proxy::Fault::Partition);
    let started = Instant::now();
    let released = must(
        ttl * 3 + Duration::from_secs(2),
        "a release through the partition",
        g.release(),
    )
    .await;
    eprintln!(
        "release through the partition: {released:?} after {:?}",
        started.elapsed()
    );
    assert!(released.is_err(), "released through a partition");
    proxy.set_fault(dlock_proxy::Fault::None);
    let other = EtcdProvider::connect(&url).await.unwrap();
    let g = must(
        ttl * 3,
        "the lock after the partition",
        other.lock(&name, LockOptions::default()).unwrap().acquire(),
    )
    .await
    .unwrap();
    g.release().await.unwrap();
}

/// The time limit on calls (the lease's time-to-live, see above) is not a limit on the
/// streams: a hold kept for three times the time-to-live stays held throughout (its
/// keep-alive stream is not cut), and a waiter watching its predecessor that long gets the
/// lock when it is released (its watch is not cut either; the waiter itself looks again and
/// watches anew once per time-to-live).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_outlive_the_call_time_limit() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let url = with_ttl(&url, SHORT_TTL);
    let (a, b) = (
        EtcdProvider::connect(&url).await.unwrap(),
        EtcdProvider::connect(&url).await.unwrap(),
    );
    let name = Names::new().name("long-streams");
    let g = hold(&a, &name).await;
    let lb = b.lock(&name, LockOptions::default()).unwrap();
    let waiter = tokio::spawn(async move { lb.acquire().await });
    let until = dlock_core::backend::later(Instant::now(), SHORT_TTL * 3);
    while Instant::now() < until {
        assert!(g.is_held(), "the hold was not vouched for: {:?}", g.state());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!waiter.is_finished(), "the waiter got the held lock");
    g.release().await.unwrap();
    let got = must(
        Duration::from_secs(5),
        "the waiter after the release",
        waiter,
    )
    .await
    .unwrap();
    got.unwrap().release().await.unwrap();
    // The first watch, one per time-to-live waited, and one for the time the release
    // may come right after a new one.
    assert!(
        b.stats().watches <= 5,
        "one watch per time-to-live at most: {:?}",
        b.stats()
    );
}

/// The same time limit holds on a client the application gives
/// ([`EtcdProvider::from_client`]), which has no call timeout of its own here: a release
/// through a partition returns an error within the lease's time-to-live instead of waiting
/// for as long as the connection stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_the_applications_client_end_within_the_lease_too() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let ttl = SHORT_TTL;
    let config = EtcdConfig::from_url(&with_ttl(&url, ttl)).unwrap();
    let proxy = dlock_proxy::Proxy::start(config.endpoints[0].clone())
        .await
        .unwrap();
    let client = Client::connect([proxy.addr().to_string()], None)
        .await
        .unwrap();
    let p = EtcdProvider::from_client(client, config).await.unwrap();
    let name = Names::new().name("partitioned-app-client");
    let g = hold(&p, &name).await;
    proxy.set_fault(dlock_proxy::Fault::Partition);
    let released = must(
        ttl * 3 + Duration::from_secs(2),
        "a release through the partition, on the application's client",
        g.release(),
    )
    .await;
    assert!(released.is_err(), "released through a partition");
    proxy.set_fault(dlock_proxy::Fault::None);
}
