//! Releasing and giving up: a release answers what became of its node, and neither a release
//! nor a cancelled acquisition leaves a node behind (the empty parents are containers, which
//! the server deletes).

use std::time::Duration;

use dlock_conformance::{Names, eventually, must};
use dlock_core::{Lease, LockOptions, LockProvider};
use dlock_zookeeper::ZkConfig;

use crate::support::server::PrivateZk;
use crate::support::{LIMIT, admin, await_nodes, hold, provider, recipe_children, url};

/// A release whose delete the server applied but whose answer was lost succeeds. The reply
/// is held back by a proxy until the node is gone on the server, then the connection is cut;
/// the client reconnects within its session and tries the delete again, and that NoNode is
/// the first delete's own, not a lost lock.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_whose_answer_was_lost_succeeds() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = dlock_proxy::Proxy::start(config.hosts[0].clone())
        .await
        .unwrap();
    let proxied = format!("zk://{}{}", proxy.addr(), config.chroot);
    let (p, admin) = (provider(&proxied).await, admin(&url).await);
    let name = Names::new().name("lost-answer");
    let path = p.lock_path(&name).unwrap();
    let g = hold(&p, &name).await;
    assert_eq!(recipe_children(&admin, &path).await.len(), 1);

    proxy.set_fault(dlock_proxy::Fault::Downstream);
    let release = tokio::spawn(g.release());
    await_nodes(&admin, &path, 0, "the server deleted the node").await;
    let session = p.session_id();
    proxy.reset();
    proxy.set_fault(dlock_proxy::Fault::None);
    let released = must(LIMIT, "the release", release).await.unwrap();
    assert!(
        released.is_ok(),
        "the release whose answer was lost: {released:?}"
    );
    assert_eq!(p.session_id(), session, "the same session throughout");
}

/// Waiters dropped at many moments (0..30 ms, and sub-millisecond) while another holds the
/// lock, or every permit of a semaphore, leave no node behind: only the holder's node (or
/// lease) is left, and the semaphore's internal mutex is free.
#[tokio::test(flavor = "multi_thread")]
async fn cancelled_creates_leave_no_znode() {
    let Some(url) = url() else { return };
    let (a, b, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let names = Names::new();
    let name = names.name("cancel-create");
    let sem_name = names.name("cancel-create-sem");
    let path = a.lock_path(&name).unwrap();
    let sem_path = a.lock_path(&sem_name).unwrap();
    let g = hold(&a, &name).await;
    let permit = a
        .semaphore(&sem_name, 1, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let holder = recipe_children(&admin, &path).await;
    assert_eq!(holder.len(), 1);
    let lease = recipe_children(&admin, &format!("{sem_path}/leases")).await;
    assert_eq!(lease.len(), 1);
    let cuts = (0..10u64)
        .map(|i| Duration::from_micros(i * 100))
        .chain((1..30u64).map(Duration::from_millis));
    for cut in cuts {
        // A fresh handle each time, so no re-entry state is shared.
        let lb = b.lock(&name, LockOptions::default()).unwrap();
        let r = tokio::time::timeout(cut, lb.acquire()).await;
        assert!(r.is_err(), "acquired a held lock");
        let rs = b.semaphore(&sem_name, 1, LockOptions::default()).unwrap();
        let r = tokio::time::timeout(cut, rs.acquire()).await;
        assert!(r.is_err(), "acquired the permit another holds");
    }
    eventually(LIMIT, "only the holders' nodes are left", || async {
        let now = recipe_children(&admin, &path).await;
        let locks = recipe_children(&admin, &format!("{sem_path}/locks")).await;
        let leases = recipe_children(&admin, &format!("{sem_path}/leases")).await;
        if now == holder && locks.is_empty() && leases == lease {
            Ok(())
        } else {
            Err(format!(
                "lock {now:?}; semaphore mutex {locks:?}, leases {leases:?}"
            ))
        }
    })
    .await;
    permit.release().await.unwrap();
    g.release().await.unwrap();
}

/// The parents dlock creates are containers, which the server deletes once they are empty,
/// not persistent nodes (which a client cannot tell apart by their stat, so the layout tests
/// cannot tell). On a private server whose container manager runs
/// every 100 ms, the lock's path and its nested parents are gone soon after the release; with
/// persistent parents they would stay for good.
#[tokio::test(flavor = "multi_thread")]
async fn released_locks_leave_their_containers_to_the_server() {
    if url().is_none() {
        return;
    }
    let Some(server) = PrivateZk::start().await else {
        return;
    };
    let url = server.url("");
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = "containers/a/b";
    let path = p.lock_path(name).unwrap();
    let g = p
        .lock(name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert_eq!(recipe_children(&admin, &path).await.len(), 1);
    g.release().await.unwrap();
    let top = path[..path.find("/a/").unwrap()].to_owned();
    eventually(LIMIT, "the empty containers are deleted", || async {
        let mut left = Vec::new();
        for node in [&path, &top] {
            if admin.check_stat(node).await.unwrap().is_some() {
                left.push(node.clone());
            }
        }
        if left.is_empty() { Ok(()) } else { Err(left) }
    })
    .await;
}

/// A hold leaked where no runtime runs (a plain thread) still ends at its lease's end: its
/// node is deleted on the runtime the provider was opened on, not left until the session
/// ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_hold_leaked_outside_a_runtime_ends_with_its_lease() {
    let Some(url) = url() else { return };
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("leaked-off-runtime");
    let path = p.lock_path(&name).unwrap();
    let lease = Lease::Fixed(Duration::from_secs(2));
    let g = p
        .lock(&name, LockOptions::new().with_lease(lease))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    await_nodes(&admin, &path, 1, "the hold's node").await;
    std::thread::spawn(move || {
        g.leak();
    })
    .join()
    .unwrap();
    await_nodes(&admin, &path, 0, "the leaked hold's node, after its lease").await;
}
