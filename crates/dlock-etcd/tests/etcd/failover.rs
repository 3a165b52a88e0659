//! The leader of the 3-member cluster of `scripts/services` killed (SIGKILL) under
//! contention: never two unlost holders at once, tokens strictly growing, every contender
//! goes on after the election.

use std::time::Duration;

use dlock_conformance::contention::Contention;
use dlock_conformance::{Names, must};
use dlock_core::{DynLock, LockOptions, LockProvider};
use dlock_etcd::EtcdProvider;
use tokio::time::Instant;

use crate::support::cluster::ToKill;

const CONTENDERS: usize = 4;
/// Acquisitions every contender must make before the kill, and after the election.
const PROGRESS: usize = 3;

/// The leader of the 3-member cluster killed while 4 contenders fight over one name: no two
/// unlost holders at once, tokens strictly increasing, every contender gets in again after
/// the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_during_contention() {
    let Some(cluster) = ToKill::find().await else {
        return;
    };
    must(
        Duration::from_secs(120),
        "the failover scenario",
        failover(cluster),
    )
    .await;
}

async fn failover(cluster: ToKill) {
    let url = cluster.url.clone();

    let name = Names::new().name("failover");
    let mut providers = Vec::new();
    let mut locks: Vec<DynLock> = Vec::new();
    for _ in 0..CONTENDERS {
        let p = must(
            Duration::from_secs(10),
            "connect",
            EtcdProvider::connect(&url),
        )
        .await
        .unwrap();
        locks.push(p.lock(&name, LockOptions::default()).unwrap());
        providers.push(p);
    }
    let diagnose = || async {
        providers
            .iter()
            .map(|p| format!("{:?} lease {:?}", p.stats(), p.lease_id()))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let run = Contention::start(locks);
    let t0 = Instant::now();
    run.await_progress(
        t0,
        PROGRESS,
        Duration::from_secs(10),
        "every contender gets in",
        diagnose,
    )
    .await;

    let killed = cluster.kill_the_leader().await;
    let (killed_at, elected_at) = (killed.at, killed.elected_at);
    run.await_progress(
        elected_at,
        PROGRESS,
        Duration::from_secs(30),
        "every contender acquires after the election",
        diagnose,
    )
    .await;
    let report = run.stop(Duration::from_secs(20)).await;
    drop(killed);
    report.print("etcd leader killed");
    report.check();
    assert!(
        report.records.iter().any(|r| r.start < killed_at),
        "acquisitions before the kill"
    );
    assert!(report.after(elected_at) >= CONTENDERS * PROGRESS);
}
