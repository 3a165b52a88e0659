//! Interop with a real Curator 5.4 peer: each kind excludes and wakes its Curator
//! counterpart on the same path, both ways.

use dlock_conformance::{Names, must};
use dlock_core::{LockOptions, LockProvider};

use crate::support::curator::{Peer, curator_classpath};
use crate::support::{LIMIT, ZERO, admin, await_nodes, provider, url};

/// Curator's `InterProcessMutex` and a dlock mutex on the same path exclude each other, both
/// ways, and wake each other.
#[tokio::test(flavor = "multi_thread")]
async fn curator_mutex_interop() {
    mutexes_exclude_each_other("interop/mutex", LockOptions::default()).await;
}

/// Curator's `InterProcessMutex` and a dlock mutex built `reentrant(false)` on the same path
/// exclude each other both ways: a non-reentrant dlock mutex is a `lock-` node like a
/// reentrant one. Each side's waiter is queued and still waiting while the other holds, and
/// gets in after its release. (Curator's own non-reentrant `InterProcessSemaphoreMutex` is a
/// one-lease semaphore to dlock.)
#[tokio::test(flavor = "multi_thread")]
async fn curator_mutex_and_a_non_reentrant_dlock_mutex_exclude_each_other() {
    let opts = LockOptions::new().with_reentrant(false);
    mutexes_exclude_each_other("interop/nonreentrant", opts).await;
}

/// A Curator mutex and a dlock mutex with `opts` on the path of `name`: while either holds,
/// the other cannot get in, and a waiter of either is queued, still waiting, and gets in
/// after the release.
async fn mutexes_exclude_each_other(name: &str, opts: LockOptions) {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name(name);
    let path = p.lock_path(&name).unwrap();
    let l = p.lock(&name, opts).unwrap();

    // Curator holds: dlock cannot get in; a dlock waiter queues and gets in after Curator's
    // release.
    let mut java = Peer::start(&url, &["mutex", &path, "60000"]).await;
    java.expect("WAITING").await;
    java.expect("ACQUIRED").await;
    assert!(
        l.try_acquire(ZERO).await.unwrap().is_none(),
        "dlock got in while Curator holds"
    );
    let waiter = {
        let l = p.lock(&name, opts).unwrap();
        tokio::spawn(async move { l.acquire().await })
    };
    await_nodes(&admin, &path, 2, "dlock queued behind Curator").await;
    assert!(!waiter.is_finished(), "dlock got in while Curator holds");
    java.release().await;
    let g = must(LIMIT, "dlock after Curator's release", waiter)
        .await
        .unwrap()
        .unwrap();

    // dlock holds: Curator's timed acquire fails, and a waiting Curator gets in after release.
    let mut java = Peer::start(&url, &["mutex", &path, "60000", "tryacquire", "300"]).await;
    java.expect("WAITING").await;
    java.expect("TIMEOUT").await;
    java.finish().await;
    let mut java = Peer::start(&url, &["mutex", &path, "60000", "tryacquire", "20000"]).await;
    java.expect("WAITING").await;
    await_nodes(&admin, &path, 2, "Curator queued behind dlock").await;
    java.still_waiting(&format!("Curator's mutex behind dlock's hold ({opts:?})"))
        .await;
    g.release().await.unwrap();
    java.expect("ACQUIRED").await;
    assert!(l.try_acquire(ZERO).await.unwrap().is_none());
    java.release().await;
    l.try_acquire(LIMIT)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A Curator writer against a dlock downgrade: dlock writes, takes the read lock too, and lets
/// the write go. A Curator writer that arrives then waits for dlock's read (a downgraded read
/// is a read like any other), and gets in once it is released.
#[tokio::test(flavor = "multi_thread")]
async fn curator_writer_waits_for_a_dlock_downgrade() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("interop/downgrade");
    let path = p.lock_path(&name).unwrap();
    let rw = p.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = rw.try_write(LIMIT).await.unwrap().expect("write");
    let r = rw
        .try_read(LIMIT)
        .await
        .unwrap()
        .expect("the writer reads too");
    w.release().await.unwrap();
    assert!(r.is_held(), "the downgraded read outlives the write");

    let mut java = Peer::start(&url, &["write", &path, "60000", "tryacquire", "20000"]).await;
    java.expect("WAITING").await;
    await_nodes(
        &admin,
        &path,
        2,
        "Curator's write queued behind dlock's read",
    )
    .await;
    java.still_waiting("a Curator writer during dlock's downgraded read")
        .await;
    r.release().await.unwrap();
    java.expect("ACQUIRED").await;
    assert!(
        rw.try_read(ZERO).await.unwrap().is_none(),
        "dlock read during Curator's write"
    );
    java.release().await;
}

