//! The Lua scripts, which follow Redisson's so that Java `RLock`, `RFencedLock`,
//! `RReadWriteLock` and `RPermitExpirableSemaphore` holders and dlock holders exclude and wake
//! each other: one module per primitive ([`mutex`], [`rwlock`], [`semaphore`]), beside the
//! primitive's own file, and here what they share.
//!
//! Replies: acquisitions return `{-1, token}` when granted and `{pttl, -1}` when not (Redisson's
//! fenced-lock convention); unlocks return nil (not the owner), 0 (still held) or 1 (released),
//! and the same again when sent twice ([`latched`]); renewals return 1 (renewed) or 0 (not
//! held).
//!
//! Every acquire script is idempotent: each acquisition has a field (or permit id) of its own,
//! so finding it already there means the script ran before for this very acquisition (a
//! client library re-sent it after a timeout): the reply is `{-5, -1}` and nothing changes.
//! The caller then gives the hold back and tries again, since the first run's token is lost.
//!
//! Kinds on one name exclude each other. A mutex hold (a hash without a `mode` field, dlock's
//! or a Java `RLock`'s) and a read-write hold (a hash with `mode`) share the key: a read or
//! write acquire treats a hash without `mode` as held, and the mutex acquire treats any hash
//! as held. A semaphore's counter is a string at the same key, which no lock script can wait
//! on: an acquire that finds the other kind's key type answers `{-6, type}` before it changes
//! anything, and the caller refuses the request. Release, renewal and check scripts that find
//! a key of another type answer "not held" (the hold is gone: the other kind could only create
//! its key once ours had ended).

use std::sync::LazyLock;

use redis::Script;

pub(crate) mod election;
pub(crate) mod mutex;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

/// An unlock script that can be sent twice (Redisson's unlock latch): after the script's own
/// `keys` keys comes the latch of this release (`redisson_unlock_latch:{name}:<request id>`),
/// and after its own arguments how long the latch lives (ms). A run that released leaves its
/// answer in the latch; a second run of the same release (a client retrying after a lost
/// reply, a cluster client re-sending after a dropped connection) answers that and changes
/// nothing. So "not held" on a retry means the hold was gone, never that the first try
/// released it. A call with another number of keys (one without a latch) is refused: its
/// last key would be taken for the latch. `body` is the unlock itself; its `return`s are its
/// answer.
pub(crate) fn latched(keys: usize, body: &str) -> String {
    let latch = keys + 1;
    format!(
        r"if #KEYS ~= {latch} then
  return redis.error_reply('dlock unlock: expected {keys} keys and the unlock latch')
end
local latch = KEYS[{latch}]
local done = redis.call('get', latch)
if done then
  return tonumber(done)
end
local released = (function()
{body}
end)()
if released ~= nil then
  redis.call('set', latch, released, 'px', ARGV[#ARGV])
end
return released
"
    )
}

/// The server's clock in epoch milliseconds, as a Lua expression. Every deadline in the fair
/// queue and the semaphore's timeouts set is computed with it, not with the client's clock,
/// so a client whose clock runs ahead cannot reclaim a live permit or sweep a live waiter.
/// Scripts may read TIME since Redis 5 (effects replication).
pub(crate) const SERVER_NOW: &str = "(function() local t = redis.call('TIME') \
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) end)()";

/// The check of the key's type that opens the hash kinds' acquire scripts, before anything
/// changes: a semaphore's counter (or any key but a hash) at the name is another kind in use,
/// answered `{-6, type}`. Leaves the type in `kind`.
pub(crate) const HASH_KIND: &str = r"
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return {-6, kind}
end
";

/// An acquire script's idempotence check: the acquisition's own field (`ARGV[2]`) already in
/// the hash means the script ran before for this very acquisition, answered `{-5, -1}`.
pub(crate) const RAN_BEFORE: &str = r"if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  return {-5, -1}
end
";

/// The release of one hold count of the field `ARGV[3]` (a mutex, fair or write hold), in
/// the unlock scripts: while counts are left, the hash gets the lease `ARGV[2]` again and the
/// script answers 0 (still held). Leaves the count in `left`.
pub(crate) const RELEASE_ONE: &str = r"local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
";

/// Whether a hold is still in the store, after a disconnection. KEYS: the lock's hash (or a
/// semaphore's timeouts set). ARGV: the hold's field (or permit id), `zset` for a permit.
pub(crate) static HELD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if ARGV[2] == 'zset' then
  if redis.call('zscore', KEYS[1], ARGV[1]) == false then return 0 end
  return 1
end
if redis.call('type', KEYS[1])['ok'] ~= 'hash' then return 0 end
return redis.call('hexists', KEYS[1], ARGV[1])
",
    )
});

/// What is stored for a lock, for inspection. KEYS: name, token. Returns
/// `{type, pttl, token or nil, hash fields, mode or nil}`.
pub(crate) static DESCRIBE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kind = redis.call('type', KEYS[1])['ok']
local fields = {}
local mode = false
if kind == 'hash' then
  fields = redis.call('hkeys', KEYS[1])
  mode = redis.call('hget', KEYS[1], 'mode')
