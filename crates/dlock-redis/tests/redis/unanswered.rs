//! A store that does not answer, or refuses writes: an error that says so, never "held by
//! someone".

use crate::support::*;

/// A replica of the shared Sentinel deployment (`DLOCK_REDIS_SENTINEL_URL`, whose master has
/// one): its `redis://` URL, found through the Sentinels, confirmed by the replica itself.
async fn a_read_only_replica() -> Option<String> {
    let url = service_url("DLOCK_REDIS_SENTINEL_URL")?;
    let rest = url.trim_start_matches("redis+sentinel://");
    let (hosts, master) = rest.split_once('/').unwrap();
    let master = master.split(['/', '?']).next().unwrap();
    let sentinel = hosts.split(',').next().unwrap();
    let mut s = admin(&format!("redis://{sentinel}")).await;
    let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
        .arg("REPLICAS")
        .arg(master)
        .query_async(&mut s)
        .await
        .unwrap();
    for r in replicas {
        let field = |k: &str| {
            r.chunks(2)
                .find(|kv| kv[0] == k)
                .map(|kv| kv[1].clone())
                .unwrap_or_default()
        };
        let replica = format!("redis://{}:{}", field("ip"), field("port"));
        let Ok(c) = try_admin(&replica).await else {
            continue;
        };
        if answers(&c, &["INFO", "replication"], "role:slave")
            .await
            .is_ok()
        {
            return Some(replica);
        }
    }
    panic!("no replica of {master} answers as one");
}

/// A `redis://` URL that names a read-only replica: every acquisition is refused at once with
/// a non-retryable error that says so and says what to do, with a wait, without one, and for
/// `acquire()` (which would otherwise wait for ever); never "held by someone".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_is_refused_at_once_with_a_clear_error() {
    let Some(replica) = a_read_only_replica().await else {
        return;
    };
    let p = RedisProvider::connect(&replica).await.unwrap();
    let names = Names::new();
    let check = |r: dlock_core::Result<Option<dlock_core::LockGuard>>, what: &str| match r {
        Err(e) => {
            assert!(!e.is_retryable(), "{what}: {e}");
            let text = e.to_string();
            assert!(
                text.contains("read-only replica") && text.contains("master"),
                "{what}: {text}"
            );
        }
        Ok(g) => panic!(
            "{what}: answered {:?} by a replica",
            g.map(|g| g.fencing_token())
        ),
    };
    let lock = p
        .lock(&names.name("replica"), LockOptions::default())
        .unwrap();
    let started = Instant::now();
    check(
        lock.try_acquire(Duration::from_secs(3)).await,
        "try_acquire(3 s)",
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the refusal came after {:?}: it was retried",
        started.elapsed()
    );
    check(lock.try_acquire(Duration::ZERO).await, "try_acquire(0)");
    let forever = tokio::time::timeout(Duration::from_secs(5), lock.acquire())
        .await
        .expect("acquire() is refused, not retried for ever");
    check(forever.map(Some), "acquire()");
    let sem = p
        .semaphore(&names.name("replica-sem"), 2, LockOptions::default())
        .unwrap();
    check(sem.try_acquire(Duration::from_secs(1)).await, "permit");
}

/// A store that goes silent (a network cut that drops nothing and answers nothing) is an
/// error at the deadline, never "held by someone": nobody holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_through_a_silent_network_is_an_error_not_held() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    use dlock_conformance::Partition;
    // A short response timeout: every try fails well within the wait, so the answer at the
    // deadline is the acquisition's own, not the core's cut-off at the wait plus its grace.
    let sep = if url.contains('?') { '&' } else { '?' };
    let (cut, through) =
        dlock_conformance::ProxyPartition::start(&format!("{url}{sep}timeout_ms=150"), 6379)
            .await
            .unwrap();
    let p = RedisProvider::connect(&through).await.unwrap();
    let lock = p
        .lock(&Names::new().name("silent"), LockOptions::default())
        .unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    cut.set_partitioned(true);
    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let r = lock.try_acquire(wait).await;
    let took = started.elapsed();
    cut.set_partitioned(false);
    match r {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        Ok(g) => panic!(
            "a silent store answered {:?} after {took:?}",
            g.map(|g| g.fencing_token())
        ),
    }
    assert!(took >= wait, "gave up after {took:?}, before the wait");
}
