//! Round trips and wake-ups: an uncontended cycle is three calls in two round trips, a
//! semaphore's at most Curator's, and one release wakes one waiter.

use dlock_conformance::{Names, eventually, must};
use dlock_core::{LockOptions, LockProvider};
use dlock_zookeeper::zookeeper_client as zk;

use crate::support::{LIMIT, admin, ask, hold, last_cxid, provider, recipe_children, url};

/// An uncontended acquire + release is create + getChildren + delete and nothing more: counted
/// by the provider, and by the server (`cons`: the session's last client xid moves by 3).
#[tokio::test(flavor = "multi_thread")]
async fn uncontended_cycle_is_three_calls() {
    let Some(url) = url() else { return };
    let p = provider(&url).await;
    let name = Names::new().name("round-trips");
    let l = p.lock(&name, LockOptions::default()).unwrap();
    // Warm up: the first acquisition also creates the parents.
    l.acquire().await.unwrap().release().await.unwrap();
    for _ in 0..3 {
        let before = p.stats();
        let xid = last_cxid(&url, p.session_id()).await;
        let g = l.acquire().await.unwrap();
        g.release().await.unwrap();
        let after = p.stats();
        let server = last_cxid(&url, p.session_id()).await - xid;
        assert_eq!(after.creates - before.creates, 1, "{before:?} -> {after:?}");
        assert_eq!(after.get_children - before.get_children, 1);
        assert_eq!(after.deletes - before.deletes, 1);
        assert_eq!(after.calls() - before.calls(), 3, "{before:?} -> {after:?}");
        assert_eq!(
            after.round_trips - before.round_trips,
            2,
            "{before:?} -> {after:?}"
        );
        assert_eq!(server, 3, "requests the server saw for one cycle");
    }
}

/// Curator's `InterProcessSemaphoreV2` takes six round trips for a cycle: create and list the
/// internal mutex, create and list the lease, delete the mutex, and (the release) delete the
/// lease. dlock sends each create with the listings behind it, so an uncontended cycle is
/// four; with leases held by others, whose data must be read (do they count the same
/// permits?), the reads go out together: one more, however many leases there are.
#[tokio::test(flavor = "multi_thread")]
async fn a_semaphore_cycle_takes_fewer_round_trips_than_curators() {
    const CURATOR: u64 = 6;
    let Some(url) = url() else { return };
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("sem-round-trips");
    let s = p.semaphore(&name, 4, LockOptions::default()).unwrap();
    // Warm up: the first acquisition also creates the parents.
    s.acquire().await.unwrap().release().await.unwrap();
    let cycle = || async {
        let before = p.stats();
        let xid = last_cxid(&url, p.session_id()).await;
        s.acquire().await.unwrap().release().await.unwrap();
        let after = p.stats();
        let server = last_cxid(&url, p.session_id()).await - xid;
        (
            after.round_trips - before.round_trips,
            format!("{before:?} -> {after:?}, {server} requests on the server"),
        )
    };
    for _ in 0..3 {
        let (round_trips, seen) = cycle().await;
        assert_eq!(round_trips, 4, "{seen}");
        assert!(round_trips < CURATOR);
    }
    // Three leases of other participants (a Curator peer writes no permit count): their data
    // is read in one round trip.
    let leases = format!("{}/leases", p.lock_path(&name).unwrap());
    let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    for _ in 0..3 {
        let node = format!("{leases}/_c_{}-lease-", uuid::Uuid::new_v4());
        admin.create(&node, b"", &mode).await.unwrap();
    }
    for _ in 0..3 {
        let (round_trips, seen) = cycle().await;
        assert_eq!(round_trips, 5, "{seen}");
        assert!(round_trips < CURATOR);
    }
}

/// 8 waiters queued on one name: each release wakes exactly one waiter.
#[tokio::test(flavor = "multi_thread")]
async fn one_release_wakes_one_waiter() {
    const WAITERS: usize = 8;
    let Some(url) = url() else { return };
    let (h, w, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("herd");
    let path = h.lock_path(&name).unwrap();
    let holder = hold(&h, &name).await;
    let before = w.stats();
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let l = w.lock(&name, LockOptions::default()).unwrap();
        tasks.push(tokio::spawn(async move {
            let g = l.acquire().await.unwrap();
            g.release().await.unwrap();
        }));
    }
    // The server's own view too (the counts are the library's): its watches by path (`wchp`)
    // show one watched node per waiter, each a contender node. The library's count goes up
    // when a getData is sent, before the server has registered its watch: `wchp` is asked
    // again until it shows every watch.
    let watched = |wchp: &str| -> Vec<String> {
        wchp.lines()
            .filter(|l| l.starts_with('/') && l.contains(path.as_str()))
            .map(str::to_owned)
            .collect()
    };
    let wchp = eventually(LIMIT, "every waiter watches its predecessor", || async {
        let queued = recipe_children(&admin, &path).await.len();
        let watching = w.stats().get_data - before.get_data;
        let wchp = ask(&url, "wchp").await;
        let on_server = watched(&wchp).len();
        if queued == WAITERS + 1 && watching == WAITERS as u64 && on_server >= WAITERS {
            Ok(wchp)
        } else {
            Err(format!(
                "{queued} nodes, {watching} watches sent, {on_server} on the server"
            ))
        }
    })
    .await;
    assert_eq!(
        w.wakeups(),
        before.wakeups,
        "nobody woke while the holder held"
    );
    // No watch on the lock's node itself (a children watch there would wake every waiter at
    // each change), and no more than one per waiter.
    let watched = watched(&wchp);
    assert!(
        !watched.iter().any(|l| l.ends_with(path.as_str())),
        "a watch on the lock's node: {watched:?}"
    );
    assert_eq!(watched.len(), WAITERS, "watched nodes: {watched:?}");
    holder.release().await.unwrap();
    for t in must(LIMIT, "8 handoffs", futures::future::join_all(tasks)).await {
        t.unwrap();
    }
    assert_eq!(
        w.wakeups() - before.wakeups,
        WAITERS as u64,
        "one wake-up per handoff"
    );
}
