//! Downgrades of PostgreSQL advisory read-write locks: the read on the write's own session.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{Lease, LockOptions, LockProvider};
use dlock_sql::SqlProvider;

use crate::support::*;

/// A downgrade on a PostgreSQL advisory read-write lock is granted on the write
/// hold's own session, even with another writer queued behind the write. A try
/// (`pg_try_advisory_lock_shared`) would be refused there (the server lets no new request
/// past a queued one it conflicts with), and a read on another session would wait for the
/// write: either way the writer could not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_downgrade_goes_ahead_of_a_queued_writer() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let (a, url) = advisory_rw(&pg).await;
    let b = SqlProvider::connect(&url).await.unwrap();
    let db = admin(&pg).await;
    let name = Names::new().name("downgrade-queued");
    let l = a.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = l.write().await.unwrap();
    let other = b.read_write_lock(&name, LockOptions::default()).unwrap();
    let queued = tokio::spawn(async move { other.write().await });
    eventually(Duration::from_secs(10), "the second writer waits", || {
        let db = db.clone();
        let name = name.clone();
        async move {
            match advisory_locks(&db, &name).await {
                (1, 1) => Ok(()),
                other => Err(other),
            }
        }
    })
    .await;
    let r = must(
        Duration::from_secs(5),
        "the downgrade",
        l.try_read(Duration::ZERO),
    )
    .await
    .unwrap()
    .expect("the writer may read, writers queued or not");
    w.release().await.unwrap();
    let status = a.describe(&name).await.unwrap();
    assert_eq!(
        status.kind,
        Some(dlock_core::LockKind::Read),
        "the read holds after the write's release: {status:?}"
    );
    assert!(
        !queued.is_finished(),
        "the queued writer got in beside a read"
    );
    r.release().await.unwrap();
    let g = must(Duration::from_secs(5), "the queued writer", queued)
        .await
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
}

/// A downgraded read lives on its write's session, so the end of that session
/// ends both holds, and both guards say so at once (not the read at its next renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_downgraded_read_is_lost_with_its_session() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let (a, url) = advisory_rw(&pg).await;
    let name = Names::new().name("downgrade-killed");
    let opts = LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(30)));
    let l = a.read_write_lock(&name, opts).unwrap();
    let w = l.write().await.unwrap();
    let r = l
        .try_read(Duration::ZERO)
        .await
        .unwrap()
        .expect("the downgrade");
    let id = a.holder_connection_id(&name).expect("the write's session");
    let db = admin(&pg).await;
    sqlx::query(&format!("SELECT pg_terminate_backend({id})"))
        .execute(&db)
        .await
        .unwrap();
    for (g, what) in [(&w, "the write"), (&r, "the downgraded read")] {
        must(
            Duration::from_secs(5),
            &format!("{what} reported lost, long before its first renewal (10 s)"),
            g.lost(),
        )
        .await;
        assert_eq!(
            g.loss_reason(),
            Some(dlock_core::LossReason::ConnectionLost),
            "{what}"
        );
    }
    let other = SqlProvider::connect(&url).await.unwrap();
    let g = other
        .read_write_lock(&name, LockOptions::default())
        .unwrap()
        .try_write(Duration::from_secs(3))
        .await
        .unwrap();
    assert!(g.is_some(), "free once the session is gone");
}

/// A downgrade dropped before its answer came (its statement runs on, in the task that holds
/// the session) gives back the read it is granted, and the write's session keeps only what
/// its guards hold. The next downgrade on that session runs after the dropped one's
/// statements (they hold the session), so once it is released the server shows the write's
/// lock alone.
///
/// The downgrade is polled once and dropped, on one thread, so that its task cannot have
/// run before the cut: `timeout(ZERO, ..)` is no such cut (tokio fires even a zero timeout on
/// the timer's next turn, and polls the future again first, so on a stalled machine the task
/// may have run and answered by then; on two threads it may run within the first poll).
#[tokio::test]
async fn postgres_dropped_downgrade_leaves_no_read() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let (a, _) = advisory_rw(&pg).await;
    let db = admin(&pg).await;
    let name = Names::new().name("downgrade-dropped");
    let l = a.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = l.write().await.unwrap();
    let mut downgrade = Box::pin(l.try_read(Duration::ZERO));
    let first =
        std::future::poll_fn(|cx| std::task::Poll::Ready(downgrade.as_mut().poll(cx))).await;
    assert!(
        first.is_pending(),
        "the downgrade finished in its first poll: {first:?}"
    );
    drop(downgrade);
    let r = l
        .try_read(Duration::ZERO)
        .await
        .unwrap()
        .expect("the downgrade");
    r.release().await.unwrap();
    assert_eq!(
        advisory_locks(&db, &name).await,
        (1, 0),
        "only the write's lock is left"
    );
    w.release().await.unwrap();
    assert_eq!(advisory_locks(&db, &name).await, (0, 0), "nothing is left");
}

/// A downgrade racing the write's release: the read must join its session under the
/// session's lock, or the write's release could come first, take itself for the last hold
/// and put the session back (`pg_advisory_unlock_all` frees the read too), leaving a read
/// guard that says held with no lock on the server. A session put back takes no more holds
/// (the read is then taken like any other). The releases start a little later each time, to
/// meet the downgrade at every point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_downgrade_racing_the_writes_release_is_held_for_real() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let (a, _) = advisory_rw(&pg).await;
    let db = admin(&pg).await;
    let names = Names::new();
    for i in 0..100u64 {
        let name = names.name(&format!("race-{i}"));
        let l = a.read_write_lock(&name, LockOptions::default()).unwrap();
        let w = l.write().await.unwrap();
        let delay = Duration::from_micros((i % 25) * 120);
        let release = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            w.release().await
        });
        let r = l.try_read(Duration::from_secs(5)).await.unwrap();
        release.await.unwrap().unwrap();
        let r = r.expect("a read once the write is released");
        if r.is_held() {
            let (granted, _) = advisory_locks(&db, &name).await;
            assert_eq!(
                granted, 1,
                "try {i}: a read guard held with no lock on the server"
            );
        }
        r.release().await.unwrap();
    }
}
