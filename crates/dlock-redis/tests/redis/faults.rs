//! Faults on a live server: killed connections, keys deleted behind a holder's back, restarts
//! with and without persistence, replies held back. Holders are told what they lost; waiters
//! wait through it and keep their place.

use crate::support::*;

/// The holder's connections are killed with CLIENT KILL: the client reconnects and the
/// watchdog keeps the hold (or, had it not reconnected in time, would report the loss).
#[tokio::test]
async fn killed_connections_recover_and_keep_the_hold() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let url = server.url();
    let p = RedisProvider::connect(&url).await.unwrap();
    let other = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("kill");
    let guard = p
        .lock(&name, watchdog(1500))
        .unwrap()
        .acquire()
        .await
        .unwrap();

    let mut c = admin(&url).await;
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut c)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut c)
        .await
        .unwrap();
    let ids: Vec<i64> = list
        .lines()
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .filter(|id| *id != me)
        .collect();
    let mut killed = 0;
    for id in ids {
        let n: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(&mut c)
            .await
            .unwrap();
        killed += n;
    }
    assert!(killed >= 2, "killed {killed} connections");

    // Three renewal periods later the hold is still ours, and exclusive.
    let lost = tokio::time::timeout(Duration::from_millis(1500 * 2), guard.lost()).await;
    assert!(
        lost.is_err(),
        "the watchdog should have recovered after the reconnect"
    );
    assert!(guard.is_held());
    let l2 = other.lock(&name, LockOptions::default()).unwrap();
    assert!(l2.try_acquire(Duration::ZERO).await.unwrap().is_none());
    guard.release().await.unwrap();
    assert!(
        l2.try_acquire(Duration::from_secs(2))
            .await
            .unwrap()
            .is_some()
    );
}

/// The lock key deleted behind the holder's back: `lost()` fires within one renewal period.
#[tokio::test]
async fn deleted_key_is_reported_within_one_renewal_period() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let p = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("deleted");
    let ttl = Duration::from_millis(3000);
    let guard = p
        .lock(&name, watchdog(3000))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let mut c = admin(&url).await;
    let _: () = c.del(&name).await.unwrap();
    let started = Instant::now();
    must(
        ttl / 3 + Duration::from_millis(500),
        "lost() after DEL",
        guard.lost(),
    )
    .await;
    assert!(started.elapsed() <= ttl / 3 + Duration::from_millis(500));
    assert!(!guard.is_held());
    assert!(matches!(
        guard.release().await,
        Err(dlock_core::Error::LockLost { .. })
    ));
}

/// The server forgot its scripts (`SCRIPT FLUSH`, as after a restart or a failover to a
/// replica that never ran them): each call that meets `NOSCRIPT` loads its script and is
/// sent again, and the caller sees only its answer. On a server of the test's own: a flush
/// of a shared one would fail other tests' calls between their load and their resend.
#[tokio::test]
async fn calls_load_their_scripts_again_after_a_script_flush() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let url = server.url();
    let p = RedisProvider::connect(&url).await.unwrap();
    let lock = p
        .lock(
            &Names::new().name("flushed"),
            LockOptions::new().with_lease(Lease::Fixed(Duration::from_secs(30))),
        )
        .unwrap();
    let held = lock.acquire().await.unwrap();
    let first = held.fencing_token();
    let c = admin(&url).await;
    // Flushes the server's scripts; then `call` must succeed, and have loaded its script.
    async fn after_a_flush<T>(
        server: &PrivateRedis,
        c: &redis::aio::MultiplexedConnection,
        call: impl std::future::Future<Output = T>,
    ) -> T {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut c.clone())
            .await
            .unwrap();
        let loads = server.calls("script|load").await;
        let answer = call.await;
        assert!(
            server.calls("script|load").await > loads,
            "no SCRIPT LOAD after the flush"
        );
        answer
    }
    after_a_flush(&server, &c, held.release()).await.unwrap();
    let guard = after_a_flush(&server, &c, lock.acquire()).await.unwrap();
    assert!(guard.fencing_token() > first);
    after_a_flush(&server, &c, guard.extend(Duration::from_secs(20)))
        .await
        .unwrap();
    after_a_flush(&server, &c, guard.release()).await.unwrap();
    let name = lock.name().as_str().to_owned();
    let status = after_a_flush(&server, &c, p.describe(&name)).await.unwrap();
    assert!(status.holders.is_empty());
}

