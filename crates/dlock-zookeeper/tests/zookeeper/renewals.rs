//! The watchdog's renewals: a provider's holds renew with one multi-read per batch rather than
//! one `exists` each, and a hold whose node is gone is lost alone.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must};
use dlock_core::backend::later;
use dlock_core::{HoldState, LockOptions, LockProvider};
use tokio::time::Instant;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_holds_renew_together_and_each_is_lost_alone() {
    let Some(url) = url() else { return };
    let p = provider(&url).await;
    let admin = admin(&url).await;
    let names = Names::new();
    // 40 holds with the default 30 s watchdog, granted 20 ms apart over most of a second:
    // alone, each would renew a third of the lease after its own grant; batched, on a beat.
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
    // The first hold's node goes: its renewal must find that out, and only its own.
    let path = p.lock_path(&names.name("h0")).unwrap();
    for node in recipe_children(&admin, &path).await {
        admin.delete(&format!("{path}/{node}"), None).await.unwrap();
    }
    let calls_before = p.stats().calls();
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
    let calls = p.stats().calls() - calls_before;
    assert!(
        (1..=8).contains(&calls),
        "3 rounds of {HOLDS} renewals took {calls} calls: not in batches"
    );
    for (i, g) in guards.iter().enumerate().skip(1) {
        assert_eq!(g.state(), HoldState::Held, "hold {i}");
    }
    for g in guards.into_iter().skip(1) {
        g.release().await.unwrap();
    }
}
