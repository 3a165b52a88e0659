//! Replicas and Sentinel: grants and renewals that replicas acknowledged (`wait_replicas`),
//! Sentinels with passwords of their own, and a failover during contention.

use crate::support::*;

/// With `?wait_replicas=1`, `acquire` returns only once the replica has the grant (WAIT);
/// with the replica stopped (SIGSTOP), acquire fails with a retryable error and gives the
/// grant back, for a mutex and a semaphore alike, so no guard carries a grant a failover
/// could take back; and a renewal the replica does not acknowledge does not extend the
/// hold.
#[tokio::test(flavor = "multi_thread")]
async fn wait_replicas_returns_only_replicated_grants() {
    const LIMIT: Duration = Duration::from_secs(10);
    // Longer than one WAIT: the acquire gives its unacknowledged grant back and tries again
    // until its deadline, then fails with what the replicas said.
    const WAIT: Duration = Duration::from_secs(3);
    let Some(master) = PrivateRedis::start(false).await else {
        return;
    };
    let Some(replica) = PrivateRedis::replica_in_step(&master).await else {
        return;
    };
    let mut on_replica = admin(&replica.url()).await;
    // WAIT gets half the response timeout: 1.5 s, enough for a replica on a loaded machine,
    // and within the 2 s the core gives a call past a zero wait.
    let p = RedisProvider::connect(&format!("{}?wait_replicas=1&timeout_ms=3000", master.url()))
        .await
        .unwrap();
    let name = Names::new().name("replicated");
    let g = p
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    // Acknowledged: the replica has the hold the moment acquire returns.
    let exists: u32 = redis::cmd("EXISTS")
        .arg(&name)
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert_eq!(exists, 1, "the replica has the grant when acquire returns");
    g.release().await.unwrap();

    replica.signal("-STOP");
    let mut on_master = admin(&master.url()).await;
    let sem = Names::new().name("replicated-sem");
    let mutex = p.lock(&name, LockOptions::default()).unwrap();
    let permits = p.semaphore(&sem, 1, LockOptions::default()).unwrap();
    let tries = [
        must(LIMIT, "a mutex acquire fails", mutex.try_acquire(WAIT))
            .await
            .err(),
        must(
            LIMIT,
            "a semaphore acquire fails",
            permits.try_acquire(WAIT),
        )
        .await
        .err(),
    ];
    replica.signal("-CONT");
    for e in tries {
        let e = e.expect("no guard without the replica's acknowledgement");
        assert!(e.is_retryable(), "{e:?}");
        assert!(e.to_string().contains("replicas acknowledged"), "{e}");
    }
    // Given back on the master: the lock is free and no permit is taken.
    let held: u32 = redis::cmd("EXISTS")
        .arg(&name)
        .query_async(&mut on_master)
        .await
        .unwrap();
    assert_eq!(held, 0, "the unreplicated grant was given back");
    let taken: u32 = redis::cmd("ZCARD")
        .arg(format!("{{{sem}}}:timeout"))
        .query_async(&mut on_master)
        .await
        .unwrap();
    assert_eq!(taken, 0, "the unreplicated permit was given back");
    // And with the replica back, acquires succeed again.
    must(LIMIT, "acquire with the replica back", mutex.acquire())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Renewals too: with the replica stopped, a watchdog hold is not extended past what the
    // replica saw, so its holder is told it lost at its lease end (a renewal on the master
    // alone would keep the hold for good).
    let short = p.lock(&name, watchdog(600)).unwrap();
    let g = must(LIMIT, "acquire with the replica up", short.acquire())
        .await
        .unwrap();
    replica.signal("-STOP");
    let told = tokio::time::timeout(LIMIT, g.lost()).await;
    replica.signal("-CONT");
    assert!(
        told.is_ok(),
        "lost() without the replica's acknowledgements"
    );
    assert!(!g.is_held());
    // A cluster cannot route WAIT to each key's master: refused up front.
    let e =
        dlock_redis::RedisConfig::from_url("redis://127.0.0.1:7000/?cluster=true&wait_replicas=1")
            .unwrap_err();
    assert!(matches!(e, dlock_core::Error::Config { .. }), "{e:?}");
}