/// Redis restarted without persistence during a hold: the hold is reported lost, and the
/// fencing counter went back to zero, so the next token is not higher than the last one.
#[tokio::test]
async fn restart_without_persistence_reports_loss_and_resets_tokens() {
    let Some(mut server) = PrivateRedis::start(false).await else {
        return;
    };
    let url = server.url();
    let p = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("restart");
    let lock = p.lock(&name, watchdog(1500)).unwrap();
    for _ in 0..3 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let guard = lock.acquire().await.unwrap();
    let before = guard.fencing_token();
    server.restart().await;
    must(
        Duration::from_secs(5),
        "lost() after the restart",
        guard.lost(),
    )
    .await;
    let g = RedisProvider::connect(&url)
        .await
        .unwrap()
        .lock(&name, LockOptions::default())
        .unwrap()
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the lock is free after the restart");
    assert!(
        g.fencing_token() <= before,
        "without persistence the counter restarts"
    );
    g.release().await.unwrap();
}

/// With AOF and `appendfsync always`, a restart keeps both the hold (the watchdog goes on
/// renewing it) and the fencing counter: the next token is higher.
#[tokio::test]
async fn restart_with_aof_keeps_the_hold_and_the_counter() {
    let Some(mut server) = PrivateRedis::start(true).await else {
        return;
    };
    let url = server.url();
    let p = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("restart-aof");
    let lock = p.lock(&name, watchdog(1500)).unwrap();
    let guard = lock.acquire().await.unwrap();
    let before = guard.fencing_token();
    server.restart().await;
    let lost = tokio::time::timeout(Duration::from_millis(3000), guard.lost()).await;
    assert!(lost.is_err(), "the persisted hold survives the restart");
    let other = RedisProvider::connect(&url).await.unwrap();
    let l2 = other.lock(&name, LockOptions::default()).unwrap();
    assert!(l2.try_acquire(Duration::ZERO).await.unwrap().is_none());
    guard.release().await.unwrap();
    let g = l2
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free after release");
    assert!(
        g.fencing_token() > before,
        "{} after {before}",
        g.fencing_token()
    );
    g.release().await.unwrap();
}

/// A semaphore counter deleted (or evicted) while a permit is held is created again without
/// that permit: a 1-permit semaphore never has two holders.
#[tokio::test]
async fn lost_semaphore_counter_does_not_over_grant() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let (a, b) = (
        RedisProvider::connect(&server.url()).await.unwrap(),
        RedisProvider::connect(&server.url()).await.unwrap(),
    );
    let name = Names::new().name("counter-lost");
    let opts = LockOptions::default();
    let held = a
        .semaphore(&name, 1, opts)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let _: () = admin(&server.url()).await.del(&name).await.unwrap();
    let other = b.semaphore(&name, 1, opts).unwrap();
    assert!(
        other.try_acquire(Duration::ZERO).await.unwrap().is_none(),
        "a second holder of a 1-permit semaphore"
    );
    held.release().await.unwrap();
    let g = other.try_acquire(Duration::from_secs(2)).await.unwrap();
    let g = g.expect("the permit is back");
    assert!(
        a.semaphore(&name, 1, opts)
            .unwrap()
            .try_acquire(Duration::ZERO)
            .await
            .unwrap()
            .is_none(),
        "the counter kept an extra permit"
    );
    g.release().await.unwrap();
}

