//! Redisson's layout: a dlock hold is what a Java client stores, and Java holds, releases and
//! waiters work with dlock's.

use crate::support::*;

/// A hold taken by dlock is exactly what Redisson stores: a hash at the name with one field
/// `<client uuid>:<id>` = 1 and a PEXPIRE; the release publishes "0" on Redisson's channel.
#[tokio::test]
async fn a_dlock_hold_looks_like_a_redisson_hold() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let p = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("layout");
    let lock = p.lock(&name, LockOptions::default()).unwrap();
    let guard = lock.acquire().await.unwrap();

    let mut c = admin(&url).await;
    let kind: String = redis::cmd("TYPE")
        .arg(&name)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(kind, "hash");
    let fields: Vec<(String, String)> = c.hgetall(&name).await.unwrap();
    assert_eq!(fields.len(), 1, "{fields:?}");
    let (field, count) = &fields[0];
    let (uuid, id) = field.rsplit_once(':').unwrap();
    assert_eq!(uuid, p.client_id());
    assert!(uuid::Uuid::parse_str(uuid).is_ok(), "{uuid}");
    assert!(id.parse::<u64>().is_ok(), "{id}");
    assert_eq!(count, "1");
    let pttl: i64 = c.pttl(&name).await.unwrap();
    assert!(
        pttl > 20_000 && pttl <= 30_000,
        "watchdog lease of 30 s, pttl {pttl}"
    );
    let token: u64 = c
        .get(format!("redisson_lock_token:{{{name}}}"))
        .await
        .unwrap();
    assert_eq!(token, guard.fencing_token().get());

    // The release publishes Redisson's unlock message on Redisson's channel.
    let mut sub = redis::Client::open(url.as_str())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    let channel = format!("redisson_lock__channel:{{{name}}}");
    sub.subscribe(&channel).await.unwrap();
    guard.release().await.unwrap();
    let msg = must(Duration::from_secs(5), "unlock message", async {
        use futures::StreamExt;
        sub.on_message().next().await.unwrap()
    })
    .await;
    assert_eq!(msg.get_channel_name(), channel);
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");
    let exists: bool = c.exists(&name).await.unwrap();
    assert!(!exists, "the hash is deleted on release");
}

/// A hold written the way Redisson writes it (HINCRBY of a foreign `uuid:thread` field plus
/// PEXPIRE) blocks dlock, and its unlock message (not the 30 s expiry) lets the waiter in.
#[tokio::test]
async fn a_redisson_hold_blocks_dlock_until_its_unlock_message() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let p = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("foreign");
    let mut c = admin(&url).await;
    let java = format!("{}:1", uuid::Uuid::new_v4());
    let _: i64 = c.hincr(&name, &java, 1).await.unwrap();
    let _: bool = c.pexpire(&name, 30_000).await.unwrap();

    let lock = p.lock(&name, LockOptions::default()).unwrap();
    assert!(
        lock.try_acquire(Duration::ZERO).await.unwrap().is_none(),
        "Redisson holds it"
    );
    let waiter = tokio::spawn(async move { lock.acquire().await });
    // Wait until the waiter is subscribed, then "unlock" the Java way.
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        let p = p.clone();
        async move {
            if p.subscriptions() == 1 {
                Ok(())
            } else {
                Err(p.subscriptions())
            }
        }
    })
    .await;
    let started = Instant::now();
    let _: () = c.del(&name).await.unwrap();
    let _: i64 = c
        .publish(format!("redisson_lock__channel:{{{name}}}"), "0")
        .await
        .unwrap();
    let guard = must(
        Duration::from_secs(10),
        "woken by the unlock message",
        waiter,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "woken by the message, not the TTL"
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// A dlock fair waiter queues in Redisson's queue and timeout set, and is woken on its own
/// channel, as a Java `RFairLock` waiter is.
#[tokio::test]
async fn fair_waiters_use_redissons_queue() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let p = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("fair-layout");
    let fair = LockOptions::new().with_fair(true);
    let holder = p.lock(&name, fair).unwrap().acquire().await.unwrap();
    let waiter_lock = p.lock(&name, fair).unwrap();
    let waiter = tokio::spawn(async move { waiter_lock.acquire().await });
    let mut c = admin(&url).await;
    let queue = format!("redisson_lock_queue:{{{name}}}");
    let queued: Vec<String> = eventually(Duration::from_secs(5), "the waiter queues", || {
        let mut c = c.clone();
        let queue = queue.clone();
        async move {
            let q: Vec<String> = c.lrange(&queue, 0, -1).await.map_err(|e| e.to_string())?;
            if q.len() == 1 {
                Ok(q)
            } else {
                Err(format!("{q:?}"))
            }
        }
    })
    .await;
    assert!(queued[0].starts_with(p.client_id()), "{queued:?}");
    let deadline: Option<f64> = c
        .zscore(format!("redisson_lock_timeout:{{{name}}}"), &queued[0])
        .await
        .unwrap();
    assert!(deadline.is_some(), "a deadline in the timeout set");
    holder.release().await.unwrap();
    let g = must(Duration::from_secs(5), "head waiter woken", waiter)
        .await
        .unwrap()
        .unwrap();
    let left: i64 = c.llen(&queue).await.unwrap();
    assert_eq!(left, 0);
    g.release().await.unwrap();
}

