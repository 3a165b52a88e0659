//! A member of the 3-member cluster of `scripts/services` killed (SIGKILL): the provider's
//! calls go to the members that live, so even a try with no wait (one attempt, no time to
//! send it again) is answered.

use std::time::Duration;

use dlock_conformance::{Names, eventually};
use dlock_core::{LockOptions, LockProvider};
use dlock_etcd::EtcdProvider;

use crate::support::cluster::ToKill;

/// Tries in a row that must all be answered once the dead member is out of the balance.
const IN_A_ROW: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tries_with_no_wait_are_answered_by_the_members_that_live() {
    let Some(cluster) = ToKill::find().await else {
        return;
    };
    let p = EtcdProvider::connect(&cluster.url).await.unwrap();
    let lock = p
        .lock(&Names::new().name("dead-member"), LockOptions::default())
        .unwrap();
    let killed = cluster.kill_the_leader().await;
    // A few looks of the provider at its members take the dead one out of the balance.
    let what = format!("{IN_A_ROW} tries with no wait in a row answered");
    eventually(Duration::from_secs(20), &what, || async {
        for i in 0..IN_A_ROW {
            match lock.try_acquire(Duration::ZERO).await {
                Ok(Some(g)) => g.release().await.map_err(|e| format!("release {i}: {e}"))?,
                Ok(None) => return Err(format!("try {i}: held, by nobody")),
                Err(e) => return Err(format!("try {i}: {e}")),
            }
        }
        Ok(())
    })
    .await;
    drop(killed);
}
