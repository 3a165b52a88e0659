//! The rigs the Redis tests share: connections of the tests' own, private `redis-server` and
//! Sentinel processes, a `MONITOR` of the scripts a server runs, and small probes; and the
//! imports every test module uses.

#![allow(dead_code, unused_imports)]

pub(crate) use std::path::PathBuf;
pub(crate) use std::process::{Child, Command, Stdio};
pub(crate) use std::sync::Arc;
pub(crate) use std::time::Duration;

pub(crate) use dlock_conformance::tls::{free_port, make_certificates};
pub(crate) use dlock_conformance::{Names, eventually, must, service_url};
pub(crate) use dlock_core::{Lease, LockOptions, LockProvider};
pub(crate) use dlock_redis::RedisProvider;
pub(crate) use redis::AsyncCommands;
pub(crate) use tokio::time::Instant;

/// A connection of the test's own to `client`'s server, with the library's default patience
/// (5 s) rather than redis-rs's (500 ms for an answer, 1 s to connect), which a loaded machine
/// exceeds.
pub(crate) async fn patient(client: &redis::Client) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

/// A [`patient`] connection of the test's own to `url`.
pub(crate) async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    patient(&redis::Client::open(url).unwrap()).await
}

/// A plain connection to `url`, or why there is none.
pub(crate) async fn try_admin(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    redis::Client::open(url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())
}

/// PING on a fresh connection to `url`.
pub(crate) async fn pong(url: &str) -> Result<String, String> {
    redis::cmd("PING")
        .query_async::<String>(&mut try_admin(url).await?)
        .await
        .map_err(|e| e.to_string())
}

/// Whether the text a server answers to `command` (`INFO replication`, `CLUSTER INFO`)
/// contains `wanted`: the text either way.
pub(crate) async fn answers(
    c: &redis::aio::MultiplexedConnection,
    command: &[&str],
    wanted: &str,
) -> Result<String, String> {
    let text: String = redis::cmd(command[0])
        .arg(&command[1..])
        .query_async(&mut c.clone())
        .await
        .map_err(|e| e.to_string())?;
    if text.contains(wanted) {
        Ok(text)
    } else {
        Err(text)
    }
}

