//! Redis-specific tests against real servers: Redisson layout compatibility, faults (killed
//! connections, deleted keys, restarts) and round trips.
//!
//! Layout tests use the shared server at `DLOCK_REDIS_URL`. Tests that kill connections,
//! restart the server or count commands each start a private `redis-server` on a free loopback
//! port, so they cannot disturb (or be disturbed by) anything else.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::tls::{free_port, make_certificates};
use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{Lease, LockOptions, LockProvider};
use dlock_redis::RedisProvider;
use redis::AsyncCommands;
use tokio::time::Instant;

// ------------------------------------------------------------------ helpers

/// The test's own connection, with the library's default patience (5 s) rather than
/// redis-rs's (500 ms for an answer), which a loaded machine exceeds.
async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

/// A plain connection to `url`, or why there is none.
async fn try_admin(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    redis::Client::open(url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())
}

/// PING on a fresh connection to `url`.
async fn pong(url: &str) -> Result<String, String> {
    redis::cmd("PING")
        .query_async::<String>(&mut try_admin(url).await?)
        .await
        .map_err(|e| e.to_string())
}

/// Whether the text a server answers to `command` (`INFO replication`, `CLUSTER INFO`)
/// contains `wanted`; else the text.
async fn answers(
    c: &redis::aio::MultiplexedConnection,
    command: &[&str],
    wanted: &str,
) -> Result<(), String> {
    let text: String = redis::cmd(command[0])
        .arg(&command[1..])
        .query_async(&mut c.clone())
        .await
        .map_err(|e| e.to_string())?;
    if text.contains(wanted) {
        Ok(())
    } else {
        Err(text)
    }
}

