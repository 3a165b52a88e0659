//! How waiters are woken (one per release, by message, on one shared connection) and what a
//! cycle costs in round trips; a waiter never spins and never misses a release.

use crate::support::*;

/// An uncontended acquire + release is exactly two script calls and nothing else.
#[tokio::test]
async fn uncontended_cycle_is_two_script_calls() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    let lock = p
        .lock(&Names::new().name("rtt"), LockOptions::default())
        .unwrap();
    // Warm up: the first calls load the scripts (NOSCRIPT, SCRIPT LOAD).
    lock.acquire().await.unwrap().release().await.unwrap();
    let before = server.stats().await;
    for _ in 0..10 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let after = server.stats().await;
    // What the scripts run inside is counted too: leave those out, and INFO.
    let inner = [
        "type", "exists", "hexists", "hincrby", "incr", "pexpire", "del", "publish", "info",
        // The unlock's latch.
        "get", "set",
    ];
    let top_level: std::collections::BTreeMap<_, _> = after
        .iter()
        .filter(|(name, _)| !inner.contains(&name.as_str()))
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(
        top_level,
        [("evalsha".to_owned(), 20)].into_iter().collect(),
        "an uncontended cycle is two EVALSHA and nothing else"
    );
}

/// Eight queued waiters: each release wakes one waiter, so once they are queued the run costs
/// one acquire attempt per handoff (plus the releases), not eight (no herd).
#[tokio::test]
async fn no_herd_each_release_wakes_one_waiter() {
    for fair in [true, false] {
        let Some(server) = PrivateRedis::start(false).await else {
            return;
        };
        let url = server.url();
        let p = RedisProvider::connect(&url).await.unwrap();
        let name = Names::new().name("herd");
        let opts = LockOptions::new().with_fair(fair);
        let holder = p.lock(&name, opts).unwrap().acquire().await.unwrap();
        let mut waiters = Vec::new();
        for _ in 0..8 {
            let l = p.lock(&name, opts).unwrap();
            waiters.push(tokio::spawn(async move {
                let g = l.acquire().await.unwrap();
                g.release().await.unwrap();
            }));
        }
        // Settled: every waiter has made its two attempts (try, subscribe, try again).
        let settled = Instant::now() + Duration::from_millis(300);
        eventually(Duration::from_secs(10), "waiters settle", || {
            let p = p.clone();
            async move {
                let want = if fair { 8 } else { 1 };
                if p.subscriptions() == want && Instant::now() >= settled {
                    Ok(())
                } else {
                    Err(p.subscriptions())
                }
            }
        })
        .await;
        let before = server.calls("evalsha").await;
        holder.release().await.unwrap();
        for w in waiters {
            must(Duration::from_secs(10), "waiters finish", w)
                .await
                .unwrap();
        }
        let scripts = server.calls("evalsha").await - before;
        // 9 releases + 8 granted attempts; allow two spare attempts for a waiter that was
        // woken by a pass-on while the lock was busy again.
        assert!(
            scripts <= 9 + 8 + 2,
            "fair={fair}: {scripts} script calls for 8 handoffs"
        );
    }
}

/// All waiters of one provider share one subscription connection: 50 waiters on 50 names
/// make 50 subscriptions on the provider's single pub/sub connection (2 connections in all).
#[tokio::test]
async fn waiters_share_one_subscription_connection() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let url = server.url();
    let p = Arc::new(RedisProvider::connect(&url).await.unwrap());
    let names = Names::new();
    let holder = RedisProvider::connect(&url).await.unwrap();
    let mut guards = Vec::new();
    let mut waiters = Vec::new();
    for i in 0..50 {
        let name = names.name(&format!("n{i}"));
        guards.push(
            holder
                .lock(&name, LockOptions::default())
                .unwrap()
                .acquire()
                .await
                .unwrap(),
        );
        let l = p.lock(&name, LockOptions::default()).unwrap();
        waiters.push(tokio::spawn(async move {
            l.acquire().await.unwrap().release().await.unwrap()
        }));
    }
    eventually(Duration::from_secs(10), "50 subscriptions", || {
        let p = Arc::clone(&p);
        async move {
            if p.subscriptions() == 50 {
                Ok(())
            } else {
                Err(p.subscriptions())
            }
        }
    })
    .await;
    let mut c = admin(&url).await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut c)
        .await
        .unwrap();
    let pubsub = clients.lines().filter(|l| l.contains("flags=P")).count();
    assert_eq!(
        pubsub, 1,
        "one subscription connection for 50 waiters:\n{clients}"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    for w in waiters {
        must(Duration::from_secs(10), "waiters finish", w)
            .await
            .unwrap();
    }
}