/// Every permit is held by a Java `RSemaphore` (Redisson's
/// layout: the counter at the name, no dlock permit in the timeouts set). A dlock waiter
/// sleeps (a few script calls, however long the wait) and takes the permit when the Java
/// holder returns it the way Redisson does (`INCRBY` and a message on `redisson_sc:{name}`):
/// woken by that message, not by a timer or a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_returned_by_a_java_holder_wakes_the_waiter() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    let mut java = admin(&server.url()).await;
    let name = Names::new().name("java-held");
    // Java took the only permit: the counter is 0.
    let _: () = java.set(&name, 0).await.unwrap();
    let warm = p.semaphore(&Names::new().name("warm"), 1, LockOptions::default());
    warm.unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let sem = p.semaphore(&name, 1, LockOptions::default()).unwrap();
    let before = server.calls("evalsha").await;
    let waiter = tokio::spawn(async move { sem.acquire().await });
    let channel = format!("redisson_sc:{{{name}}}");
    eventually(Duration::from_secs(10), "the waiter subscribed", || {
        let (mut c, channel) = (java.clone(), channel.clone());
        async move {
            let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut c)
                .await
                .map_err(|e| e.to_string())?;
            if n.first().is_some_and(|(_, n)| *n == 1) {
                Ok(())
            } else {
                Err(format!("{n:?}"))
            }
        }
    })
    .await;
    // A second of sleep: no polling meanwhile.
    let mut sleep = Box::pin(tokio::time::sleep(Duration::from_secs(1)));
    let mut waiter = waiter;
    tokio::select! {
        _ = &mut sleep => {}
        r = &mut waiter => panic!("granted a permit Java holds: {r:?}"),
    }
    let asleep = server.calls("evalsha").await - before;
    assert!(
        asleep <= 4,
        "{asleep} script calls while the permit was away"
    );
    let delivered = p.messages_delivered();

    // Java's release (RedissonSemaphore.releaseAsync): add the permit, announce the count.
    let returned = Instant::now();
    let _: () = redis::cmd("EVAL")
        .arg(
            "local value = redis.call('incrby', KEYS[1], ARGV[1]); \
             redis.call('publish', KEYS[2], value);",
        )
        .arg(2)
        .arg(&name)
        .arg(&channel)
        .arg(1)
        .query_async(&mut java)
        .await
        .unwrap();
    let permit = must(
        Duration::from_secs(10),
        "the permit after Java returned it",
        waiter,
    )
    .await
    .unwrap()
    .unwrap();
    eprintln!("granted {:?} after the Java release", returned.elapsed());
    assert!(
        p.messages_delivered() > delivered,
        "the waiter was not woken by the release's message"
    );
    let woken = server.calls("evalsha").await - before - asleep;
    assert!(
        woken <= 2,
        "{woken} script calls to take the returned permit"
    );
    permit.release().await.unwrap();
}

/// A holder key without a TTL (Java `clearExpire()`, a PERSIST) makes a waiter wait; the
/// acquire does not fail.
#[tokio::test]
async fn holder_without_ttl_makes_waiters_wait() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    let name = Names::new().name("no-ttl");
    let _: () = admin(&server.url())
        .await
        .hset(&name, "java-client:1", 1)
        .await
        .unwrap();
    let lock = p.lock(&name, LockOptions::default()).unwrap();
    let got = lock.try_acquire(Duration::from_millis(300)).await;
    assert!(matches!(got, Ok(None)), "{got:?}");
}