/// A fair waiter keeps its place in the queue across transient errors. The first waiter's
/// connections go through a proxy that is cut (so it tries again at once) and then delays
/// every reply past its 300 ms response timeout, so its tries fail; the second waiter queued
/// behind it is untouched. Once the replies flow again and the holder lets go, the first
/// waiter gets the lock first (it did not leave the queue and queue again at the back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_keeps_its_place_across_transient_errors() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let (proxy, direct, flaky) = behind_proxy(&server, "?timeout_ms=300").await;
    let mut admin = admin(&server.url()).await;
    let monitor = Monitor::start(&server.url()).await;
    let name = Names::new().name("fair-place");
    let queue = format!("redisson_lock_queue:{{{name}}}");
    let fair = LockOptions::default().with_fair(true);
    // Warm up both providers: the scripts are loaded, the leave of a queue included (a
    // waiter that gives up), so a leave would run at once.
    let warm = Names::new().name("warm");
    for p in [&direct, &flaky] {
        let g = p.lock(&warm, fair).unwrap().acquire().await.unwrap();
        let other = if std::ptr::eq(p, &direct) {
            &flaky
        } else {
            &direct
        };
        let gave_up = other
            .lock(&warm, fair)
            .unwrap()
            .try_acquire(Duration::from_millis(1200))
            .await
            .unwrap();
        assert!(gave_up.is_none());
        g.release().await.unwrap();
    }
    let held = direct.lock(&name, fair).unwrap().acquire().await.unwrap();
    let queued = |n: usize| fair_queue_is(&admin, &name, n);
    let first_lock = flaky.lock(&name, fair).unwrap();
    let first = tokio::spawn(async move { first_lock.acquire().await });
    eventually(Duration::from_secs(10), "the first waiter queued", || {
        queued(1)
    })
    .await;
    let second_lock = direct.lock(&name, fair).unwrap();
    let second = tokio::spawn(async move { second_lock.acquire().await });
    eventually(Duration::from_secs(10), "the second waiter queued", || {
        queued(2)
    })
    .await;
    let head: Vec<String> = admin.lrange(&queue, 0, -1).await.unwrap();

    // Hold every reply to the first waiter back past its timeout, and wake it (a message on
    // its own channel): its tries run on the server and fail on the client.
    let field = head[0].clone();
    monitor.clear();
    proxy.set_fault(dlock_proxy::Fault::DelayReplies(Duration::from_millis(600)));
    eventually(
        Duration::from_secs(15),
        "the first waiter's tries fail",
        || {
            let (mut admin, field, name) = (admin.clone(), field.clone(), name.clone());
            let monitor = &monitor;
            async move {
                let tries = monitor
                    .calls
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|c| c.contains(&field))
                    .count();
                if tries >= 3 {
                    return Ok(());
                }
                let _: i64 = admin
                    .publish(format!("redisson_lock__channel:{{{name}}}:{field}"), "0")
                    .await
                    .map_err(|e| e.to_string())?;
                Err(format!("{tries} tries"))
            }
        },
    )
    .await;
    proxy.set_fault(dlock_proxy::Fault::None);
    let now: Vec<String> = admin.lrange(&queue, 0, -1).await.unwrap();
    assert_eq!(now, head, "the queue kept its order");

    held.release().await.unwrap();
    let g = must(Duration::from_secs(10), "the first waiter's grant", first)
        .await
        .unwrap()
        .unwrap();
    assert!(
        !second.is_finished(),
        "the second waiter got in before the first"
    );
    g.release().await.unwrap();
    must(Duration::from_secs(10), "the second waiter's grant", second)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Redis restarts (SIGKILL and a new process, no persistence: the hold is gone) while one
/// client holds and eight wait. Once the server is back, the holder is told within 1 s, all
/// eight waiters get the lock (one after another) within 1 s, and they do not poll in a loop:
/// the restarted server counts their script calls. A waiter neither fails ("broken pipe"),
/// nor pauses a second between tries, nor sleeps to its 5 s cap after subscribing again past
/// a release it did not hear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_a_restart_and_get_the_lock() {
    const WAITERS: usize = 8;
    let Some(mut server) = PrivateRedis::start(false).await else {
        return;
    };
    let url = server.url();
    let name = Names::new().name("restart-waiters");
    let holder = RedisProvider::connect(&url).await.unwrap();
    let g = holder
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let p = RedisProvider::connect(&url).await.unwrap();
        let name = name.clone();
        waiters.push(tokio::spawn(async move {
            let lock = p.lock(&name, LockOptions::default()).unwrap();
            match lock.try_acquire(Duration::from_secs(30)).await {
                Ok(Some(g)) => g.release().await.map_err(|e| format!("release: {e}")),
                Ok(None) => Err("gave up after 30 s".to_owned()),
                Err(e) => Err(format!(
                    "failed instead of waiting through the restart: {e}"
                )),
            }
        }));
    }
    // Every waiter is queued on the channel before the restart.
    eventually(Duration::from_secs(5), "every waiter subscribed", || {
        subscribed(&url, &name, i64::try_from(WAITERS).unwrap())
    })
    .await;
    // Down for 2.6 s: longer than any reconnect retry inside a single call, and long enough
    // that a waiter pausing up to 1 s between tries would try again only about a second after
    // the server is back.
    server.kill();
    tokio::time::sleep(Duration::from_millis(2600)).await;
    server.spawn().await;
    let back = Instant::now();
    let (told, all_held) = must(
        Duration::from_secs(30),
        "the holder told and every waiter served after the restart",
        async {
            tokio::join!(
                async {
                    g.lost().await;
                    back.elapsed()
                },
                async {
                    for w in waiters {
                        w.await.unwrap().unwrap();
                    }
                    back.elapsed()
                },
            )
        },
    )
    .await;
    let calls = {
        let stats = server.stats().await;
        stats.get("evalsha").copied().unwrap_or(0) + stats.get("eval").copied().unwrap_or(0)
    };
    eprintln!(
        "holder told after {told:?}, {WAITERS} waiters served after {all_held:?}, {calls} script calls"
    );
    assert!(
        told <= Duration::from_secs(1),
        "the holder was told {told:?} after the server was back"
    );
    assert!(
        all_held <= Duration::from_secs(1),
        "the last of {WAITERS} waiters got the lock {all_held:?} after the server was back"
    );
    // Each waiter: a try when the server is back, one after subscribing again, one when woken,
    // its release, and a few more for the holder's check and races (5 to 7 in all, measured):
    // a polling loop makes hundreds a second.
    assert!(
        calls <= 16 * u64::try_from(WAITERS).unwrap(),
        "{calls} script calls for {WAITERS} waiters after the restart"
    );
    assert_eq!(g.loss_reason(), Some(dlock_core::LossReason::Gone));
}