/// A cluster's wake-ups follow `pubsub=` (Redis 6 clusters and Java clients with
/// `shardedSubscriptionMode=OFF` use PUBLISH/SUBSCRIBE). With `pubsub=classic` a release
/// reaches a plain SUBSCRIBE on any node (what such a Java client listens with) and wakes a
/// waiting dlock by its message; `auto` (sharded on this Redis 7) wakes its waiter by message
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wake_ups_follow_the_pubsub_mode() {
    use futures::StreamExt;
    let Some(url) = service_url("DLOCK_REDIS_CLUSTER_URL") else {
        return;
    };
    let node = url.split('?').next().unwrap().to_owned();
    for mode in ["classic", "auto"] {
        let with_mode = format!("{url}&pubsub={mode}");
        let holder = RedisProvider::connect(&with_mode).await.unwrap();
        let waiter = RedisProvider::connect(&with_mode).await.unwrap();
        let name = Names::new().name(&format!("pubsub-{mode}"));
        let channel = format!("redisson_lock__channel:{{{name}}}");
        let mut listener = redis::Client::open(node.as_str())
            .unwrap()
            .get_async_pubsub()
            .await
            .unwrap();
        listener.subscribe(&channel).await.unwrap();
        let mut messages = listener.into_on_message();

        let held = holder
            .lock(&name, LockOptions::default())
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let lock = waiter.lock(&name, LockOptions::default()).unwrap();
        let waiting = tokio::spawn(async move { lock.acquire().await });
        let subscribed = waiter.clone();
        eventually(Duration::from_secs(10), "the waiter subscribed", || {
            let p = subscribed.clone();
            async move {
                if p.subscriptions() == 1 {
                    Ok(())
                } else {
                    Err(format!("{} subscriptions", p.subscriptions()))
                }
            }
        })
        .await;
        let before = waiter.messages_delivered();
        held.release().await.unwrap();
        let g = must(Duration::from_secs(15), "the waiter's grant", waiting)
            .await
            .unwrap()
            .unwrap();
        assert!(
            waiter.messages_delivered() > before,
            "{mode}: the waiter was not woken by the release's message"
        );
        g.release().await.unwrap();
        let heard = tokio::time::timeout(Duration::from_millis(500), messages.next()).await;
        if mode == "classic" {
            let msg = heard
                .expect("a classic subscriber hears the release")
                .unwrap();
            assert_eq!(msg.get_channel_name(), channel);
        } else {
            assert!(
                heard.is_err(),
                "auto on Redis 7 publishes sharded, which a classic subscriber does not hear"
            );
        }
    }
}

