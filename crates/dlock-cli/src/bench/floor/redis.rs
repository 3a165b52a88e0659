//! Redis's floor: the two EVALSHA of dlock's acquire and release scripts, on one multiplexed
//! connection.

use super::{Job, Timed, err, timed_since};

/// The floor's cycles on the Redis of the job's URL, on the name `<ns>/floor`.
pub(super) async fn timed(job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let (url, ns, start) = (job.url, job.ns, job.start);
    let client = redis::Client::open(url).map_err(|e| err("redis", "connect", e))?;
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| err("redis", "connect", e))?;
    let name = format!("{ns}/floor");
    let token = format!("redisson_lock_token:{{{name}}}");
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let (lock, unlock) = (
        dlock_redis::raw::lock_script(),
        dlock_redis::raw::unlock_script(),
    );
    // Each acquisition has a field of its own, as dlock's do: the release's latch is keyed
    // by it.
    let cycle = |c: &mut redis::aio::MultiplexedConnection, n: u64| {
        let mut c = c.clone();
        let (name, token, channel) = (name.clone(), token.clone(), channel.clone());
        let field = format!("f:{n}");
        let latch = format!("redisson_unlock_latch:{{{name}}}:{field}");
        async move {
            let _: redis::Value = lock
                .key(&name)
                .key(&token)
                .arg(30_000)
                .arg(&field)
                .invoke_async(&mut c)
                .await?;
            let _: redis::Value = unlock
                .key(&name)
                .key(&channel)
                .key(&latch)
                .arg(0)
                .arg(30_000)
                .arg(&field)
                .arg("publish")
                .arg(30_000)
                .invoke_async(&mut c)
                .await?;
            Ok::<_, redis::RedisError>(())
        }
    };
    cycle(&mut c, 0)
        .await
        .map_err(|e| err("redis", "warm-up", e))?;
    let started = start.go().await;
    for n in 1..=job.cycles {
        cycle(&mut c, n)
            .await
            .map_err(|e| err("redis", "cycle", e))?;
    }
    Ok(timed_since(started))
}

/// The clients the Redis of `url` counts, less the one asking.
pub(super) async fn connections(url: &str) -> Option<i64> {
    let client = redis::Client::open(url).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut c)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse::<i64>().ok())
        .map(|n| n - 1) // ourselves
}

/// The server's `used_memory`, bytes.
pub(super) async fn used_memory(url: &str) -> Option<i64> {
    let client = redis::Client::open(url).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut c)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse::<i64>().ok())
}
