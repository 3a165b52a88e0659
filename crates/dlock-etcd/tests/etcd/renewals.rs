//! The watchdog's renewals: a provider's holds renew with one keep-alive per batch and one
//! transaction per 128 keys rather than one each, and a hold whose key is gone is lost alone.

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
    // 1,000 holds with the default 30 s watchdog, granted 50 at a time over a few seconds:
    // alone, each would renew a third of the lease after its own grant; batched, on a beat.
    const HOLDS: usize = 1_000;
    let mut guards = Vec::new();
    for wave in 0..HOLDS / 50 {
        let mut grants = tokio::task::JoinSet::new();
        for i in wave * 50..(wave + 1) * 50 {
            let lock = p
                .lock(&names.name(&format!("h{i}")), LockOptions::default())
                .unwrap();
            grants.spawn(async move { (i, lock.acquire().await.unwrap()) });
        }
        guards.extend(grants.join_all().await);
    }
    guards.sort_by_key(|(i, _)| *i);
    let guards: Vec<_> = guards.into_iter().map(|(_, g)| g).collect();
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
    let before = p.stats();
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
    // Three rounds of renewals (10, 20 and 30 s after the grants), a few batches each: per
    // batch one keep-alive, and one transaction per 128 keys. One renewal per hold would be
    // 3,000 keep-alives and 3,000 transactions; the provider's own keep-alive adds one every
    // third of its lease's time-to-live.
    let after = p.stats();
    let txns = after.txns - before.txns;
    let keep_alives = after.keep_alives - before.keep_alives;
    assert!(
        (1..=160).contains(&txns),
        "3 rounds of {HOLDS} renewals took {txns} transactions: not in batches"
    );
    assert!(
        (1..=60).contains(&keep_alives),
        "3 rounds of {HOLDS} renewals took {keep_alives} keep-alives: not one per batch"
    );
    eprintln!("3 rounds of {HOLDS} renewals: {txns} transactions, {keep_alives} keep-alives");
    for (i, g) in guards.iter().enumerate().skip(1) {
        assert_eq!(g.state(), HoldState::Held, "hold {i}");
    }
    for g in guards.into_iter().skip(1) {
        g.release().await.unwrap();
    }
}