/// No lost wake-ups under contention: 8 clients (8 subscription connections) on one name,
/// watchdog leases of 30 s. A waiter that misses its unlock message is woken only by its
/// recheck, 5 s later (the cap on every wait), so every acquire completing within 4 s shows
/// none was missed (for instance by a waiter that trusts a subscription whose UNSUBSCRIBE is
/// in flight). The handoffs are counted too: with every message lost, the waiters would still
/// finish, woken by their rechecks, but no message would have been delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lost_wakeups_under_contention() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    const CLIENTS: u64 = 8;
    const CYCLES: u64 = 150;
    // Shorter than the 5 s recheck that wakes a waiter whose message was lost.
    const BOUND: Duration = Duration::from_secs(4);
    let name = Names::new().name("wakeups");
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let p = RedisProvider::connect(&url).await.unwrap();
        let lock = p.lock(&name, LockOptions::default()).unwrap();
        clients.push(p);
        tasks.push(tokio::spawn(async move {
            for _ in 0..CYCLES {
                let g = must(BOUND, "an acquire under contention", lock.acquire())
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Nearly every release finds the other seven clients waiting, each subscribed on its own
    // connection (about 7 messages a release); one a release on average is a loose floor.
    let delivered: u64 = clients.iter().map(RedisProvider::messages_delivered).sum();
    assert!(
        delivered >= CLIENTS * CYCLES,
        "{delivered} unlock messages delivered for {} releases",
        CLIENTS * CYCLES
    );
}

/// A semaphore whose counter is 0 with no permit in the timeouts set (a Java `RSemaphore`
/// holds them all) has nothing to expire: its waiter waits for a message, it does not call
/// the script in a loop.
#[tokio::test]
async fn semaphore_waiter_with_nothing_expiring_does_not_spin() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    let name = Names::new().name("drained");
    let _: () = admin(&server.url()).await.set(&name, 0).await.unwrap();
    let sem = p.semaphore(&name, 1, LockOptions::default()).unwrap();
    // Warm up: the first calls load the scripts.
    let warm = p.semaphore(&Names::new().name("warm"), 1, LockOptions::default());
    warm.unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let (got, calls) = script_calls(&server, sem.try_acquire(Duration::from_secs(1))).await;
    assert!(got.unwrap().is_none(), "a permit of a drained semaphore");
    assert!(calls <= 5, "{calls} script calls in a 1 s wait");
}

/// A fair waiter behind a dead queue head, with the lock free, waits until the head's turn
/// ends (or a message); it does not call the script in a loop for up to the fair wait
/// (5 min).
#[tokio::test]
async fn fair_waiter_behind_a_dead_head_does_not_spin() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    let name = Names::new().name("dead-head");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut c = admin(&server.url()).await;
    let _: () = c
        .rpush(format!("redisson_lock_queue:{{{name}}}"), "dead:1")
        .await
        .unwrap();
    let _: () = c
        .zadd(
            format!("redisson_lock_timeout:{{{name}}}"),
            "dead:1",
            now + 60_000,
        )
        .await
        .unwrap();
    let opts = LockOptions::default().with_fair(true);
    // Warm up: the first calls load the scripts.
    let warm = p.lock(&Names::new().name("warm"), opts).unwrap();
    warm.acquire().await.unwrap().release().await.unwrap();
    let fair = p.lock(&name, opts).unwrap();
    let (got, calls) = script_calls(&server, fair.try_acquire(Duration::from_secs(1))).await;
    assert!(
        got.unwrap().is_none(),
        "granted past a queue head whose turn is not over"
    );
    assert!(calls <= 6, "{calls} script calls in a 1 s wait");
}

/// The fair queue's head is cancelled while the lock is free (here the holder's key
/// vanished without an unlock message); the waiter behind it must be woken at once, not sleep
/// until the timer it was given (the old holder's PTTL, capped at 5 s).
///
/// The head has a timer of its own (the same PTTL, capped at 5 s). On a slow machine it can
/// fire between the deletion and the abort, and the head then takes the free lock: the case it
/// sets up did not happen, so it is set up again on a fresh name (that is not a retry of a
/// failure: every attempt that gets as far as the abort is judged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_fair_head_wakes_the_next_waiter() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let url = server.url();
    let (x, w1, w2) = (
        RedisProvider::connect(&url).await.unwrap(),
        RedisProvider::connect(&url).await.unwrap(),
        RedisProvider::connect(&url).await.unwrap(),
    );
    let names = Names::new();
    let fair = LockOptions::default().with_fair(true);
    let mut c = admin(&url).await;
    for attempt in 1..=5 {
        let name = names.name(&format!("fair-head-leaves-{attempt}"));
        let held = x.lock(&name, fair).unwrap().acquire().await.unwrap();
        let head = w1.lock(&name, fair).unwrap();
        let first = tokio::spawn(async move { head.acquire().await });
        let queue = format!("redisson_lock_queue:{{{name}}}");
        let queued = |want: usize| {
            let c = c.clone();
            let queue = queue.clone();
            move || {
                let mut c = c.clone();
                let queue = queue.clone();
                async move {
                    let n: usize = c.llen(&queue).await.map_err(|e| e.to_string())?;
                    if n == want {
                        Ok(())
                    } else {
                        Err(n.to_string())
                    }
                }
            }
        };
        eventually(Duration::from_secs(5), "the head queued", queued(1)).await;
        let next = w2.lock(&name, fair).unwrap();
        let second = tokio::spawn(async move { next.acquire().await });
        eventually(
            Duration::from_secs(5),
            "the second waiter queued",
            queued(2),
        )
        .await;
        // The hold vanishes without a message, and the head is cancelled (its undo leaves the
        // queue in the background).
        let _: () = c.del(&name).await.unwrap();
        first.abort();
        match first.await {
            Err(e) => assert!(e.is_cancelled(), "the head's task: {e}"),
            Ok(won) => {
                // The head's own timer fired first and it took the lock: not the case under
                // test. Let the second waiter through and set it up again.
                won.unwrap().release().await.unwrap();
                let g = must(Duration::from_secs(5), "the second waiter", second).await;
                g.unwrap().unwrap().release().await.unwrap();
                drop(held);
                continue;
            }
        }
        let g = must(
            Duration::from_millis(1500),
            "the next waiter, woken when the head left",
            second,
        )
        .await
        .unwrap()
        .unwrap();
        g.release().await.unwrap();
        drop(held);
        return;
    }
    panic!("in 5 attempts the head's own timer took the lock before it could be cancelled");
}