/// After a restart without persistence the holder is told at once, while another client
/// could already take the lock: here a fixed 60 s lease, which no renewal checks before its
/// end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_reports_loss_as_soon_as_the_server_is_back() {
    let Some(mut server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    let name = Names::new().name("restart-loss");
    let fixed = LockOptions::default().with_lease(Lease::Fixed(Duration::from_secs(60)));
    let g = p.lock(&name, fixed).unwrap().acquire().await.unwrap();
    // Killed (and reaped: its port is closed) and started again at once: the client's
    // connection ends with the old process, and the new one has no keys.
    server.kill();
    server.spawn().await;
    must(
        Duration::from_secs(3),
        "lost() within 3 s of the server being back",
        g.lost(),
    )
    .await;
    assert_eq!(g.loss_reason(), Some(dlock_core::LossReason::Gone));
    assert!(!g.is_held());
}

/// A hold taken away with no disconnection at all (here `FLUSHALL`; an eviction, a `DEL`
/// or a failover over a live connection alike) is noticed by the provider's periodic check,
/// well before the end of its fixed 60 s lease, which no renewal checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_taken_away_without_a_disconnection_is_noticed() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    let names = Names::new();
    let fixed = LockOptions::default().with_lease(Lease::Fixed(Duration::from_secs(60)));
    let gone = p
        .lock(&names.name("flushed"), fixed)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let mut c = admin(&server.url()).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
    // Taken again after the flush: the check must tell it from the flushed one.
    let kept = p
        .lock(&names.name("kept"), fixed)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    must(
        Duration::from_secs(30),
        "lost() of a flushed fixed-lease hold within 30 s (its lease is 60 s)",
        gone.lost(),
    )
    .await;
    assert_eq!(gone.loss_reason(), Some(dlock_core::LossReason::Gone));
    assert!(kept.is_held(), "a hold the flush did not take stays held");
    kept.release().await.unwrap();
}

/// The provider's connections carry TCP keepalive, so a peer that vanished without a reset (a
/// half-open connection behind a NAT) is noticed even on the subscription connection, which
/// only listens. Linux shows the keepalive timer in /proc/net/tcp (`tr` = 2).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn connections_carry_tcp_keepalive() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    // A waiter makes sure the subscription connection is open too.
    let name = Names::new().name("keepalive");
    let held = p
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let other = RedisProvider::connect(&server.url()).await.unwrap();
    let _ = other
        .lock(&name, LockOptions::default())
        .unwrap()
        .try_acquire(Duration::from_millis(200))
        .await
        .unwrap();
    let port = format!(":{:04X}", server.port);
    let timers: Vec<String> = std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Client ends of connections to the private server, established (st 01).
            (f.get(2)?.ends_with(&port) && f.get(3)? == &"01")
                .then(|| f.get(5).map(|t| (*t).to_owned()))?
        })
        .collect();
    assert!(timers.len() >= 4, "connections to the server: {timers:?}");
    assert!(
        timers.iter().all(|t| t.starts_with("02:")),
        "a connection without the keepalive timer: {timers:?}"
    );
    held.release().await.unwrap();
}

