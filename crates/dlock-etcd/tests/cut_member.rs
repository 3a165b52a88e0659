//! A member of a 3-member cluster cut off from the other two goes on answering its clients,
//! from its own state: a hold's check must not take that state for the cluster's.
//!
//! The cluster is this test's own ([`PrivateCluster`]), its members talking to each other
//! through a switchboard that can sever one member's raft traffic while it answers its
//! clients as before. It runs in a binary of its own: three more etcd processes would slow
//! the timed tests beside it.

mod support;

use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{Lease, LockOptions, LockProvider, MultiLock};
use dlock_etcd::etcd_client::{Client, DeleteOptions, GetOptions};
use dlock_etcd::{EtcdConfig, EtcdProvider};
use dlock_memory::MemoryProvider;

use crate::support::switchboard::PrivateCluster;

/// How many keys `range` has as the member at `endpoint` sees them on its own (a serializable
/// read, answered from its own state).
async fn keys_seen_by(endpoint: &str, range: &str) -> Result<i64, String> {
    let mut c = Client::connect([endpoint], None)
        .await
        .map_err(|e| e.to_string())?;
    let only_count = GetOptions::new()
        .with_prefix()
        .with_count_only()
        .with_serializable();
    Ok(c.get(range, Some(only_count))
        .await
        .map_err(|e| e.to_string())?
        .count())
}

/// A hold's check is the cluster's answer, not one member's: a member a heartbeat behind
/// could deny a key just created, and one behind a forced delete could let an old owner's
/// `extend` succeed. Here a member's own state is made certain to be stale.
///
/// A `MultiLock` takes an etcd lock through one member, then waits for its second lock.
/// Meanwhile that member is cut off from the other two, the cluster drops the hold (as an
/// expired lease would) and another client takes the lock. When the second lock comes, the
/// `MultiLock` checks the first again. The member cut off still has the key: a check it
/// answered from its own state would grant the `MultiLock` a lock somebody else holds. The
/// check asks the leader (a linearizable read), which a member without a quorum cannot
/// reach: the `MultiLock` rolls back with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_from_its_cluster_does_not_vouch_for_a_hold() {
    // The cluster is this test's own, but it runs Debian's etcd like the shared ones.
    if service_url("DLOCK_ETCD_URL").is_none() {
        return;
    }
    let cluster = PrivateCluster::start().await;
    let (cut, cut_id) = cluster.follower().await;
    assert_ne!(cut_id, 0, "the member's status names its id");
    let quorum: Vec<String> = (0..3)
        .filter(|i| *i != cut)
        .map(|i| cluster.endpoint(i))
        .collect();
    let through_cut = format!("etcd://{}?ttl_s=10", cluster.endpoint(cut));
    let cut_off = EtcdProvider::connect(&through_cut).await.unwrap();
    let others = EtcdProvider::connect(&format!("etcd://{}", quorum.join(",")))
        .await
        .unwrap();
    let memory = MemoryProvider::new();

    let names = Names::new();
    let (name, gate_name) = (names.name("held"), names.name("gate"));
    let gate = memory
        .lock(&gate_name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let fixed = LockOptions::new().with_lease(Lease::Fixed(Duration::from_secs(60)));
    let both = MultiLock::new(vec![
        cut_off.lock(&name, fixed).unwrap(),
        memory.lock(&gate_name, LockOptions::default()).unwrap(),
    ])
    .unwrap();
    assert!(
        both.members()[0].store_id().starts_with("etcd://"),
        "the etcd lock is taken first"
    );
    let multi = tokio::spawn(async move { both.acquire().await });

    let range = format!(
        "{}/",
        EtcdConfig::from_url(&through_cut)
            .unwrap()
            .etcd_lock_name(&name)
            .unwrap()
    );
    // The member to be cut off has the MultiLock's key itself (the put went through it, so the
    // cluster has it too).
    let cut_endpoint = cluster.endpoint(cut);
    eventually(
        Duration::from_secs(20),
        "the MultiLock holds the etcd lock",
        || async {
            match keys_seen_by(&cut_endpoint, &range).await? {
                1 => Ok(()),
                n => Err(format!("{n} keys")),
            }
        },
    )
    .await;

    cluster.cut_off(cut, format!("{cut_id:x}"));
    let admin = Client::connect(&quorum, None).await.unwrap();
    eventually(
        Duration::from_secs(20),
        "the cluster drops the hold",
        || {
            let (mut admin, range) = (admin.clone(), range.clone());
            async move {
                admin
                    .delete(range, Some(DeleteOptions::new().with_prefix()))
                    .await
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await;
    assert_eq!(
        keys_seen_by(&cut_endpoint, &range).await,
        Ok(1),
        "the member was cut off too late: it saw the delete"
    );
    let taker = must(
        Duration::from_secs(20),
        "taking the lock through the quorum",
        others
            .lock(&name, LockOptions::default())
            .unwrap()
            .try_acquire(Duration::from_secs(15)),
    )
    .await
    .unwrap()
    .expect("the cluster dropped the MultiLock's hold");
    gate.release().await.unwrap();

    let answer = must(Duration::from_secs(60), "the MultiLock's answer", multi)
        .await
        .unwrap();
    match answer {
        Ok(_) => panic!(
            "the MultiLock was granted {name} on the word of a member cut off from its \
             cluster, while another client holds it (token {})",
            taker.fencing_token()
        ),
        Err(e) => eprintln!("the MultiLock rolled back: {e}"),
    }
    assert!(
        taker.is_held(),
        "the holder through the quorum was disturbed"
    );
    taker.release().await.unwrap();
}