/// Whether exactly `count` connections subscribe to the lock channel of `name` (Redisson's
/// `redisson_lock__channel:{name}`).
async fn subscribed(url: &str, name: &str, count: i64) -> Result<(), String> {
    let mut c = admin(url).await;
    let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(format!("redisson_lock__channel:{{{name}}}"))
        .query_async(&mut c)
        .await
        .map_err(|e| e.to_string())?;
    match n.first() {
        Some((_, n)) if *n == count => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// A `redis-server` of our own on a free loopback port; killed on drop.
struct PrivateRedis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    appendonly: bool,
    /// The port of the master this server replicates.
    replica_of: Option<u16>,
    /// A cluster of this one node, which serves every slot.
    cluster: bool,
    /// The port the node tells cluster clients to use (a proxy's), if not its own.
    announce_port: Option<u16>,
}

impl PrivateRedis {
    /// Starts one, or returns `None` (skip) when `redis-server` is not installed and skipping
    /// is allowed.
    async fn start(appendonly: bool) -> Option<Self> {
        Self::start_with(appendonly, None, false).await
    }

    /// Starts a cluster of one node that serves all 16384 slots, behind a fault-injecting
    /// proxy: the node announces the proxy's port, so every connection of a cluster client
    /// (the first and those it learns from `CLUSTER SLOTS`) goes through the proxy.
    async fn start_cluster_behind_proxy() -> Option<(Self, dlock_proxy::Proxy)> {
        let port = free_port().expect("a free loopback port");
        let proxy = dlock_proxy::Proxy::start(("127.0.0.1", port))
            .await
            .unwrap();
        let server = Self::start_on(port, false, None, true, Some(proxy.addr().port())).await?;
        Some((server, proxy))
    }

    /// Starts a replica of `master`.
    async fn replica_of(master: &Self) -> Option<Self> {
        Self::start_with(false, Some(master.port), false).await
    }

    async fn start_with(appendonly: bool, replica_of: Option<u16>, cluster: bool) -> Option<Self> {
        Self::start_on(
            free_port().expect("a free loopback port"),
            appendonly,
            replica_of,
            cluster,
            None,
        )
        .await
    }

    async fn start_on(
        port: u16,
        appendonly: bool,
        replica_of: Option<u16>,
        cluster: bool,
        announce_port: Option<u16>,
    ) -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            if std::env::var("DLOCK_TEST_REQUIRE").as_deref() == Ok("all") {
                panic!("redis-server is not installed but DLOCK_TEST_REQUIRE=all");
            }
            eprintln!("skipped: redis-server is not installed");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("dlock-redis-test-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            port,
            dir,
            child: None,
            appendonly,
            replica_of,
            cluster,
            announce_port,
        };
        server.spawn().await;
        if cluster {
            server.serve_every_slot().await;
        }
        Some(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", if self.appendonly { "yes" } else { "no" }])
            .args([
                "--appendfsync",
                "always",
                "--repl-diskless-sync-delay",
                "0",
                "--dir",
            ])
            .arg(&self.dir)
            .args(if self.cluster {
                // The cluster bus on a port of its own (its default, port + 10000, may not
                // exist for an ephemeral port).
                let mut args = vec![
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-config-file".to_owned(),
                    self.dir.join("nodes.conf").display().to_string(),
                    "--cluster-port".to_owned(),
                    free_port().expect("a free loopback port").to_string(),
                ];
                if let Some(port) = self.announce_port {
                    args.extend(["--cluster-announce-port".to_owned(), port.to_string()]);
                }
                args
            } else {
                Vec::new()
            })
            .args(
                self.replica_of
                    .map(|port| {
                        vec![
                            "--replicaof".to_owned(),
                            "127.0.0.1".to_owned(),
                            port.to_string(),
                        ]
                    })
                    .unwrap_or_default(),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let url = self.url();
        eventually(
            Duration::from_secs(10),
            "private redis-server answers",
            || pong(&url),
        )
        .await;
    }

    /// Gives this node of a cluster every slot, and waits until the cluster says it is ok.
    async fn serve_every_slot(&self) {
        let mut c = admin(&self.url()).await;
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query_async(&mut c)
            .await
            .unwrap();
        eventually(Duration::from_secs(10), "the cluster is ok", || {
            answers(&c, &["CLUSTER", "INFO"], "cluster_state:ok")
        })
        .await;
    }

    /// Sends `signal` (e.g. `-STOP`, `-CONT`) to the server's process.
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// How many times each command ran so far, from `INFO commandstats` (which also counts
    /// the commands scripts run, and INFO itself).
    async fn stats(&self) -> std::collections::HashMap<String, u64> {
        let mut c = admin(&self.url()).await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .unwrap();
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
                Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
            })
            .collect()
    }

    async fn calls(&self, command: &str) -> u64 {
        self.stats().await.get(command).copied().unwrap_or(0)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn watchdog(ttl_ms: u64) -> LockOptions {
    LockOptions::new().with_lease(Lease::watchdog(Duration::from_millis(ttl_ms)))
}

// ------------------------------------------------------------------ Redisson layout

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

// ------------------------------------------------------------------ faults

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

// ------------------------------------------------------------------ round trips

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

/// In a cluster, a name whose `{` gives no hash tag would spread its keys over several slots:
/// it is rejected up front instead of failing with CROSSSLOT later. Names with a proper tag
/// work, and keys of names without braces land in one slot through Redisson's `{name}` rule.
#[tokio::test]
async fn cluster_rejects_names_it_cannot_colocate() {
    let Some(url) = service_url("DLOCK_REDIS_CLUSTER_URL") else {
        return;
    };
    let p = RedisProvider::connect(&url).await.unwrap();
    let names = Names::new();
    // `orders}42` (review M9): the lock key hashes whole, the keys dlock derives from it by
    // the tag `{...orders}`: CROSSSLOT at acquire time, unless refused up front.
    for bad in ["a{b", "a{}b", "x}{y", "orders}42"] {
        let e = p
            .lock(&names.name(bad), LockOptions::default())
            .unwrap_err();
        assert!(
            matches!(e, dlock_core::Error::InvalidName { .. }),
            "{bad}: {e:?}"
        );
    }
    for good in ["a{tag}b", "plain", "{tag}"] {
        let l = p.lock(&names.name(good), LockOptions::default()).unwrap();
        l.acquire().await.unwrap().release().await.unwrap();
    }
}

/// Review M3: a cluster's wake-ups follow `pubsub=` (Redis 6 clusters and Java clients with
/// `shardedSubscriptionMode=OFF` use PUBLISH/SUBSCRIBE). With `pubsub=classic` a release
/// reaches a plain SUBSCRIBE on any node (what such a Java client listens with) and wakes a
/// waiting dlock by its message; `auto` (sharded on this Redis 7) wakes its waiter by message
/// too. The old code had no `pubsub=` and always published sharded.
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

/// Review L10: a name that is another name's bookkeeping key in Redisson's layout (a token,
/// a fair queue, a semaphore's permits, a read hold's timeout) is refused for every
/// primitive: the two would share one key and fail with WRONGTYPE, or worse. The old code
/// accepted them.
#[tokio::test]
async fn names_that_are_bookkeeping_keys_are_refused() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let p = RedisProvider::connect(&url).await.unwrap();
    for bad in [
        "redisson_lock_token:{a}",
        "redisson_lock_queue:{a}",
        "redisson_lock_timeout:{a}",
        "{a}:timeout",
        "{a}:permits",
        "x{a}:timeout",
        "{a}:3f2c:1:rwlock_timeout:1",
    ] {
        let errors = [
            p.lock(bad, LockOptions::default()).err(),
            p.read_write_lock(bad, LockOptions::default()).err(),
            p.semaphore(bad, 2, LockOptions::default()).err(),
        ];
        for e in errors {
            assert!(
                matches!(e, Some(dlock_core::Error::InvalidName { .. })),
                "{bad}: {e:?}"
            );
        }
    }
    // Near misses stay usable: no brace, or the suffix not at the end.
    let names = Names::new();
    for good in ["a:timeout", "{a}:timeouts", "redisson_lock:x"] {
        let l = p.lock(&names.name(good), LockOptions::default()).unwrap();
        l.acquire().await.unwrap().release().await.unwrap();
    }
}

/// Issue 12 item 6: with `?wait_replicas=1`, `acquire` returns only once the replica has the
/// grant (WAIT); with the replica stopped (SIGSTOP), acquire fails with a retryable error and
/// gives the grant back, for a mutex and a semaphore alike, so no guard carries a grant a
/// failover could take back; and a renewal the replica does not acknowledge does not extend
/// the hold. The old code refused the parameter (and then renewed without waiting).
#[tokio::test(flavor = "multi_thread")]
async fn wait_replicas_returns_only_replicated_grants() {
    const LIMIT: Duration = Duration::from_secs(10);
    // Longer than one WAIT: the failed confirmation, not the deadline, ends the acquire.
    const WAIT: Duration = Duration::from_secs(3);
    let Some(master) = PrivateRedis::start(false).await else {
        return;
    };
    let Some(replica) = PrivateRedis::replica_of(&master).await else {
        return;
    };
    let mut on_replica = admin(&replica.url()).await;
    eventually(LIMIT, "the replica is in sync", || {
        answers(
            &on_replica,
            &["INFO", "replication"],
            "master_link_status:up",
        )
    })
    .await;
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
    // replica saw, so its holder is told it lost at its lease end (the old code renewed on
    // the master alone and kept the hold for good).
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

/// No lost wake-ups under contention: 8 clients (8 subscription connections) on one name,
/// watchdog leases of 30 s. A waiter that misses its unlock message sleeps until the holder's
/// PTTL (30 s), so every acquire completing within 10 s shows none was missed. (A waiter once
/// trusted a subscription whose UNSUBSCRIBE was in flight.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lost_wakeups_under_contention() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let name = Names::new().name("wakeups");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let p = RedisProvider::connect(&url).await.unwrap();
        let lock = p.lock(&name, LockOptions::default()).unwrap();
        tasks.push(tokio::spawn(async move {
            let _client = p;
            for _ in 0..150 {
                let g = must(
                    Duration::from_secs(10),
                    "an acquire under contention",
                    lock.acquire(),
                )
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
}

/// Issue 16 item 3: a provider made from the application's own `redis::Client` (here a RESP2
/// client, redis-rs's default) locks, wakes its waiters (its subscription connection speaks
/// RESP3 whatever the client says), and is the same store as one made from the URL, so a
/// MultiLock treats them as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_from_the_applications_client() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let own = RedisProvider::from_client(&client).await.unwrap();
    let by_url = RedisProvider::connect(&url).await.unwrap();
    assert_eq!(own.store_id(), by_url.store_id());
    let name = Names::new().name("from-client");
    let held = own
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let other = RedisProvider::from_client(&client).await.unwrap();
        let name = name.clone();
        tokio::spawn(async move {
            let lock = other.lock(&name, LockOptions::default()).unwrap();
            // Woken by the release message: a 30 s lease would keep a waiter that missed it
            // asleep far longer than this bound.
            let g = must(
                Duration::from_secs(10),
                "the waiter is woken",
                lock.acquire(),
            )
            .await
            .unwrap();
            g.release().await.unwrap();
        })
    };
    eventually(Duration::from_secs(5), "the waiter subscribed", || {
        subscribed(&url, &name, 1)
    })
    .await;
    held.release().await.unwrap();
    waiter.await.unwrap();
}

// ------------------------------------------------------------------ Sentinel

/// A Sentinel of our own on a free loopback port, watching `master` under `name`; killed on
/// drop.
struct PrivateSentinel {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// The Sentinel's own password (`requirepass`), if it has one.
    password: Option<String>,
}

impl PrivateSentinel {
    async fn start(master: &PrivateRedis, name: &str) -> Self {
        Self::start_with(master, name, None).await
    }

    async fn start_with(master: &PrivateRedis, name: &str, password: Option<&str>) -> Self {
        let port = free_port().expect("a free loopback port");
        let dir = std::env::temp_dir().join(format!("dlock-sentinel-test-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A Sentinel rewrites its configuration file: it must be its own and writable.
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {name} 127.0.0.1 {} 2\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 3000\n{}",
                dir.display(),
                master.port,
                password.map_or(String::new(), |p| format!("requirepass {p}\n"))
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let sentinel = Self {
            port,
            dir,
            child: Some(child),
            password: password.map(str::to_owned),
        };
        let url = sentinel.url();
        eventually(Duration::from_secs(10), "private sentinel answers", || {
            pong(&url)
        })
        .await;
        sentinel
    }

    fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The master's port as this Sentinel knows it.
    async fn master_port(&self, name: &str) -> Result<u16, String> {
        let mut c = try_admin(&self.url()).await?;
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name)
            .query_async(&mut c)
            .await
            .map_err(|e| e.to_string())?;
        addr.get(1)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("no master address: {addr:?}"))
    }

    /// `SENTINEL CKQUORUM`: this Sentinel sees enough peers to fail over.
    async fn quorum(&self, name: &str) -> Result<(), String> {
        let mut c = try_admin(&self.url()).await?;
        redis::cmd("SENTINEL")
            .arg("CKQUORUM")
            .arg(name)
            .query_async::<String>(&mut c)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

impl Drop for PrivateSentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sentinels that require a password of their own: `sentinel_password` reaches them (the
/// URL's credentials are the master's), and without it the connect fails with an error that
/// does not show the password. Before, dlock could not talk to such Sentinels at all.
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

/// Issue 12 item 5: a Sentinel failover during contention, with `wait_replicas=1`. A master,
/// two replicas and three Sentinels of our own; four clients contend for one lock through
/// `redis+sentinel://`; the master is killed (SIGKILL) and the Sentinels promote a replica.
/// No grant is made while another holder still believes it holds, fencing tokens only rise
/// across the failover (the token counter reached a replica before each grant was returned),
/// every error on the way says a retry can help, and every contender gets the lock again
/// on the new master. Before `redis+sentinel://`, no client could follow the master at all.
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

// ------------------------------------------------------------------ review findings

/// Script calls (EVAL and EVALSHA) the server ran while `run` ran.
async fn script_calls<F: std::future::Future>(server: &PrivateRedis, run: F) -> (F::Output, u64) {
    let count = |stats: std::collections::HashMap<String, u64>| {
        stats.get("evalsha").copied().unwrap_or(0) + stats.get("eval").copied().unwrap_or(0)
    };
    let before = count(server.stats().await);
    let out = run.await;
    (out, count(server.stats().await) - before)
}

/// Issue 12's semaphore acceptance: every permit is held by a Java `RSemaphore` (Redisson's
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

/// Review H2: a semaphore whose counter is 0 with no permit in the timeouts set (a Java
/// `RSemaphore` holds them all) has nothing to expire: its waiter waits for a message, it does
/// not call the script in a loop (it used to, hundreds of times a second).
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

/// Review H1: a fair waiter behind a dead queue head, with the lock free, waits until the
/// head's turn ends (or a message); it used to call the script in a tight loop for up to the
/// fair wait (5 min).
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

/// Review L6: a fair waiter keeps its place in the queue across transient errors. The first
/// waiter's connections go through a proxy that is cut (so it tries again at once) and then
/// delays every reply past its 300 ms response timeout, so its tries fail; the second waiter
/// queued behind it is untouched. Once the replies flow again and the holder lets go, the
/// first waiter gets the lock first. (It used to leave the queue after each failed try and
/// queue again at the back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_keeps_its_place_across_transient_errors() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let proxy = dlock_proxy::Proxy::start(("127.0.0.1", server.port))
        .await
        .unwrap();
    let direct = RedisProvider::connect(&server.url()).await.unwrap();
    let flaky = RedisProvider::connect(&format!("redis://{}?timeout_ms=300", proxy.addr()))
        .await
        .unwrap();
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
    let queued = |n: usize| {
        let mut admin = admin.clone();
        let queue = queue.clone();
        async move {
            let len: usize = admin.llen(&queue).await.map_err(|e| e.to_string())?;
            if len == n {
                Ok(())
            } else {
                Err(format!("{len} queued"))
            }
        }
    };
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

/// Review M2: a holder key without a TTL (Java `clearExpire()`, a PERSIST) makes a waiter
/// wait; it used to fail the acquire ("granted with token -1").
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

/// Review M6: a semaphore counter deleted (or evicted) while a permit is held is created
/// again without that permit; it used to be created full, so a 1-permit semaphore had two
/// holders, and kept the extra permit for good.
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

/// Review H4 and issue 12's restart acceptance: Redis restarts (SIGKILL and a new process, no
/// persistence: the hold is gone) while one client holds and eight wait. Once the server is
/// back, the holder is told within 1 s, all eight waiters get the lock (one after another)
/// within 1 s, and they do not poll in a loop: the restarted server counts their script
/// calls. The old code failed the waiters ("broken pipe"); later versions retried with
/// pauses of up to 1 s, and a waiter that subscribed again after a release it had not heard
/// slept until its 5 s cap.
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
    // that a waiter pausing up to 1 s between tries (the old code) tries again only about a
    // second after the server is back.
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

/// Review M1: after a restart without persistence the holder is told at once (here a fixed
/// 60 s lease, which the old code only checked at its end; a watchdog hold up to ttl/3
/// later), while another client could already take the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_reports_loss_as_soon_as_the_server_is_back() {
    let Some(mut server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    let name = Names::new().name("restart-loss");
    let fixed = LockOptions::default().with_lease(Lease::Fixed(Duration::from_secs(60)));
    let g = p.lock(&name, fixed).unwrap().acquire().await.unwrap();
    server.kill();
    tokio::time::sleep(Duration::from_millis(1000)).await;
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

/// Review M4: the fair queue's head is cancelled while the lock is free (here the holder's key
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

/// Review H4: the provider's connections carry TCP keepalive, so a peer that vanished without
/// a reset (a half-open connection behind a NAT) is noticed even on the subscription
/// connection, which only listens. Linux shows the keepalive timer in /proc/net/tcp
/// (`tr` = 2); the old connections had no timer.
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

/// Issue 12's lost-reply acceptance, on a single server: the server is paused for writes
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

/// Issue 12's lost-reply acceptance on a cluster: the connection of an acquisition is cut
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

/// The `EVALSHA` calls a server ran, seen through `MONITOR`.
struct Monitor {
    calls: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    async fn start(url: &str) -> Self {
        use futures::StreamExt;
        let mut stream = redis::Client::open(url)
            .unwrap()
            .get_async_monitor()
            .await
            .unwrap()
            .into_on_message::<String>();
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&calls);
        let task = tokio::spawn(async move {
            while let Some(line) = stream.next().await {
                // `<time> [<db> <client>] "evalsha" "<sha>" ...`: keep the command and its
                // arguments, which name the acquisition (its own field or permit id).
                if let Some(at) = line.to_ascii_lowercase().find("\"evalsha\"") {
                    seen.lock().unwrap().push(line[at..].to_owned());
                }
            }
        });
        Self { calls, task }
    }

    fn clear(&self) {
        self.calls.lock().unwrap().clear();
    }

    /// How many calls since the last `clear` repeat an earlier one exactly (the same script
    /// with the same arguments: a client's re-send of one call).
    fn resent_scripts(&self) -> usize {
        let calls = self.calls.lock().unwrap();
        let distinct: std::collections::HashSet<&String> = calls.iter().collect();
        calls.len() - distinct.len()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
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

// ------------------------------------------------------------------ kinds on one name

/// A fresh provider of the shared server, or `None` (skip) without one.
async fn shared() -> Option<(String, RedisProvider)> {
    let url = service_url("DLOCK_REDIS_URL")?;
    let p = RedisProvider::connect(&url).await.unwrap();
    Some((url, p))
}

/// Deletes every key of `name` that a test of several kinds may have left.
async fn forget(url: &str, name: &str) {
    let mut c = admin(url).await;
    let _: i64 = redis::cmd("DEL")
        .arg(name)
        .arg(format!("redisson_lock_token:{{{name}}}"))
        .arg(format!("{{{name}}}:timeout"))
        .arg(format!("{{{name}}}:permits"))
        .query_async(&mut c)
        .await
        .unwrap();
}

/// What an acquisition refused because the name's key is another kind's must be: a
/// non-retryable `InvalidArgument` whose text names the kind in use.
fn refused_for(r: dlock_core::Result<Option<dlock_core::LockGuard>>, in_use: &str, what: &str) {
    match r {
        Err(e @ dlock_core::Error::InvalidArgument { .. }) => {
            assert!(!e.is_retryable(), "{what}: {e}");
            assert!(
                e.to_string().contains(&format!("holds {in_use}")),
                "{what}: the error must name {in_use}: {e}"
            );
        }
        Err(e) => panic!("{what}: refused with {e:?}, not as the other kind in use"),
        Ok(Some(_)) => panic!("{what}: granted beside {in_use}"),
        Ok(None) => panic!("{what}: answered 'held', which no wait can change"),
    }
}

/// A mutex and a writer of one name exclude each other, in both orders. A writer asking while
/// a mutex holds is kept out (both share the hash, and the mutex's release deletes it
/// whole: a writer let in beside it would be wiped, and a second writer let in beside the
/// first). It is let in once the mutex is released, and then a second writer and a mutex
/// wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_and_a_writer_of_one_name_never_hold_together() {
    let Some((url, a)) = shared().await else {
        return;
    };
    let b = RedisProvider::connect(&url).await.unwrap();
    let c = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("mutex-write");
    // A short watchdog lease: a writer waiting on the mutex (whose release message goes to
    // the mutex channel) looks again within the hash's PTTL.
    let m = a
        .lock(&name, watchdog(1500))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let writer = b.read_write_lock(&name, LockOptions::default()).unwrap();
    let beside = writer.try_write(Duration::from_millis(300)).await.unwrap();
    assert!(
        beside.is_none(),
        "a writer was granted beside a mutex holder"
    );
    let waiting = tokio::spawn(async move { writer.write().await });
    m.release().await.unwrap();
    let w1 = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the writer is let in once the mutex is released")
        .unwrap()
        .unwrap();
    let second = c
        .read_write_lock(&name, LockOptions::default())
        .unwrap()
        .try_write(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(second.is_none(), "two writers at once");
    let mutex = c.lock(&name, LockOptions::default()).unwrap();
    let m2 = mutex.try_acquire(Duration::from_millis(300)).await.unwrap();
    assert!(m2.is_none(), "a mutex granted beside a writer");
    assert!(w1.is_held());
    w1.release().await.unwrap();
    let m2 = mutex
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the mutex is let in once the writer is released");
    m2.release().await.unwrap();
    forget(&url, &name).await;
}

/// A mutex and a reader of one name exclude each other, in both orders; readers still share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_and_a_reader_of_one_name_never_hold_together() {
    let Some((url, a)) = shared().await else {
        return;
    };
    let b = RedisProvider::connect(&url).await.unwrap();
    let c = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("mutex-read");
    let mutex = a.lock(&name, watchdog(1500)).unwrap();
    let m = mutex.acquire().await.unwrap();
    let rw = b.read_write_lock(&name, LockOptions::default()).unwrap();
    let beside = rw.try_read(Duration::from_millis(300)).await.unwrap();
    assert!(
        beside.is_none(),
        "a reader was granted beside a mutex holder"
    );
    m.release().await.unwrap();
    let r1 = rw
        .try_read(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the reader is let in once the mutex is released");
    let r2 = c
        .read_write_lock(&name, LockOptions::default())
        .unwrap()
        .try_read(Duration::ZERO)
        .await
        .unwrap()
        .expect("readers share");
    let m = mutex.try_acquire(Duration::from_millis(300)).await.unwrap();
    assert!(m.is_none(), "a mutex granted beside readers");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let m = mutex
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the mutex is let in once the readers are gone");
    m.release().await.unwrap();
    forget(&url, &name).await;
}

/// A lock and a semaphore of one name cannot wait for each other (a counter and a hash at one
/// key): while one kind's key exists, the other kind is refused at once with a non-retryable
/// `InvalidArgument` naming the kind in use, for every lock primitive, for `acquire()` without
/// deadline and for `available()`; the refused call changes nothing (here: an expired permit
/// in the semaphore's timeouts set is not reclaimed into a lock's hash), and the holder keeps
/// its hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_semaphore_of_one_name_refuse_each_other_clearly() {
    let Some((url, a)) = shared().await else {
        return;
    };
    let b = RedisProvider::connect(&url).await.unwrap();
    let names = Names::new();

    // A permit held: the locks are refused.
    let counted = names.name("sem-first");
    let sem = a.semaphore(&counted, 2, LockOptions::default()).unwrap();
    let permit = sem.acquire().await.unwrap();
    let mutex = b.lock(&counted, LockOptions::default()).unwrap();
    refused_for(
        mutex.try_acquire(Duration::ZERO).await,
        "a semaphore",
        "mutex",
    );
    refused_for(
        mutex.try_acquire(Duration::from_secs(1)).await,
        "a semaphore",
        "mutex with a wait",
    );
    let forever = tokio::time::timeout(Duration::from_secs(5), mutex.acquire())
        .await
        .expect("acquire() without deadline is refused at once, not retried");
    refused_for(forever.map(Some), "a semaphore", "acquire()");
    let fair = b
        .lock(&counted, LockOptions::default().with_fair(true))
        .unwrap();
    refused_for(
        fair.try_acquire(Duration::ZERO).await,
        "a semaphore",
        "fair mutex",
    );
    let rw = b.read_write_lock(&counted, LockOptions::default()).unwrap();
    refused_for(rw.try_read(Duration::ZERO).await, "a semaphore", "read");
    refused_for(rw.try_write(Duration::ZERO).await, "a semaphore", "write");
    assert!(permit.is_held());
    let second = sem
        .try_acquire(Duration::ZERO)
        .await
        .unwrap()
        .expect("the semaphore's second permit is untouched");
    permit.release().await.unwrap();
    second.release().await.unwrap();
    forget(&url, &counted).await;

    // A lock held (a mutex, then a writer): permits are refused, and nothing is changed.
    for (i, write) in [false, true].into_iter().enumerate() {
        let name = names.name(&format!("lock-first-{i}"));
        let held = if write {
            a.read_write_lock(&name, LockOptions::default())
                .unwrap()
                .write()
                .await
                .unwrap()
        } else {
            a.lock(&name, LockOptions::default())
                .unwrap()
                .acquire()
                .await
                .unwrap()
        };
        let mut c = admin(&url).await;
        let before: Vec<String> = redis::cmd("HGETALL")
            .arg(&name)
            .query_async(&mut c)
            .await
            .unwrap();
        let timeouts = format!("{{{name}}}:timeout");
        let _: i64 = redis::cmd("ZADD")
            .arg(&timeouts)
            .arg(1)
            .arg("an-expired-permit")
            .query_async(&mut c)
            .await
            .unwrap();
        let sem = b.semaphore(&name, 1, LockOptions::default()).unwrap();
        refused_for(sem.try_acquire(Duration::ZERO).await, "a lock", "permit");
        refused_for(
            sem.try_acquire(Duration::from_secs(1)).await,
            "a lock",
            "permit with a wait",
        );
        let available = sem.available().await;
        refused_for(available.map(|_| None), "a lock", "available()");
        let after: Vec<String> = redis::cmd("HGETALL")
            .arg(&name)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(before, after, "the lock's hash is untouched");
        let left: i64 = redis::cmd("ZCARD")
            .arg(&timeouts)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(left, 1, "the refused acquire reclaimed a permit first");
        assert!(held.is_held());
        held.release().await.unwrap();
        forget(&url, &name).await;
    }
}

/// `describe` tells a write hold (exclusive) from a read hold (shared).
#[tokio::test]
async fn describe_tells_a_write_hold_from_a_read_hold() {
    let Some((url, p)) = shared().await else {
        return;
    };
    let name = Names::new().name("describe");
    let rw = p.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = rw.write().await.unwrap();
    assert_eq!(
        p.describe(&name).await.unwrap().kind,
        Some(dlock_core::LockKind::Write)
    );
    w.release().await.unwrap();
    let r = rw.read().await.unwrap();
    assert_eq!(
        p.describe(&name).await.unwrap().kind,
        Some(dlock_core::LockKind::Read)
    );
    r.release().await.unwrap();
    forget(&url, &name).await;
}

// ------------------------------------------------------------------ a store that does not answer

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

// ------------------------------------------------------------------ TLS

/// `rediss://` with the URL's `ca_file`, `cert_file` and `key_file` (issue 16): a private
/// `redis-server` of this test's own serves TLS only and asks every client for a certificate
/// its authority signed. With the authority and the client certificate, locks work; without
/// the client certificate, or without the authority (the system's roots do not know it), the
/// connect fails; a missing file is a configuration error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_and_a_client_certificate() {
    // The server is the test's own, but it runs the redis-server the shared one runs.
    if service_url("DLOCK_REDIS_URL").is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("dlock-redis-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let certs = make_certificates(&dir);
    let port = free_port().expect("a free loopback port");
    let server = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--save", "", "--dir"])
        .arg(&dir)
        .arg("--tls-cert-file")
        .arg(&certs.server.0)
        .arg("--tls-key-file")
        .arg(&certs.server.1)
        .arg("--tls-ca-cert-file")
        .arg(&certs.ca)
        .args(["--tls-auth-clients", "yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs");
    struct Stop(Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Stop(server);

    let with = |params: &str| format!("rediss://127.0.0.1:{port}/?timeout_ms=2000{params}");
    let files = format!(
        "&ca_file={}&cert_file={}&key_file={}",
        certs.ca.display(),
        certs.client.0.display(),
        certs.client.1.display()
    );
    let url = with(&files);
    let p = eventually(Duration::from_secs(20), "a TLS connection", || {
        let url = url.clone();
        async move {
            RedisProvider::connect(&url)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    let parsed = dlock_redis::RedisConfig::from_url(&url).unwrap();
    assert_eq!(parsed.tls.ca_file.as_ref(), Some(&certs.ca));
    let lock = p
        .lock(&Names::new().name("tls"), LockOptions::default())
        .unwrap();
    let g = lock.acquire().await.unwrap();
    assert!(g.fencing_token().get() > 0);
    g.release().await.unwrap();

    for (what, params) in [
        (
            "without the client certificate",
            format!("&ca_file={}", certs.ca.display()),
        ),
        (
            "without the authority",
            format!(
                "&cert_file={}&key_file={}",
                certs.client.0.display(),
                certs.client.1.display()
            ),
        ),
    ] {
        let refused = match RedisProvider::connect(&with(&params)).await {
            Ok(p) => {
                let lock = p
                    .lock(&Names::new().name("tls"), LockOptions::default())
                    .unwrap();
                lock.try_acquire(Duration::from_secs(2)).await.err()
            }
            Err(e) => Some(e),
        };
        assert!(refused.is_some(), "{what}: connected");
    }
    let missing = dir.join("nowhere.pem");
    let e = RedisProvider::connect(&with(&format!("&ca_file={}", missing.display())))
        .await
        .unwrap_err();
    assert!(
        matches!(e, dlock_core::Error::Config { .. }) && e.to_string().contains("nowhere.pem"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