/// Fair acquires cancelled while their SUBSCRIBE is in flight leave no subscription on the
/// server. Replies come back 1 s late through a proxy, while requests reach the server at
/// once: each acquire is cancelled as soon as the server lists its channel (each fair waiter
/// has a channel of its own), before the answer and before the 500 ms after which a waiter
/// stops waiting for one. Every channel is then unsubscribed, within a deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_acquires_cancelled_mid_subscribe_leave_no_subscription() {
    const CANCELLED: usize = 1000;
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let (proxy, direct, slow) = behind_proxy(&server, "").await;
    let names = Names::new();
    let fair = LockOptions::default().with_fair(true);
    let mut held = Vec::new();
    let mut index = std::collections::HashMap::new();
    for i in 0..CANCELLED {
        let name = names.name(&format!("s{i}"));
        held.push(direct.lock(&name, fair).unwrap().acquire().await.unwrap());
        index.insert(name, i);
    }
    proxy.set_fault(dlock_proxy::Fault::DelayReplies(Duration::from_secs(1)));
    let mut tasks: Vec<_> = (0..CANCELLED)
        .map(|i| {
            let lock = slow.lock(&names.name(&format!("s{i}")), fair).unwrap();
            Some(tokio::spawn(async move { lock.acquire().await }))
        })
        .collect();
    // `redisson_lock__channel:{NAME}:<field>`, on this test's names only.
    let pattern = format!("redisson_lock__channel:{{{}*", names.prefix());
    let mut c = admin(&server.url()).await;
    let channels = |c: &mut redis::aio::MultiplexedConnection| {
        let pattern = pattern.clone();
        let mut c = c.clone();
        async move {
            redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg(pattern)
                .query_async::<Vec<String>>(&mut c)
                .await
                .unwrap()
        }
    };
    let mut left = CANCELLED;
    let deadline = Instant::now() + Duration::from_secs(300);
    while left > 0 {
        assert!(
            Instant::now() < deadline,
            "{left} acquires never subscribed"
        );
        for channel in channels(&mut c).await {
            let name = channel
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .map(|(name, _)| name);
            if let Some(task) = name
                .and_then(|n| index.get(n))
                .and_then(|&i| tasks[i].take())
            {
                task.abort();
                left -= 1;
            }
        }
        tokio::task::yield_now().await;
    }
    // The answers the cancelled acquires did not wait for, and the undo of each, need not
    // wait a second each.
    proxy.set_fault(dlock_proxy::Fault::None);
    eventually(
        Duration::from_secs(60),
        "no subscription left behind",
        || {
            let mut c = c.clone();
            let channels = &channels;
            async move {
                match channels(&mut c).await.len() {
                    0 => Ok(()),
                    n => Err(format!("{n} channels still subscribed")),
                }
            }
        },
    )
    .await;
    drop(held);
}

/// An UNSUBSCRIBE that fails (its answer comes after the response timeout: replies are
/// 3 s late through a proxy as the last waiter of a channel leaves) is sent again: the
/// provider ends with no subscription in its own count, instead of keeping the channel for
/// good, and none on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_unsubscribe_is_tried_again() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let (proxy, direct, slow) = behind_proxy(&server, "/?timeout_ms=1000").await;
    let name = Names::new().name("unsubscribe-retry");
    let held = direct
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let lock = slow.lock(&name, LockOptions::default()).unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await });
    let url = server.url();
    eventually(Duration::from_secs(10), "the waiter subscribed", || {
        subscribed(&url, &name, 1)
    })
    .await;
    // The provider counts the subscription once it reads the server's confirmation, which
    // may come after the server counts it.
    eventually(
        Duration::from_secs(10),
        "the provider counts the subscription",
        || {
            let slow = slow.clone();
            async move {
                match slow.subscriptions() {
                    1 => Ok(()),
                    n => Err(format!("{n} subscriptions")),
                }
            }
        },
    )
    .await;
    // The waiter leaves; its UNSUBSCRIBE reaches the server at once, and the answer, read by
    // the proxy before the fault is lifted, comes 3 s late: past the response timeout.
    proxy.set_fault(dlock_proxy::Fault::DelayReplies(Duration::from_secs(3)));
    waiting.abort();
    let _ = waiting.await;
    eventually(
        Duration::from_secs(10),
        "the UNSUBSCRIBE reached the server",
        || subscribed(&url, &name, 0),
    )
    .await;
    proxy.set_fault(dlock_proxy::Fault::None);
    eventually(
        Duration::from_secs(15),
        "the provider counts no subscription",
        || {
            let slow = slow.clone();
            async move {
                match slow.subscriptions() {
                    0 => Ok(()),
                    n => Err(format!("{n} subscriptions")),
                }
            }
        },
    )
    .await;
    subscribed(&url, &name, 0).await.unwrap();
    held.release().await.unwrap();
}