/// Whether exactly `count` connections subscribe to the lock channel of `name` (Redisson's
/// `redisson_lock__channel:{name}`).
pub(crate) async fn subscribed(url: &str, name: &str, count: i64) -> Result<(), String> {
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
pub(crate) struct PrivateRedis {
    pub(crate) port: u16,
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
    pub(crate) async fn start(appendonly: bool) -> Option<Self> {
        Self::start_with(appendonly, None, false).await
    }

    /// Starts a cluster of one node that serves all 16384 slots, behind a fault-injecting
    /// proxy: the node announces the proxy's port, so every connection of a cluster client
    /// (the first and those it learns from `CLUSTER SLOTS`) goes through the proxy.
    pub(crate) async fn start_cluster_behind_proxy() -> Option<(Self, dlock_proxy::Proxy)> {
        let port = free_port().expect("a free loopback port");
        let proxy = dlock_proxy::Proxy::start(("127.0.0.1", port))
            .await
            .unwrap();
        let server = Self::start_on(port, false, None, true, Some(proxy.addr().port())).await?;
        Some((server, proxy))
    }

    /// A replica of `master` that is in step: the replica's link to the master is up, and the
    /// master lists it online with a recent acknowledgement (as `wait_replicas=auto` counts
    /// a replica in step).
    pub(crate) async fn replica_in_step(master: &Self) -> Option<Self> {
        const LIMIT: Duration = Duration::from_secs(30);
        let replica = Self::replica_of(master).await?;
        let on_replica = admin(&replica.url()).await;
        let on_master = admin(&master.url()).await;
        eventually(LIMIT, "the replica is in sync", || {
            answers(
                &on_replica,
                &["INFO", "replication"],
                "master_link_status:up",
            )
        })
        .await;
        // In step as `wait_replicas=auto` counts it: a replica line
        // (`slaveN:ip=…,state=online,offset=…,lag=0`) online, its last acknowledgement of
        // the stream at most a second old (the provider allows two).
        let in_step = |info: &str| {
            info.lines().any(|line| {
                let Some((key, fields)) = line.trim().split_once(':') else {
                    return false;
                };
                let field = |name: &str| {
                    fields
                        .split(',')
                        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                };
                key.starts_with("slave")
                    && field("state") == Some("online")
                    && field("lag")
                        .and_then(|lag| lag.parse::<u64>().ok())
                        .is_some_and(|lag| lag <= 1)
            })
        };
        eventually(LIMIT, "the master has the replica in step", || async {
            let info = answers(&on_master, &["INFO", "replication"], "state=online").await?;
            if in_step(&info) { Ok(()) } else { Err(info) }
        })
        .await;
        Some(replica)
    }

    /// Starts a replica of `master`.
    pub(crate) async fn replica_of(master: &Self) -> Option<Self> {
        Self::start_with(false, Some(master.port), false).await
    }

    pub(crate) async fn start_with(
        appendonly: bool,
        replica_of: Option<u16>,
        cluster: bool,
    ) -> Option<Self> {
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

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub(crate) async fn spawn(&mut self) {
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
    pub(crate) async fn serve_every_slot(&self) {
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
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// How many times each command ran so far, from `INFO commandstats` (which also counts
    /// the commands scripts run, and INFO itself).
    pub(crate) async fn stats(&self) -> std::collections::HashMap<String, u64> {
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

    pub(crate) async fn calls(&self, command: &str) -> u64 {
        self.stats().await.get(command).copied().unwrap_or(0)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fault-injecting proxy in front of `server`, a provider connected to the server directly,
/// and one connected through the proxy with `query` (`""` or `?key=value...`).
pub(crate) async fn behind_proxy(
    server: &PrivateRedis,
    query: &str,
) -> (dlock_proxy::Proxy, RedisProvider, RedisProvider) {
    let proxy = dlock_proxy::Proxy::start(("127.0.0.1", server.port))
        .await
        .unwrap();
    let direct = RedisProvider::connect(&server.url()).await.unwrap();
    let proxied = RedisProvider::connect(&format!("redis://{}{query}", proxy.addr()))
        .await
        .unwrap();
    (proxy, direct, proxied)
}

/// `Ok` once `n` fair waiters are queued for lock `name` (Redisson's queue), for
/// `eventually`.
pub(crate) async fn fair_queue_is(
    admin: &redis::aio::MultiplexedConnection,
    name: &str,
    n: usize,
) -> Result<(), String> {
    let mut admin = admin.clone();
    let queue = format!("redisson_lock_queue:{{{name}}}");
    let len: usize = admin.llen(&queue).await.map_err(|e| e.to_string())?;
    if len == n {
        Ok(())
    } else {
        Err(format!("{len} queued"))
    }
}

pub(crate) fn watchdog(ttl_ms: u64) -> LockOptions {
    LockOptions::new().with_lease(Lease::watchdog(Duration::from_millis(ttl_ms)))
}

/// A Sentinel of our own on a free loopback port, watching `master` under `name`; killed on
/// drop.
pub(crate) struct PrivateSentinel {
    pub(crate) port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// The Sentinel's own password (`requirepass`), if it has one.
    password: Option<String>,
}

impl PrivateSentinel {
    pub(crate) async fn start(master: &PrivateRedis, name: &str) -> Self {
        Self::start_with(master, name, None).await
    }

    pub(crate) async fn start_with(
        master: &PrivateRedis,
        name: &str,
        password: Option<&str>,
    ) -> Self {
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

    pub(crate) fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The master's port as this Sentinel knows it.
    pub(crate) async fn master_port(&self, name: &str) -> Result<u16, String> {
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
    pub(crate) async fn quorum(&self, name: &str) -> Result<(), String> {
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

/// Script calls (EVAL and EVALSHA) the server ran while `run` ran.
pub(crate) async fn script_calls<F: std::future::Future>(
    server: &PrivateRedis,
    run: F,
) -> (F::Output, u64) {
    let count = |stats: std::collections::HashMap<String, u64>| {
        stats.get("evalsha").copied().unwrap_or(0) + stats.get("eval").copied().unwrap_or(0)
    };
    let before = count(server.stats().await);
    let out = run.await;
    (out, count(server.stats().await) - before)
}

/// The `EVALSHA` calls a server ran, seen through `MONITOR`.
pub(crate) struct Monitor {
    pub(crate) calls: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    pub(crate) async fn start(url: &str) -> Self {
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

    pub(crate) fn clear(&self) {
        self.calls.lock().unwrap().clear();
    }

    /// How many calls since the last `clear` repeat an earlier one exactly (the same script
    /// with the same arguments: a client's re-send of one call).
    pub(crate) fn resent_scripts(&self) -> usize {
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

/// A fresh provider of the shared server, or `None` (skip) without one.
pub(crate) async fn shared() -> Option<(String, RedisProvider)> {
    let url = service_url("DLOCK_REDIS_URL")?;
    let p = RedisProvider::connect(&url).await.unwrap();
    Some((url, p))
}

/// Deletes every key of `name` that a test of several kinds may have left.
pub(crate) async fn forget(url: &str, name: &str) {
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
