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
    let calls_before = p.stats().txns;
    must(
        Duration::from_secs(20),
        "the deleted hold is lost at its renewal",
        guards[0].lost(),
    )
    .await;
    // Past the lease of the hold granted last: a hold whose renewals did not succeed is
    // lost by then (its lease ends 30 s after its grant, or its last renewal's send).
    let past_lease = later(last_granted, Duration::from_secs(31));
    eventually(
        Duration::from_secs(45),
        "past the last hold's first lease",
        || async {
            if Instant::now() >= past_lease {
                Ok(())
            } else {
                Err(past_lease - Instant::now())
            }
        },
    )
    .await;
    // Three rounds of renewals (10, 20 and 30 s after the grants), a batch or two each.
    let calls = p.stats().txns - calls_before;
    assert!(
        (1..=8).contains(&calls),
        "3 rounds of {HOLDS} renewals took {calls} transactions: not in batches"
    );
    for (i, g) in guards.iter().enumerate().skip(1) {
        assert_eq!(g.state(), HoldState::Held, "hold {i}");
    }
    for g in guards.into_iter().skip(1) {
        g.release().await.unwrap();
    }
}