/// A write that waits for a stopped replica holds up no other call of the provider: the
/// `WAIT` runs on a connection of its own (the server reads nothing more from a connection
/// blocked in `WAIT`). Each `WAIT` here lasts 10 s (half the response timeout); the release
/// of an unrelated hold returns while one still blocks.
#[tokio::test(flavor = "multi_thread")]
async fn a_wait_for_a_stopped_replica_holds_up_no_other_call() {
    const LIMIT: Duration = Duration::from_secs(30);
    let Some(master) = PrivateRedis::start(false).await else {
        return;
    };
    let Some(replica) = PrivateRedis::replica_in_step(&master).await else {
        return;
    };
    let p = RedisProvider::connect(&format!(
        "{}?wait_replicas=1&timeout_ms=20000",
        master.url()
    ))
    .await
    .unwrap();
    let names = Names::new();
    let other = p
        .lock(&names.name("other"), LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    replica.signal("-STOP");
    let stuck = p
        .lock(&names.name("stuck"), LockOptions::default())
        .unwrap();
    let pending = tokio::spawn(async move { stuck.try_acquire(Duration::from_secs(5)).await });
    let on_master = admin(&master.url()).await;
    eventually(LIMIT, "a WAIT blocks on the master", || {
        answers(&on_master, &["INFO", "clients"], "blocked_clients:1")
    })
    .await;
    other.release().await.unwrap();
    let waiting = !pending.is_finished();
    let still = answers(&on_master, &["INFO", "clients"], "blocked_clients:1").await;
    replica.signal("-CONT");
    assert!(
        waiting,
        "the release returned only after the waiting acquire ended"
    );
    assert!(still.is_ok(), "the WAIT no longer blocks: {still:?}");
    let granted = must(LIMIT, "the waiting acquire ends", pending)
        .await
        .unwrap();
    if let Ok(Some(g)) = granted {
        g.release().await.unwrap();
    }
}

/// By default (`wait_replicas=auto`, as Redisson), a grant waits for one replica while the
/// master has one in step, and for nothing on a master without; an attempt that found the
/// lock busy wrote nothing and sends no `WAIT`; and a replica that stops drops out, so grants
/// go on without it.
#[tokio::test(flavor = "multi_thread")]
async fn by_default_a_grant_waits_for_a_replica_in_step() {
    const LIMIT: Duration = Duration::from_secs(30);
    let Some(master) = PrivateRedis::start(false).await else {
        return;
    };
    let names = Names::new();
    let name = names.name("auto");
    let alone = RedisProvider::connect(&master.url()).await.unwrap();
    let waits = master.calls("wait").await;
    let g = alone
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
    assert_eq!(master.calls("wait").await, waits, "no replica: no WAIT");

    let Some(replica) = PrivateRedis::replica_in_step(&master).await else {
        return;
    };
    let p = RedisProvider::connect(&master.url()).await.unwrap();
    let lock = p.lock(&name, LockOptions::default()).unwrap();
    let waits = master.calls("wait").await;
    let g = lock.acquire().await.unwrap();
    assert_eq!(master.calls("wait").await, waits + 1, "the grant waited");
    let mut on_replica = admin(&replica.url()).await;
    let exists: u32 = redis::cmd("EXISTS")
        .arg(&name)
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert_eq!(exists, 1, "the replica has the grant when acquire returns");
    let busy = lock.try_acquire(Duration::ZERO).await.unwrap();
    assert!(busy.is_none());
    assert_eq!(
        master.calls("wait").await,
        waits + 1,
        "a busy attempt sent a WAIT"
    );
    g.release().await.unwrap();

    replica.signal("-STOP");
    let granted = must(LIMIT, "a grant with the replica stopped", lock.acquire()).await;
    replica.signal("-CONT");
    granted.unwrap().release().await.unwrap();
}

/// Sentinels that require a password of their own: `sentinel_password` reaches them (the
/// URL's credentials are the master's), and without it the connect fails with an error that
/// does not show the password.
#[tokio::test]
async fn sentinels_with_a_password_of_their_own() {
    const NAME: &str = "dlock-auth";
    let Some(master) = PrivateRedis::start(false).await else {
        return;
    };
    let sentinel = PrivateSentinel::start_with(&master, NAME, Some("s3cret-sentinel")).await;
    eventually(
        Duration::from_secs(10),
        "the sentinel knows the master",
        || sentinel.master_port(NAME),
    )
    .await;
    let url = format!(
        "redis+sentinel://127.0.0.1:{}/{NAME}?sentinel_password=s3cret-sentinel",
        sentinel.port
    );
    let p = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("sentinel-auth");
    let g = p
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
    assert!(!format!("{p:?}").contains("s3cret"), "{p:?}");

    let without = format!("redis+sentinel://127.0.0.1:{}/{NAME}", sentinel.port);
    let e = RedisProvider::connect(&without).await.unwrap_err();
    let wrong = format!("{without}?sentinel_password=wrong-one");
    let e2 = RedisProvider::connect(&wrong).await.unwrap_err();
    for e in [e, e2] {
        let shown = format!("{e} {e:?}");
        assert!(
            !shown.contains("wrong-one") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
}

/// What the contenders of a failover saw, in the order they saw it.
#[derive(Default)]
struct Ledger {
    /// Who is inside now: (contender, token).
    inside: Option<(usize, u64)>,
    /// Each grant: (contender, token, when).
    grants: Vec<(usize, u64, Instant)>,
    /// Holders that found their hold lost when they left: their tokens.
    lost: std::collections::HashSet<u64>,
    /// (older token, newer token) of every grant made while someone else was inside.
    overlaps: Vec<(u64, u64)>,
    /// Errors that said a retry cannot help.
    fatal: Vec<String>,
}

/// A Sentinel failover during contention, with `wait_replicas=1`. A master,
/// two replicas and three Sentinels of our own; four clients contend for one lock through
/// `redis+sentinel://`; the master is killed (SIGKILL) and the Sentinels promote a replica.
/// No grant is made while another holder still believes it holds, fencing tokens only rise
/// across the failover (the token counter reached a replica before each grant was returned),
/// every error on the way says a retry can help, and every contender gets the lock again
/// on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover_during_contention_keeps_exclusion_and_token_order() {
    const NAME: &str = "dlockfailover";
    const LIMIT: Duration = Duration::from_secs(30);
    const CONTENDERS: usize = 4;
    let Some(mut master) = PrivateRedis::start(false).await else {
        return;
    };
    let replicas = [
        PrivateRedis::replica_of(&master).await.unwrap(),
        PrivateRedis::replica_of(&master).await.unwrap(),
    ];
    let mut sentinels = Vec::new();
    for _ in 0..3 {
        sentinels.push(PrivateSentinel::start(&master, NAME).await);
    }
    for s in &sentinels {
        eventually(LIMIT, "the sentinels reach a quorum", || s.quorum(NAME)).await;
    }
    let mut on_master = admin(&master.url()).await;
    eventually(LIMIT, "both replicas are online", || {
        answers(&on_master, &["INFO", "replication"], "connected_slaves:2")
    })
    .await;
    let _: () = redis::cmd("PING")
        .query_async(&mut on_master)
        .await
        .unwrap();
    let url = format!(
        "redis+sentinel://{}/{NAME}?wait_replicas=1&timeout_ms=1000",
        sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(",")
    );
    let name = Names::new().name("failover");
    let ledger = Arc::new(std::sync::Mutex::new(Ledger::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for id in 0..CONTENDERS {
        let p = RedisProvider::connect(&url).await.unwrap();
        let lock = p.lock(&name, watchdog(1000)).unwrap();
        let (ledger, stop) = (Arc::clone(&ledger), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let _client = p;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match lock.try_acquire(Duration::from_secs(2)).await {
                    Ok(Some(g)) => {
                        let token = g.fencing_token().get();
                        {
                            let mut l = ledger.lock().unwrap();
                            if let Some((_, older)) = l.inside {
                                l.overlaps.push((older, token));
                            }
                            l.inside = Some((id, token));
                            l.grants.push((id, token, Instant::now()));
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        {
                            let mut l = ledger.lock().unwrap();
                            if !g.is_held() {
                                l.lost.insert(token);
                            }
                            if l.inside == Some((id, token)) {
                                l.inside = None;
                            }
                        }
                        let _ = g.release().await;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        if !e.is_retryable() {
                            ledger.lock().unwrap().fatal.push(e.to_string());
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    let grants = || ledger.lock().unwrap().grants.len();
    eventually(LIMIT, "contention before the failover", || async {
        if grants() >= 20 {
            Ok(())
        } else {
            Err(grants())
        }
    })
    .await;

    let old = master.port;
    master.kill();
    // The Sentinels keep calling the old master's port; hold it, so no other test's server
    // that happens to get it is taken for the old master and turned into a replica.
    let _old_port = std::net::TcpListener::bind(("127.0.0.1", old)).ok();
    let killed = Instant::now();
    eventually(LIMIT, "a sentinel promotes a replica", || async {
        match sentinels[0].master_port(NAME).await {
            Ok(p) if p != old => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let promoted = Instant::now();
    eventually(
        LIMIT,
        "every contender gets the lock on the new master",
        || async {
            let l = ledger.lock().unwrap();
            let after: std::collections::HashSet<usize> = l
                .grants
                .iter()
                .filter(|(_, _, at)| *at > promoted)
                .map(|(id, _, _)| *id)
                .collect();
            if after.len() == CONTENDERS {
                Ok(())
            } else {
                Err(format!(
                    "contenders with a grant since the failover: {after:?}"
                ))
            }
        },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        must(LIMIT, "a contender stops", t).await.unwrap();
    }
    let l = ledger.lock().unwrap();
    let tokens: Vec<u64> = l.grants.iter().map(|(_, t, _)| *t).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens went backwards across the failover: {tokens:?}"
    );
    let unlost: Vec<_> = l
        .overlaps
        .iter()
        .filter(|(older, _)| !l.lost.contains(older))
        .collect();
    assert!(
        unlost.is_empty(),
        "granted while a holder that was never told it lost was inside: {unlost:?}"
    );
    assert!(
        l.fatal.is_empty(),
        "errors a retry cannot help: {:?}",
        l.fatal
    );
    eprintln!(
        "failover: {} grants, {} overlaps (all told lost), promoted {:?} after the kill",
        l.grants.len(),
        l.overlaps.len(),
        promoted - killed
    );
    drop(replicas);
}

/// An old master that stalled past `down-after` (SIGSTOP) while the Sentinels promoted its
/// replica, then resumed (SIGCONT), answers over its old connections as if nothing happened
/// until the Sentinels turn it into a replica. A provider that made no call meanwhile (so no
/// error told it the master moved) follows the Sentinels all the same, and after the resume
/// its acquisitions go to the new master: a name held there is refused, not granted a second
/// time on the old one. With the default `wait_replicas=0`, as users run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_old_master_that_resumes_grants_nothing() {
    const NAME: &str = "dlockstale";
    const LIMIT: Duration = Duration::from_secs(30);
    let Some(master) = PrivateRedis::start(false).await else {
        return;
    };
    let replica = PrivateRedis::replica_of(&master).await.unwrap();
    let mut sentinels = Vec::new();
    for _ in 0..3 {
        sentinels.push(PrivateSentinel::start(&master, NAME).await);
    }
    for s in &sentinels {
        eventually(LIMIT, "the sentinels reach a quorum", || s.quorum(NAME)).await;
    }
    let on_master = admin(&master.url()).await;
    eventually(LIMIT, "the replica is online", || {
        answers(&on_master, &["INFO", "replication"], "connected_slaves:1")
    })
    .await;
    let url = format!(
        "redis+sentinel://{}/{NAME}",
        sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(",")
    );
    let stale = RedisProvider::connect(&url).await.unwrap();
    let old = format!("127.0.0.1:{}", master.port);
    let new = format!("127.0.0.1:{}", replica.port);
    assert_eq!(stale.sentinel_master().as_deref(), Some(old.as_str()));

    master.signal("-STOP");
    eventually(LIMIT, "a sentinel promotes the replica", || async {
        match sentinels[0].master_port(NAME).await {
            Ok(p) if p == replica.port => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // The stale provider follows the Sentinels without a failed call to tell it (given up
    // after a deadline, not asserted yet: what follows shows what its lag costs).
    let followed = tokio::time::timeout(LIMIT, async {
        while stale.sentinel_master().as_deref() != Some(new.as_str()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok();
    let fresh = RedisProvider::connect(&url).await.unwrap();
    assert_eq!(fresh.sentinel_master().as_deref(), Some(new.as_str()));
    let name = Names::new().name("stale-master");
    let held = fresh
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();

    master.signal("-CONT");
    // At once, before the Sentinels can turn the old master into a replica.
    let second = stale
        .lock(&name, LockOptions::default())
        .unwrap()
        .try_acquire(Duration::ZERO)
        .await;
    assert!(
        matches!(second, Ok(None)),
        "a second holder beside the new master's: {second:?} (the provider's master: {:?})",
        stale.sentinel_master()
    );
    assert!(
        followed,
        "the provider never followed the Sentinels to {new}"
    );
    held.release().await.unwrap();
}