end
return {kind, redis.call('pttl', KEYS[1]), redis.call('get', KEYS[2]), fields, mode}
",
    )
});

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use redis::Script;

    use super::mutex::LOCK;
    use super::rwlock::{READ_LOCK, WRITE_LOCK};
    use super::semaphore::SEM_ACQUIRE;
    use crate::keys::Keys;

    /// The test's own connection, with the library's default patience (5 s) rather than
    /// redis-rs's (500 ms for an answer), which a loaded machine exceeds.
    async fn test_connection(url: &str) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(std::time::Duration::from_secs(5)))
            .set_connection_timeout(Some(std::time::Duration::from_secs(5)));
        redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    }

    /// `command` with `args`, on the test's connection.
    async fn query<T: redis::FromRedisValue>(
        c: &mut redis::aio::MultiplexedConnection,
        command: &str,
        args: &[&str],
    ) -> T {
        redis::cmd(command).arg(args).query_async(c).await.unwrap()
    }

    /// A connection to the server at `DLOCK_REDIS_URL` and the keys of a fresh name that
    /// starts with `prefix`; `None` (skip) without a server.
    async fn fresh(prefix: &str) -> Option<(redis::aio::MultiplexedConnection, Keys)> {
        let url = dlock_conformance::service_url("DLOCK_REDIS_URL")?;
        let name = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
        Some((test_connection(&url).await, Keys::new(&name)))
    }

    /// Every acquire script run twice for one acquisition (as a client library re-sends it
    /// after a timeout) changes nothing the second time: no second hold count, no second
    /// permit. Against the server at `DLOCK_REDIS_URL`.
    #[tokio::test]
    async fn acquire_scripts_are_idempotent() {
        let Some((mut c, k)) = fresh("idempotent").await else {
            return;
        };
        let conn = c.clone();
        let twice =
            move |script: &'static LazyLock<Script>, keys: Vec<String>, args: Vec<Vec<u8>>| {
                let mut c = conn.clone();
                async move {
                    let mut replies = Vec::new();
                    for _ in 0..2 {
                        let mut inv = script.prepare_invoke();
                        for key in &keys {
                            inv.key(key);
                        }
                        for arg in &args {
                            inv.arg(arg.as_slice());
                        }
                        let reply: Vec<i64> = inv.invoke_async(&mut c).await.unwrap();
                        replies.push(reply);
                    }
                    replies
                }
            };
        let field = b"client:1".to_vec();
        let lease = b"30000".to_vec();

        let r = twice(
            &LOCK,
            vec![k.name.clone(), k.token.clone()],
            vec![lease.clone(), field.clone()],
        )
        .await;
        assert_eq!(r[0][0], -1, "granted");
        assert_eq!(r[1], vec![-5, -1], "the second run finds the hold");
        let count: i64 = query(&mut c, "HGET", &[&k.name, "client:1"]).await;
        assert_eq!(count, 1, "one hold count");
        let _: () = query(&mut c, "DEL", &[&k.name]).await;

        let w = twice(
            &WRITE_LOCK,
            vec![k.name.clone(), k.token.clone()],
            vec![lease.clone(), field.clone()],
        )
        .await;
        assert_eq!((w[0][0], w[1].clone()), (-1, vec![-5, -1]));
        let _: () = query(&mut c, "DEL", &[&k.name]).await;

        let base = k.read_timeouts("client:1");
        let rd = twice(
            &READ_LOCK,
            vec![k.name.clone(), base, k.token.clone()],
            vec![lease.clone(), field.clone(), Vec::new()],
        )
        .await;
        assert_eq!((rd[0][0], rd[1].clone()), (-1, vec![-5, -1]));
        let count: i64 = query(&mut c, "HGET", &[&k.name, "client:1"]).await;
        assert_eq!(count, 1, "one read count");
        let _: () = query(&mut c, "DEL", &[&k.name]).await;

        let sem = twice(
            &SEM_ACQUIRE,
            vec![
                k.name.clone(),
                k.sem_timeouts.clone(),
                k.sem_channel.clone(),
                k.token.clone(),
                k.sem_size.clone(),
            ],
            vec![
                b"2".to_vec(),
                Vec::new(),
                Vec::new(),
                b"30000".to_vec(),
                b"publish".to_vec(),
                b"permit-id-000001".to_vec(),
            ],
        )
        .await;
        assert_eq!((sem[0][0], sem[1].clone()), (-1, vec![-5, -1]));
        let left: i64 = query(&mut c, "GET", &[&k.name]).await;
        assert_eq!(left, 1, "one of two permits taken, not two");
        let semaphore_keys = [&k.name, &k.sem_timeouts, &k.sem_size, &k.token];
        let _: () = query(&mut c, "DEL", &semaphore_keys.map(String::as_str)).await;
    }

    /// A client whose clock runs an hour ahead cannot reclaim a live permit: the scripts take
    /// now from the server, whatever `now` the client sends.
    #[tokio::test]
    async fn a_client_clock_ahead_cannot_reclaim_a_live_permit() {
        let Some((mut c, k)) = fresh("skew").await else {
            return;
        };
        let ahead = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            + 3_600_000)
            .to_string();
        let mut replies = Vec::new();
        for id in [b"permit-id-00000a", b"permit-id-00000b"] {
            let mut inv = SEM_ACQUIRE.prepare_invoke();
            inv.key(&k.name)
                .key(&k.sem_timeouts)
                .key(&k.sem_channel)
                .key(&k.token)
                .key(&k.sem_size);
            // What a skewed client would send as expiry and now, then the lease.
            inv.arg("1")
                .arg(ahead.as_str())
                .arg(ahead.as_str())
                .arg("30000")
                .arg("publish")
                .arg(id.as_slice());
            let reply: Vec<i64> = inv.invoke_async(&mut c).await.unwrap();
            replies.push(reply);
        }
        assert_eq!(replies[0][0], -1, "the first permit");
        assert_ne!(
            replies[1][0], -1,
            "a second permit of one, by a clock an hour ahead"
        );
        let semaphore_keys = [&k.name, &k.sem_timeouts, &k.sem_size, &k.token];
        let _: () = query(&mut c, "DEL", &semaphore_keys.map(String::as_str)).await;
    }
}
