//! The watchdog's renewals: a provider's holds renew with one keep-alive and one transaction
//! per batch rather than one each, and a hold whose key is gone is lost alone.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::backend::later;
use dlock_core::{HoldState, LockOptions, LockProvider};
use dlock_etcd::etcd_client::{Client, DeleteOptions};
use dlock_etcd::{EtcdConfig, EtcdProvider};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_holds_renew_together_and_each_is_lost_alone() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let p = EtcdProvider::connect(&url).await.unwrap();
    let names = Names::new();
    // 40 holds with the default 30 s watchdog, granted 20 ms apart: each would renew a
    // third of the lease after its own grant, spread over most of a second.
    const HOLDS: usize = 40;
    let mut guards = Vec::new();
    let mut spacing = tokio::time::interval(Duration::from_millis(20));
    for i in 0..HOLDS {
        spacing.tick().await;
        let lock = p
            .lock(&names.name(&format!("h{i}")), LockOptions::default())
            .unwrap();
        guards.push(lock.acquire().await.unwrap());
    }
    let last_granted = Instant::now();
    // The first hold's key goes: its renewal must find that out, and only its own.
    let config = EtcdConfig::from_url(&url).unwrap();
    let mut admin = Client::connect(config.endpoints.clone(), None)
        .await
        .unwrap();
    admin
        .delete(
            format!("{}/", config.etcd_lock_name(&names.name("h0")).unwrap()),
            Some(DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let txns_before = p.stats().txns;
    must(
        Duration::from_secs(20),
        "the deleted hold is lost at its renewal",
        guards[0].lost(),
    )
    .await;
    // Every hold's first renewal is due a third of its lease after its grant, and leaves
    // within the batch window (a second) after that.
    let all_due = later(last_granted, Duration::from_millis(11_500));
    eventually(
        Duration::from_secs(20),
        "every hold's renewal sent",
        || async {
            if Instant::now() >= all_due {
                Ok(())
            } else {
                Err(all_due - Instant::now())
            }
        },
    )
    .await;
    let txns = p.stats().txns - txns_before;
    assert!(
        (1..=4).contains(&txns),
        "{HOLDS} renewals took {txns} transactions: not in batches"
    );
    for (i, g) in guards.iter().enumerate().skip(1) {
        assert_eq!(g.state(), HoldState::Held, "hold {i}");
    }
    for g in guards.into_iter().skip(1) {
        g.release().await.unwrap();
    }
}
