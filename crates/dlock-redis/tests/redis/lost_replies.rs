//! Replies lost in flight (a paused server, a cut connection) make clients send an
//! acquisition again: the re-sent scripts leave one hold and no leaked permit.

use crate::support::*;

/// On a single server: the server is paused for writes
/// (`CLIENT PAUSE … WRITE`) while an acquire's script is in flight, so its answer comes after
/// the client's 200 ms response timeout, and the client sends the acquisition again (and its
/// undo) before the first one has run. When the server resumes, every queued copy runs: the
/// lock ends with exactly one hold count, released by one release, and a semaphore leaks no
/// permit. (A cluster client re-sends on its own; the scripts are the same.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_to_a_paused_server_leave_one_hold_and_no_leaked_permit() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let url = format!("{}?timeout_ms=200", server.url());
    replies_lost_leave_one_hold_and_no_leaked_permit(&server, &url).await;
}

/// On a cluster: the connection of an acquisition is cut
/// after the node ran its script and before the reply reached the client (the reply is held
/// back by a proxy, then the proxy closes the connection). The very same script is then sent
/// again, by the cluster client (a dropped connection is retried) or by dlock's own retry
/// after the error (same acquisition, same field); the node's MONITOR shows the repeat. The
/// cut is driven until an acquisition of the lock and of the semaphore has been re-sent, and
/// after every cut the lock has one hold count and the semaphore one permit taken: the
/// re-sent script found its own field or permit and changed nothing (with that check removed
/// from the scripts, the acquire does not finish).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_acquire_resent_after_a_cut_reply_leaves_one_hold_and_one_permit() {
    let Some((server, proxy)) = PrivateRedis::start_cluster_behind_proxy().await else {
        return;
    };
    let url = format!("redis://{}/?cluster=true", proxy.addr());
    let p = RedisProvider::connect(&url).await.unwrap();
    let mut admin = admin(&server.url()).await;
    let monitor = Monitor::start(&server.url()).await;
    let name = Names::new().name("cut");
    let sem_name = Names::new().name("cut-sem");
    let lock = p.lock(&name, LockOptions::default()).unwrap();
    let sem = p.semaphore(&sem_name, 1, LockOptions::default()).unwrap();
    // Load the scripts first: the cut is for the acquisition, not for SCRIPT LOAD.
    lock.acquire().await.unwrap().release().await.unwrap();
    sem.acquire().await.unwrap().release().await.unwrap();

    // Holds the replies back, waits until `ran` says the node did the work, then cuts every
    // connection (the held-back reply with it) and lets traffic through again.
    let watcher = admin.clone();
    let cut_after = |what: &'static str, ran: redis::Cmd| {
        let (proxy, admin) = (&proxy, watcher.clone());
        async move {
            eventually(Duration::from_secs(10), what, || {
                let (ran, mut admin) = (ran.clone(), admin.clone());
                async move {
                    let n: i64 = ran
                        .query_async(&mut admin)
                        .await
                        .map_err(|e| e.to_string())?;
                    if n > 0 { Ok(()) } else { Err(format!("{n}")) }
                }
            })
            .await;
            proxy.reset();
            proxy.set_fault(dlock_proxy::Fault::None);
        }
    };

    let mut lock_resent = 0;
    for _ in 0..20 {
        monitor.clear();
        proxy.set_fault(dlock_proxy::Fault::Downstream);
        let mut hlen = redis::cmd("HLEN");
        hlen.arg(&name);
        let (g, ()) = tokio::join!(
            must(
                Duration::from_secs(15),
                "the acquire across the cut",
                lock.acquire()
            ),
            cut_after("the node ran the acquisition", hlen),
        );
        lock_resent += monitor.resent_scripts();
        one_hold_then_free(&mut admin, &name, g.unwrap()).await;
        if lock_resent > 0 {
            break;
        }
    }
    assert!(
        lock_resent > 0,
        "the lock's script was never re-sent in 20 cuts"
    );

    let mut sem_resent = 0;
    for _ in 0..20 {
        monitor.clear();
        proxy.set_fault(dlock_proxy::Fault::Downstream);
        let mut taken = redis::cmd("ZCARD");
        // The permit's entry in the semaphore's timeout set (Redisson's `{name}:timeout`).
        taken.arg(format!("{{{sem_name}}}:timeout"));
        let (permit, ()) = tokio::join!(
            must(
                Duration::from_secs(15),
                "the permit across the cut",
                sem.acquire()
            ),
            cut_after("the node ran the permit's acquisition", taken),
        );
        sem_resent += monitor.resent_scripts();
        one_permit_then_back(&sem, permit.unwrap()).await;
        if sem_resent > 0 {
            break;
        }
    }
    assert!(
        sem_resent > 0,
        "the semaphore's script was never re-sent in 20 cuts"
    );
    let again = RedisProvider::connect(&url)
        .await
        .unwrap()
        .semaphore(&sem_name, 1, LockOptions::default())
        .unwrap()
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    assert!(again.is_some(), "the permit is free for anyone");
}

