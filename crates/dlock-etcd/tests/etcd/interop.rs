//! etcd's own lock beside dlock: `etcdctl lock` (Debian's etcd-client) and dlock exclude each
//! other both ways, on the same keys.

use std::time::Duration;

use dlock_conformance::{Names, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_etcd::EtcdProvider;
use tokio::time::Instant;

use crate::support::{SERIAL, await_queued, etcdctl_lock};

/// etcd's own lock and dlock on one name: each excludes the other, and a dlock waiter is
/// woken by the `etcdctl` holder's exit (its key's delete), not by its lease running out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_dlock_exclude_each_other() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let p = EtcdProvider::connect(&url).await.unwrap();
    let name = Names::new().name("etcdctl");
    let lock_name = p.config().etcd_lock_name(&name).unwrap();
    let lock = p.lock(&name, LockOptions::default()).unwrap();

    // etcdctl first: dlock waits, and gets the lock when etcdctl lets go.
    let mut ctl = etcdctl_lock(&url, &lock_name);
    let key = ctl
        .line(
            Duration::from_secs(10),
            "etcdctl takes the free lock",
            |_| true,
        )
        .await;
    assert!(
        key.starts_with(&format!("{lock_name}/")),
        "etcdctl's key {key} is under the lock name {lock_name}"
    );
    assert!(
        lock.try_acquire(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none(),
        "dlock got the lock etcdctl holds"
    );
    let waiter = tokio::spawn({
        let lock = std::sync::Arc::clone(&lock);
        async move {
            let g = lock.acquire().await.unwrap();
            (Instant::now(), g)
        }
    });
    await_queued(&url, &lock_name, 2, "the dlock waiter queues").await;
    let exit = Instant::now();
    ctl.signal("INT");
    // etcdctl revokes its session's lease on SIGINT: far sooner than that lease's 10 s.
    let (got, g) = must(
        Duration::from_secs(5),
        "the dlock waiter gets the lock etcdctl let go",
        waiter,
    )
    .await
    .unwrap();
    eprintln!(
        "dlock waiter granted {:?} after etcdctl's SIGINT",
        got - exit
    );
    let status = must(Duration::from_secs(5), "etcdctl exits", ctl.child.wait())
        .await
        .unwrap();
    assert!(
        status.success() || status.code().is_none() || status.code() == Some(130),
        "etcdctl: {status}"
    );

    // dlock first: etcdctl waits, and gets the lock when dlock releases.
    let mut ctl = etcdctl_lock(&url, &lock_name);
    await_queued(&url, &lock_name, 2, "etcdctl queues").await;
    let early = tokio::time::timeout(Duration::from_millis(500), ctl.lines.next_line()).await;
    assert!(
        early.is_err(),
        "etcdctl said it holds the lock dlock holds: {early:?}"
    );
    let token = g.fencing_token().get();
    g.release().await.unwrap();
    let key = ctl
        .line(
            Duration::from_secs(5),
            "etcdctl gets the lock dlock released",
            |_| true,
        )
        .await;
    assert!(key.starts_with(&format!("{lock_name}/")), "{key}");
    assert!(
        lock.try_acquire(Duration::ZERO).await.unwrap().is_none(),
        "dlock got the lock etcdctl holds"
    );
    ctl.signal("INT");
    must(Duration::from_secs(5), "etcdctl exits", ctl.child.wait())
        .await
        .unwrap();
    let g = must(
        Duration::from_secs(5),
        "dlock takes the lock again",
        lock.acquire(),
    )
    .await
    .unwrap();
    assert!(
        g.fencing_token().get() > token,
        "tokens grow across etcdctl's hold"
    );
    g.release().await.unwrap();
}