/// A fair waiter that died without leaving the queue (its process gone, its connection cut
/// before the leave could reach the server) keeps a free lock from the live waiter behind it
/// for its fair wait only: with `fair_wait_ms=30000` (a dlock-only queue) and a holder of a
/// 5 s fixed lease, the live waiter is granted well within a minute of the dead one's
/// enqueue. A short wait is safe for live waiters, which move their deadlines on (see the
/// next test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fair_waiter_blocks_a_free_lock_for_the_fair_wait_only() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let (proxy, _, doomed) = behind_proxy(&server, "?fair_wait_ms=30000").await;
    let direct = RedisProvider::connect(&format!("{}?fair_wait_ms=30000", server.url()))
        .await
        .unwrap();
    let admin = admin(&server.url()).await;
    let name = Names::new().name("dead-fair-waiter");
    let queued = |n: usize| fair_queue_is(&admin, &name, n);
    let fair = LockOptions::default().with_fair(true);
    let held = direct
        .lock(&name, fair.with_lease(Lease::Fixed(Duration::from_secs(5))))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let dead_lock = doomed.lock(&name, fair).unwrap();
    let dead = tokio::spawn(async move { dead_lock.acquire().await });
    eventually(Duration::from_secs(10), "the doomed waiter queued", || {
        queued(1)
    })
    .await;
    let enqueued = Instant::now();
    let live_lock = direct.lock(&name, fair).unwrap();
    let live = tokio::spawn(async move { live_lock.acquire().await });
    eventually(Duration::from_secs(10), "the live waiter queued", || {
        queued(2)
    })
    .await;
    // The doomed waiter's process dies: nothing it sends arrives any more, its leave included.
    proxy.set_fault(dlock_proxy::Fault::Partition);
    dead.abort();
    drop(doomed);
    let g = must(
        Duration::from_secs(60),
        "the live waiter behind a dead one gets the free lock",
        live,
    )
    .await
    .unwrap()
    .unwrap();
    eprintln!(
        "granted {:?} after the dead waiter queued",
        enqueued.elapsed()
    );
    g.release().await.unwrap();
    drop(held);
}

/// Live fair waiters keep their places however long the holder holds, past their fair
/// waits: each look moves a waiter's deadline on (here a fair wait of 3 s, six waiters, a
/// holder that holds 10 s on a 3 s watchdog lease, so the first deadlines pass while they
/// wait, and then six grants in a row, each taking a wait off every deadline). They are
/// granted in the order they queued: none is swept by another's look and queued again at
/// the back, which a deadline fixed at the enqueue, or moved to now plus the wait, allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_fair_waiters_keep_their_places_past_their_fair_wait() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let url = format!("{}?fair_wait_ms=3000&timeout_ms=1000", server.url());
    let h = RedisProvider::connect(&url).await.unwrap();
    let admin = admin(&server.url()).await;
    let name = Names::new().name("fair-places-long-hold");
    let queued = |n: usize| fair_queue_is(&admin, &name, n);
    let fair = LockOptions::default().with_fair(true);
    let held = h
        .lock(&name, watchdog(3000).with_fair(true))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 1..=6 {
        let p = RedisProvider::connect(&url).await.unwrap();
        let (lock, tx) = (p.lock(&name, fair).unwrap(), tx.clone());
        waiters.push(tokio::spawn(async move {
            let g = lock.acquire().await.unwrap();
            let _ = tx.send(i);
            g.release().await.unwrap();
            drop(p);
        }));
        eventually(Duration::from_secs(10), "the waiter queued", || queued(i)).await;
    }
    // Past every waiter's first deadline (3 s lease + 3 s a waiter from the first enqueue).
    let until = dlock_core::backend::later(Instant::now(), Duration::from_secs(10));
    while Instant::now() < until {
        assert!(held.is_held());
        let _ = tokio::time::timeout_at(until, held.lost()).await;
    }
    held.release().await.unwrap();
    must(Duration::from_secs(20), "every waiter is granted", async {
        for w in waiters {
            w.await.unwrap();
        }
    })
    .await;
    let granted: Vec<usize> = std::iter::from_fn(|| order.try_recv().ok()).collect();
    assert_eq!(granted, [1, 2, 3, 4, 5, 6], "a waiter lost its place");
}