/// Mixed read/write queues across the two clients: a dlock reader holds; a Curator writer
/// queues behind it; a dlock reader that arrives after the writer queues behind the writer
/// (readers do not pass a queued writer, in Curator's layout) and gets in only after the
/// writer has had its turn.
#[tokio::test(flavor = "multi_thread")]
async fn mixed_read_write_queues_with_curator() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let (p, p2, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("interop/queue");
    let path = p.lock_path(&name).unwrap();
    let rw = p.read_write_lock(&name, LockOptions::default()).unwrap();
    let r1 = rw.try_read(LIMIT).await.unwrap().expect("first read");

    let mut java = Peer::start(&url, &["write", &path, "60000", "tryacquire", "20000"]).await;
    java.expect("WAITING").await;
    await_nodes(
        &admin,
        &path,
        2,
        "Curator's write queued behind the first read",
    )
    .await;
    let late_reader = {
        let rw2 = p2.read_write_lock(&name, LockOptions::default()).unwrap();
        tokio::spawn(async move {
            let r = rw2.read().await?;
            r.release().await
        })
    };
    await_nodes(
        &admin,
        &path,
        3,
        "the late read queued behind Curator's write",
    )
    .await;
    java.still_waiting("Curator's write behind the first read")
        .await;
    assert!(
        !late_reader.is_finished(),
        "a read that came after a queued writer got in first"
    );

    r1.release().await.unwrap();
    java.expect("ACQUIRED").await;
    assert!(
        !late_reader.is_finished(),
        "a read got in during Curator's write"
    );
    java.release().await;
    must(LIMIT, "the late read after Curator's write", late_reader)
        .await
        .unwrap()
        .unwrap();
}

/// Curator's `InterProcessReadWriteLock` and dlock's read-write lock: writer against writer,
/// reader against writer, readers share — both ways.
#[tokio::test(flavor = "multi_thread")]
async fn curator_rwlock_interop() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let p = provider(&url).await;
    let name = Names::new().name("interop/rw");
    let path = p.lock_path(&name).unwrap();
    let rw = p.read_write_lock(&name, LockOptions::default()).unwrap();

    // Curator writes: dlock can neither write nor read.
    let mut java = Peer::start(&url, &["write", &path, "60000"]).await;
    java.expect("WAITING").await;
    java.expect("ACQUIRED").await;
    assert!(
        rw.try_write(ZERO).await.unwrap().is_none(),
        "write during Curator's write"
    );
    assert!(
        rw.try_read(ZERO).await.unwrap().is_none(),
        "read during Curator's write"
    );
    java.release().await;

    // Curator reads: dlock reads too, but cannot write.
    let mut java = Peer::start(&url, &["read", &path, "60000"]).await;
    java.expect("WAITING").await;
    java.expect("ACQUIRED").await;
    let r = rw.try_read(LIMIT).await.unwrap().expect("readers share");
    r.release().await.unwrap();
    assert!(
        rw.try_write(ZERO).await.unwrap().is_none(),
        "write during Curator's read"
    );
    java.release().await;

    // dlock writes: Curator can neither write nor read.
    let w = rw.try_write(LIMIT).await.unwrap().expect("write");
    for mode in ["write", "read"] {
        let mut java = Peer::start(&url, &[mode, &path, "60000", "tryacquire", "300"]).await;
        java.expect("WAITING").await;
        java.expect("TIMEOUT").await;
        java.finish().await;
    }
    w.release().await.unwrap();

    // dlock reads: Curator reads too, Curator's write waits until dlock's read is released.
    let r = rw.try_read(LIMIT).await.unwrap().expect("read");
    let mut reader = Peer::start(&url, &["read", &path, "60000", "tryacquire", "10000"]).await;
    reader.expect("WAITING").await;
    reader.expect("ACQUIRED").await;
    reader.release().await;
    let mut writer = Peer::start(&url, &["write", &path, "60000", "tryacquire", "300"]).await;
    writer.expect("WAITING").await;
    writer.expect("TIMEOUT").await;
    writer.finish().await;
    r.release().await.unwrap();
    let mut writer = Peer::start(&url, &["write", &path, "60000", "tryacquire", "10000"]).await;
    writer.expect("WAITING").await;
    writer.expect("ACQUIRED").await;
    writer.release().await;
}

/// Curator's `InterProcessSemaphoreV2` with N leases counts dlock's permits, and the other way
/// round.
#[tokio::test(flavor = "multi_thread")]
async fn curator_semaphore_interop() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let p = provider(&url).await;
    let name = Names::new().name("interop/sem");
    let path = p.lock_path(&name).unwrap();
    let sem = p.semaphore(&name, 2, LockOptions::default()).unwrap();

    // dlock holds both permits: Curator's timed acquire fails.
    let g1 = sem.try_acquire(LIMIT).await.unwrap().expect("permit 1");
    let g2 = sem.try_acquire(LIMIT).await.unwrap().expect("permit 2");
    let mut java = Peer::start(
        &url,
        &[
            "semaphore",
            &path,
            "60000",
            "tryacquire",
            "300",
            "permits",
            "2",
        ],
    )
    .await;
    java.expect("WAITING").await;
    java.expect("TIMEOUT").await;
    java.finish().await;

    // A waiting Curator gets the permit dlock releases; then dlock counts Curator's lease.
    let mut java = Peer::start(
        &url,
        &[
            "semaphore",
            &path,
            "60000",
            "tryacquire",
            "20000",
            "permits",
            "2",
        ],
    )
    .await;
    java.expect("WAITING").await;
    g1.release().await.unwrap();
    java.expect("ACQUIRED").await;
    assert!(
        sem.try_acquire(ZERO).await.unwrap().is_none(),
        "a 3rd permit of 2"
    );
    java.release().await;
    let g3 = sem
        .try_acquire(LIMIT)
        .await
        .unwrap()
        .expect("Curator's lease came back");
    g3.release().await.unwrap();
    g2.release().await.unwrap();
}
