//! Releasing: a release is told its outcome even when its answer is lost, and a key whose
//! delete failed does not block the lock for the provider's whole life.

use std::time::Duration;

use dlock_conformance::{Names, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_etcd::EtcdProvider;

use crate::support::member::PrivateMember;
use crate::support::{await_queued, hold, proxied, queued};

/// A release whose delete was applied but whose answer was lost (the connection cut while
/// the server's replies were held back) succeeds: the retry that finds the key gone counts
/// it as deleted, not as `LockLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_answer_was_lost_succeeds() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let (proxy, p) = proxied(&url, "").await;
    let name = Names::new().name("lost-answer");
    let lock_name = p.config().etcd_lock_name(&name).unwrap();
    let g = hold(&p, &name).await;
    assert_eq!(queued(&url, &lock_name).await, 1);

    proxy.set_fault(dlock_proxy::Fault::Downstream);
    let release = tokio::spawn(g.release());
    await_queued(&url, &lock_name, 0, "the server deleted the key").await;
    proxy.reset();
    proxy.set_fault(dlock_proxy::Fault::None);
    let released = must(Duration::from_secs(10), "the release", release)
        .await
        .unwrap();
    assert!(
        released.is_ok(),
        "the release whose answer was lost: {released:?}"
    );
}

/// A release whose delete failed for good (here: the user's write permission revoked under
/// its hold) leaves the key on the server under the provider's lease, which the provider
/// keeps alive: the provider goes on deleting it in the background, so once the permission
/// is back the lock is free without the provider being dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_delete_failed_is_deleted_later() {
    if service_url("DLOCK_ETCD_URL").is_none() {
        return;
    }
    let member = PrivateMember::start("perm", &[], |_| {});
    member.await_serving().await;
    for args in [
        &["user", "add", "root:dlock-root-pw"][..],
        &["role", "add", "locker"],
        &[
            "role",
            "grant-permission",
            "locker",
            "--prefix=true",
            "readwrite",
            "dlock/",
        ],
        &["user", "add", "alice:dlock-alice-pw"],
        &["user", "grant-role", "alice", "locker"],
        &["auth", "enable"],
    ] {
        member.etcdctl(args).await;
    }
    let root = |args: &[&str]| {
        let mut v = vec!["--user", "root:dlock-root-pw"];
        v.extend_from_slice(args);
        v.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let alice = EtcdProvider::connect(&format!(
        "etcd://alice:dlock-alice-pw@{}",
        member.endpoint()
    ))
    .await
    .unwrap();
    let other = EtcdProvider::connect(&format!("etcd://root:dlock-root-pw@{}", member.endpoint()))
        .await
        .unwrap();
    let name = Names::new().name("perm");
    let g = hold(&alice, &name).await;
    let revoke = root(&[
        "role",
        "revoke-permission",
        "locker",
        "--prefix=true",
        "dlock/",
    ]);
    member
        .etcdctl(&revoke.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let released = g.release().await;
    assert!(released.is_err(), "released without the permission");
    let lock = other.lock(&name, LockOptions::default()).unwrap();
    assert!(
        lock.try_acquire(Duration::from_millis(200))
            .await
            .unwrap()
            .is_none(),
        "the key is still there while it cannot be deleted"
    );
    let grant = root(&[
        "role",
        "grant-permission",
        "locker",
        "--prefix=true",
        "readwrite",
        "dlock/",
    ]);
    member
        .etcdctl(&grant.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    // Well within the provider's life and lease (10 s, kept alive all along).
    let g = must(
        Duration::from_secs(8),
        "the lock once the key could be deleted",
        lock.acquire(),
    )
    .await
    .unwrap();
    g.release().await.unwrap();
    drop(alice);
}
