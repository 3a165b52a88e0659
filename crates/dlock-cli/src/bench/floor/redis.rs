//! Redis's floor: the two EVALSHA of dlock's acquire and release scripts, on one multiplexed
//! connection.

use super::{Job, Timed, err, tasks_together, timed_since};

/// The floor's cycles on the Redis of the job's URL, on the name `<ns>/floor`.
pub(super) async fn timed(job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let (url, ns, start) = (job.url, job.ns, job.start);
    let mut c = connect(url).await?;
    let name = format!("{ns}/floor");
    cycle(&mut c, &name, 0)
        .await
        .map_err(|e| err("redis", "warm-up", e))?;
    let started = start.go().await;
    for n in 1..=job.cycles {
        cycle(&mut c, &name, n)
            .await
            .map_err(|e| err("redis", "cycle", e))?;
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
    tasks_together(tasks, cycles, move |task, n| {
        let (mut c, name) = (c.clone(), format!("{ns}/floor{task}"));
        async move {
            cycle(&mut c, &name, n)
                .await
                .map_err(|e| err("redis", "cycle", e))
        }
    })
    .await
}

/// One multiplexed connection to the Redis of `url`.
async fn connect(url: &str) -> dlock::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).map_err(|e| err("redis", "connect", e))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| err("redis", "connect", e))
}

/// One floor cycle on `name`: the two EVALSHA of dlock's acquire and release scripts, the
/// `n`th acquisition with a field of its own, as dlock's have (the release's latch is keyed
/// by it).
async fn cycle(
    c: &mut redis::aio::MultiplexedConnection,
    name: &str,
    n: u64,
) -> Result<(), redis::RedisError> {
    let token = format!("redisson_lock_token:{{{name}}}");
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let field = format!("f:{n}");
    let latch = format!("redisson_unlock_latch:{{{name}}}:{field}");
    let _: redis::Value = dlock_redis::raw::lock_script()
        .key(name)
        .key(&token)
        .arg(30_000)
        .arg(&field)
        .invoke_async(c)
        .await?;
    let _: redis::Value = dlock_redis::raw::unlock_script()
        .key(name)
        .key(&channel)
        .key(&latch)
        .arg(0)
        .arg(30_000)
        .arg(&field)
        .arg("publish")
        .arg(30_000)
        .invoke_async(c)
        .await?;
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
