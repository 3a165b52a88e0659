//! A provider's etcd lease that ends under its holds (its keep-alives answered too late):
//! every hold is lost, none of them costs a call of its own to clean up, and their keys go
//! with the lease at once, though the server still kept it alive.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{LockGuard, LossReason};

use crate::support::{behind_partition, hold, queued};

/// Holds of the provider under test.
const HOLDS: usize = 40;

/// A provider with the default settings (10 s etcd lease, 30 s watchdog) whose replies start
/// to come 15 s late, while its requests still reach the server: its keep-alives keep the
/// lease alive on the server, but no answer comes back in time, so the provider ends the
/// lease at its horizon and its 40 holds are lost. Then:
///
/// - the holds' clean-up sends no call per hold (a delete of each key would be 40 calls, at
///   the moment the store is late; the 1,000s of a busy provider would be a storm): the
///   provider's transactions from the delay to the end are the few of the watchdog's batches;
/// - the keys go within 3 s of the losses: the provider revokes the ended lease, where the
///   server would otherwise keep the keys until the lease's time-to-live after the last
///   keep-alive it received (over 6 s after the losses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_lease_takes_its_keys_and_costs_no_call_per_hold() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let (cut, holder) = behind_partition(&url, "").await.unwrap();
    let names = Names::new();
    let names: Vec<String> = (0..HOLDS).map(|i| names.name(&format!("h{i}"))).collect();
    let mut guards: Vec<LockGuard> = Vec::new();
    for name in &names {
        guards.push(hold(&holder, name).await);
    }
    let lock_names: Vec<String> = names
        .iter()
        .map(|n| holder.config().etcd_lock_name(n).unwrap())
        .collect();
    let keys = || {
        let (url, lock_names) = (url.clone(), lock_names.clone());
        async move {
            let mut n = 0;
            for l in &lock_names {
                n += queued(&url, l).await;
            }
            n
        }
    };
    assert_eq!(keys().await, i64::try_from(HOLDS).unwrap());
    let before = holder.stats().txns;

    cut.delay_replies(Duration::from_secs(15));
    must(Duration::from_secs(20), "every hold is lost", async {
        for g in &guards {
            g.lost().await;
        }
    })
    .await;
    for g in &guards {
        assert_eq!(g.loss_reason(), Some(LossReason::SessionTimedOut));
    }
    eventually(
        Duration::from_secs(3),
        "the ended lease's keys are gone",
        || {
            let keys = keys();
            async move {
                match keys.await {
                    0 => Ok(()),
                    n => Err(n),
                }
            }
        },
    )
    .await;
    for g in guards {
        assert!(g.release().await.is_err(), "a lost hold released");
    }
    let txns = holder.stats().txns - before;
    cut.delay_replies(Duration::ZERO);
    eprintln!("{txns} transactions from the delay to the releases of {HOLDS} lost holds");
    assert!(
        txns <= 8,
        "{txns} transactions for {HOLDS} holds of an ended lease: a call per hold"
    );
    drop(holder);
}