/// A cluster node that loses a slot unsubscribes the slot's shard channels (`SUNSUBSCRIBE`
/// pushed over a connection that stays up: a resharding, a manual failover). The waiter
/// subscribes again once the slot is served, and the release wakes it by its message, not by
/// the 5 s recheck. Driven on a private one-node cluster: `CLUSTER DELSLOTS` of the name's
/// slot (the same unsubscription as a migration away), then `ADDSLOTS` back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_unsubscribed_by_the_server_subscribes_again() {
    let Some(server) = PrivateRedis::start_with(false, None, true).await else {
        return;
    };
    let url = format!(
        "redis://127.0.0.1:{}/?cluster=true&pubsub=auto",
        server.port
    );
    let holder = RedisProvider::connect(&url).await.unwrap();
    let waiter = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("unsubscribed");
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let held = holder
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let lock = waiter.lock(&name, LockOptions::default()).unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await });
    let mut c = admin(&server.url()).await;
    // Whether exactly `n` connections subscribe to the channel on the node.
    let probe = c.clone();
    let shard_subscribers = |n: i64| {
        let mut c = probe.clone();
        let channel = channel.clone();
        async move {
            let numsub: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("SHARDNUMSUB")
                .arg(&channel)
                .query_async(&mut c)
                .await
                .map_err(|e| e.to_string())?;
            match numsub.first() {
                Some((_, got)) if *got == n => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    };
    eventually(Duration::from_secs(10), "the waiter subscribed", || {
        shard_subscribers(1)
    })
    .await;
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&channel)
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg("DELSLOTS")
        .arg(slot)
        .query_async(&mut c)
        .await
        .unwrap();
    shard_subscribers(0).await.unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTS")
        .arg(slot)
        .query_async(&mut c)
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the cluster is ok", || {
        answers(&c, &["CLUSTER", "INFO"], "cluster_state:ok")
    })
    .await;
    eventually(
        Duration::from_secs(10),
        "the waiter subscribed again",
        || shard_subscribers(1),
    )
    .await;
    let before = waiter.messages_delivered();
    held.release().await.unwrap();
    let g = must(Duration::from_secs(15), "the waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        waiter.messages_delivered() > before,
        "the waiter was not woken by the release's message"
    );
    g.release().await.unwrap();
}
