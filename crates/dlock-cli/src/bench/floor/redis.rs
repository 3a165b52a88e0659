//! Redis's floor: the two EVALSHA of dlock's acquire and release scripts, on one multiplexed
//! connection.

use std::sync::Arc;

use super::super::measure::uuid_like;
use super::{Job, Timed, err, tasks_together, timed_since};

/// The floor's cycles on the Redis of the job's URL, on the name `<ns>/floor`.
pub(super) async fn timed(job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let (url, ns, start) = (job.url, job.ns, job.start);
    let mut c = connect(url).await?;
    let name = format!("{ns}/floor");
    let run = uuid_like();
    cycle(&mut c, &name, &run, 0).await?;
    let started = start.go().await;
    for n in 1..=job.cycles {
        cycle(&mut c, &name, &run, n).await?;
    }
    Ok(timed_since(started))
}

/// The W7 floor: `tasks` tasks on one multiplexed connection, each making `cycles` cycles on
/// `<ns>/floor<task>`, started together; their cycles per second, from the first start to the
/// last end.
pub(super) async fn shared(
    url: &str,
    tasks: u64,
    cycles: u64,
    ns: &str,
) -> dlock::Result<Option<f64>> {
    let c = connect(url).await?;
    let ns = ns.to_owned();
    let run: Arc<str> = uuid_like().into();
    tasks_together(tasks, cycles, move |task, n| {
        let (mut c, name, run) = (c.clone(), format!("{ns}/floor{task}"), Arc::clone(&run));
        async move { cycle(&mut c, &name, &run, n).await }
    })
    .await
}

/// One multiplexed connection to the Redis of `url`, with `TCP_NODELAY` as dlock's provider
/// of `url` sets it (`nodelay`, on by default): a socket option is no work of dlock's, and
/// on loopback it moves the client's CPU a command by a third under concurrency.
async fn connect(url: &str) -> dlock::Result<redis::aio::MultiplexedConnection> {
    use redis::IntoConnectionInfo;
    let nodelay = dlock_redis::RedisConfig::from_url(url)?.nodelay;
    let info = url
        .into_connection_info()
        .map_err(|e| err("redis", "connect", e))?;
    let tcp = info.tcp_settings().clone().set_nodelay(nodelay);
    let client =
        redis::Client::open(info.set_tcp_settings(tcp)).map_err(|e| err("redis", "connect", e))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| err("redis", "connect", e))
}

/// One floor cycle on `name`: the two EVALSHA of dlock's acquire and release scripts, the
/// `n`th acquisition of the floor's run `run` with a field of its own, as dlock's have. The
/// field must never repeat on a name: the release's latch is keyed by it and outlives the
/// cycle, so a release of a field used before would answer from its latch (as a release
/// does) and free nothing, and every later acquire would find the name held, a cheaper
/// cycle than dlock's. The grant's check is what catches that; the release's catches a
/// release that found nothing to release.
async fn cycle(
    c: &mut redis::aio::MultiplexedConnection,
    name: &str,
    run: &str,
    n: u64,
) -> dlock::Result<()> {
    let token = format!("redisson_lock_token:{{{name}}}");
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let field = format!("{run}:{n}");
    let latch = format!("redisson_unlock_latch:{{{name}}}:{field}");
    let redis_err = |e: redis::RedisError| err("redis", "cycle", e);
    let granted: redis::Value = dlock_redis::raw::lock_script()
        .key(name)
        .key(&token)
        .arg(30_000)
        .arg(&field)
        .invoke_async(c)
        .await
        .map_err(redis_err)?;
    // A grant is `{-1, token}`; anything else is a name held, and a cycle that did less
    // than dlock's.
    if !matches!(&granted, redis::Value::Array(a) if a.first() == Some(&redis::Value::Int(-1))) {
        return Err(err(
            "redis",
            "cycle",
            format!("{name:?} was not granted (the script answered {granted:?})"),
        ));
    }
    let released: redis::Value = dlock_redis::raw::unlock_script()
        .key(name)
        .key(&channel)
        .key(&latch)
        .arg(0)
        .arg(30_000)
        .arg(&field)
        .arg("publish")
        .arg(30_000)
        .invoke_async(c)
        .await
        .map_err(redis_err)?;
    if released != redis::Value::Int(1) {
        return Err(err(
            "redis",
            "cycle",
            format!("{name:?} was not released (the script answered {released:?})"),
        ));
    }
    Ok(())
}

/// The clients the Redis of `url` counts, less the one asking.
pub(super) async fn connections(url: &str) -> Option<i64> {
    info_number(url, "clients", "connected_clients")
        .await
        .map(|n| n - 1) // ourselves
}

/// The server's `used_memory`, bytes.
pub(super) async fn used_memory(url: &str) -> Option<i64> {
    info_number(url, "memory", "used_memory").await
}

/// The number `field` of the `section` of `INFO` on the Redis of `url`, asked on a connection
/// of its own.
async fn info_number(url: &str, section: &str, field: &str) -> Option<i64> {
    let client = redis::Client::open(url).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .ok()?;
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|n| n.trim().parse::<i64>().ok())
}