/// Pauses `server`'s writes past the response timeout of a provider on `url` while it
/// acquires a lock and then a permit, and counts what the re-sent calls left behind.
async fn replies_lost_leave_one_hold_and_no_leaked_permit(server: &PrivateRedis, url: &str) {
    let p = RedisProvider::connect(url).await.unwrap();
    let mut admin = admin(&server.url()).await;
    let name = Names::new().name("paused");
    let sem_name = Names::new().name("paused-sem");
    let lock = p.lock(&name, LockOptions::default()).unwrap();
    let sem = p.semaphore(&sem_name, 1, LockOptions::default()).unwrap();
    // Load the scripts first: the pause is for the acquisition, not for SCRIPT LOAD.
    lock.acquire().await.unwrap().release().await.unwrap();
    sem.acquire().await.unwrap().release().await.unwrap();
    let paused = admin.clone();
    let pause = |ms: u64| {
        let mut c = paused.clone();
        async move {
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(ms)
                .arg("WRITE")
                .query_async(&mut c)
                .await
                .unwrap();
        }
    };

    pause(1000).await;
    let g = must(
        Duration::from_secs(15),
        "the acquire across the pause",
        lock.acquire(),
    )
    .await
    .unwrap();
    one_hold_then_free(&mut admin, &name, g).await;

    pause(1000).await;
    let permit = must(
        Duration::from_secs(15),
        "the permit across the pause",
        sem.acquire(),
    )
    .await
    .unwrap();
    one_permit_then_back(&sem, permit).await;
    let other = RedisProvider::connect(url).await.unwrap();
    let again = other
        .semaphore(&sem_name, 1, LockOptions::default())
        .unwrap()
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    assert!(again.is_some(), "the permit is free for anyone");
}

/// After a fault during its acquisition: the lock `name` has one hold, counted once, and one
/// release of `g` frees it.
async fn one_hold_then_free(
    admin: &mut redis::aio::MultiplexedConnection,
    name: &str,
    g: dlock_core::LockGuard,
) {
    let counts: Vec<String> = redis::cmd("HVALS")
        .arg(name)
        .query_async(admin)
        .await
        .unwrap();
    assert_eq!(counts, ["1"], "one hold, counted once");
    g.release().await.unwrap();
    let left: bool = redis::cmd("EXISTS")
        .arg(name)
        .query_async(admin)
        .await
        .unwrap();
    assert!(!left, "one release frees the lock");
}

/// After a fault during its acquisition: the one-permit semaphore `sem` has its permit taken
/// once, and it is back after one release of `permit`.
async fn one_permit_then_back(sem: &dlock_core::DynSemaphore, permit: dlock_core::LockGuard) {
    assert_eq!(sem.available().await.unwrap(), 0, "one permit taken, once");
    permit.release().await.unwrap();
    eventually(Duration::from_secs(5), "the permit is back", || async {
        match sem.available().await {
            Ok(1) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// What a release retried after a connection error reports: the unlock's latch tells a retry
/// of a release that ran from one of a release that never did.
///
/// 1. The hold is gone (deleted, as a restart without persistence loses it) and the first try
///    never runs: the server holds writes back (`CLIENT PAUSE … WRITE`) while the test kills
///    the connection the unlock waits on, which drops it unrun. The retry finds nothing: the
///    release is `LockLost`, not a success.
/// 2. The first try runs and its reply is lost: a proxy holds the reply back until the hold
///    is gone from the server, then cuts the connection. The retry finds the latch the first
///    try left, and the release succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_release_tells_a_lost_hold_from_a_lost_reply() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let (proxy, direct, proxied) = behind_proxy(&server, "").await;
    let mut admin = admin(&server.url()).await;
    let fixed = LockOptions::new().with_lease(Lease::Fixed(Duration::from_secs(60)));
    let names = Names::new();

    let gone = names.name("retried-gone");
    let lock = direct.lock(&gone, fixed).unwrap();
    lock.acquire().await.unwrap().release().await.unwrap(); // loads the scripts
    let g = lock.acquire().await.unwrap();
    let _: i64 = admin.del(&gone).await.unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg(&["PAUSE", "20000", "WRITE"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let release = tokio::spawn(g.release());
    let blocked = eventually(
        Duration::from_secs(10),
        "the unlock waits behind the pause",
        || {
            let mut admin = admin.clone();
            async move {
                let list: String = redis::cmd("CLIENT")
                    .arg("LIST")
                    .query_async(&mut admin)
                    .await
                    .map_err(|e| e.to_string())?;
                list.lines()
                    .find(|l| l.contains(" flags=b ") && l.contains("cmd=evalsha"))
                    .and_then(|l| l.split(' ').find_map(|kv| kv.strip_prefix("id=")))
                    .map(str::to_owned)
                    .ok_or(list)
            }
        },
    )
    .await;
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "ID", blocked.as_str()])
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let released = must(Duration::from_secs(10), "the retried release", release)
        .await
        .unwrap();
    assert!(
        matches!(released, Err(dlock_core::Error::LockLost { .. })),
        "a release of a hold the store no longer had, retried: {released:?}"
    );

    let ran = names.name("retried-ran");
    let lock = proxied.lock(&ran, fixed).unwrap();
    lock.acquire().await.unwrap().release().await.unwrap(); // loads the scripts
    let g = lock.acquire().await.unwrap();
    proxy.set_fault(dlock_proxy::Fault::Downstream);
    let release = tokio::spawn(g.release());
    eventually(Duration::from_secs(10), "the server ran the unlock", || {
        let mut admin = admin.clone();
        let ran = ran.clone();
        async move {
            let n: i64 = admin.exists(&ran).await.map_err(|e| e.to_string())?;
            if n == 0 { Ok(()) } else { Err(format!("{n}")) }
        }
    })
    .await;
    proxy.reset();
    proxy.set_fault(dlock_proxy::Fault::None);
    let released = must(Duration::from_secs(10), "the retried release", release)
        .await
        .unwrap();
    assert!(
        released.is_ok(),
        "a release that ran and whose reply was lost, retried: {released:?}"
    );
}
