//! The floor of each backend: the server calls one lock cycle needs, made directly with the
//! client library (no dlock) in the same run, so throughput can be read as a ratio.
//!
//! | backend | floor cycle |
//! | --- | --- |
//! | Redis | the two EVALSHA of dlock's acquire and release scripts |
//! | ZooKeeper | create (ephemeral sequential) + getChildren + delete |
//! | MySQL, PostgreSQL, SQLite unique-insert / optimistic | INSERT + DELETE of one row, on one connection |
//! | MySQL, PostgreSQL for-update | BEGIN + SELECT … FOR UPDATE + ROLLBACK (dlock's release too: the transaction changed nothing, and PostgreSQL flushes its log before it answers a COMMIT of one that locked a row) |
//! | etcd | the put-if-absent transaction (with the lease, reading the key and the first key by create revision) + the delete transaction |
//! | memory | none (no server) |

#[cfg(any(
    feature = "redis",
    feature = "zookeeper",
    feature = "mysql",
    feature = "sqlite",
    feature = "postgres",
    feature = "etcd"
))]
use std::time::Instant;

#[cfg(any(
    feature = "redis",
    feature = "zookeeper",
    feature = "mysql",
    feature = "sqlite",
    feature = "postgres",
    feature = "etcd"
))]
fn err(backend: &'static str, what: &str, e: impl std::fmt::Display) -> dlock::Error {
    dlock::Error::Backend {
        backend,
        message: format!("floor: {what}: {e}"),
        retryable: false,
        source: None,
    }
}

/// The table prefix of a SQL store's URL (`?table=`, `dlock` by default): the for-update
/// floor locks a row of the provider's own table. Only `[A-Za-z0-9_]` is kept (the provider
/// refuses anything else anyway).
#[cfg(any(feature = "mysql", feature = "sqlite", feature = "postgres"))]
fn table_of(url: &str) -> String {
    url.split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("table=")))
        .unwrap_or("dlock")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Cycles per second of the floor for the store `url` names, or `None` if it has none.
pub(super) async fn cycles_per_sec(url: &str, cycles: u64, ns: &str) -> dlock::Result<Option<f64>> {
    let timed = timed(url, cycles, ns, &Start(None)).await?;
    Ok(timed.and_then(|t| t.rate(cycles)))
}

/// When a floor's timed cycles began and ended, or `None` if the store has no floor. The
/// cycles begin once `start` says so.
async fn timed(url: &str, cycles: u64, ns: &str, start: &Start) -> dlock::Result<Option<Timed>> {
    let scheme = url.split("://").next().unwrap_or_default();
    let _ = (cycles, ns, start); // unused when no server backend is compiled in
    match scheme {
        #[cfg(feature = "redis")]
        "redis" | "rediss" if !url.contains("cluster=true") => {
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
            let cycle = |c: &mut redis::aio::MultiplexedConnection| {
                let mut c = c.clone();
                let (name, token, channel) = (name.clone(), token.clone(), channel.clone());
                async move {
                    let _: redis::Value = lock
                        .key(&name)
                        .key(&token)
                        .arg(30_000)
                        .arg("f:1")
                        .invoke_async(&mut c)
                        .await?;
                    let _: redis::Value = unlock
                        .key(&name)
                        .key(&channel)
                        .arg(0)
                        .arg(30_000)
                        .arg("f:1")
                        .arg("publish")
                        .invoke_async(&mut c)
                        .await?;
                    Ok::<_, redis::RedisError>(())
                }
            };
            cycle(&mut c)
                .await
                .map_err(|e| err("redis", "warm-up", e))?;
            let started = start.go().await;
            for _ in 0..cycles {
                cycle(&mut c).await.map_err(|e| err("redis", "cycle", e))?;
            }
            Ok(timed_since(started))
        }
        #[cfg(feature = "etcd")]
        "etcd" => etcd_floor(url, cycles, ns, start).await,
        #[cfg(feature = "zookeeper")]
        "zk" => {
            use zookeeper_client as zk;
            let hosts = url
                .trim_start_matches("zk://")
                .split(['/', '?'])
                .next()
                .unwrap_or("127.0.0.1:2181")
                .to_owned();
            let client = zk::Client::connect(&hosts)
                .await
                .map_err(|e| err("zookeeper", "connect", e))?;
            let dir = "/dlock-bench-floor";
            let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            match client.create(dir, b"", &persistent).await {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(err("zookeeper", "create the directory", e)),
            }
            let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let started = start.go().await;
            for _ in 0..cycles {
                let (_, seq) = client
                    .create(&format!("{dir}/lock-"), b"", &ephemeral)
                    .await
                    .map_err(|e| err("zookeeper", "create", e))?;
                client
                    .list_children(dir)
                    .await
                    .map_err(|e| err("zookeeper", "getChildren", e))?;
                client
                    .delete(&format!("{dir}/lock-{seq}"), None)
                    .await
                    .map_err(|e| err("zookeeper", "delete", e))?;
            }
            Ok(timed_since(started))
        }
        #[cfg(any(feature = "mysql", feature = "sqlite"))]
        "mysql" | "mariadb" | "sqlite" => {
            use sqlx::any::AnyPoolOptions;
            sqlx::any::install_default_drivers();
            let base = url
                .split('?')
                .next()
                .unwrap_or(url)
                .replacen("mariadb://", "mysql://", 1);
            let backend = if scheme == "sqlite" {
                "sqlite"
            } else {
                "mysql"
            };
            let sqlite = backend == "sqlite";
            // As durable as the provider: dlock's SQLite syncs every commit unless the URL
            // opts out with ?synchronous=normal.
            let synchronous = if url.contains("synchronous=normal") {
                "PRAGMA synchronous = NORMAL"
            } else {
                "PRAGMA synchronous = FULL"
            };
            let pool = AnyPoolOptions::new()
                .max_connections(1)
                .test_before_acquire(false)
                // The same settings dlock's own SQLite connections use, for a fair floor.
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        if sqlite {
                            use sqlx::Executor;
                            conn.execute("PRAGMA journal_mode = WAL").await?;
                            conn.execute(synchronous).await?;
                        }
                        Ok(())
                    })
                })
                .connect(&base)
                .await
                .map_err(|e| err(backend, "connect", e))?;
            let name = format!("{ns}/floor").into_bytes();
            let measured = if url.contains("strategy=for-update") {
                sqlx::query(&format!(
                    "INSERT IGNORE INTO {}_rows (name) VALUES (?)",
                    table_of(url)
                ))
                .bind(&name)
                .execute(&pool)
                .await
                .map_err(|e| err(backend, "create the row", e))?;
                let mut c = pool
                    .acquire()
                    .await
                    .map_err(|e| err(backend, "connect", e))?;
                let started = start.go().await;
                for _ in 0..cycles {
                    sqlx::query("BEGIN")
                        .execute(&mut *c)
                        .await
                        .map_err(|e| err(backend, "BEGIN", e))?;
                    sqlx::query(&format!(
                        "SELECT name FROM {}_rows WHERE name = ? FOR UPDATE",
                        table_of(url)
                    ))
                    .bind(&name)
                    .fetch_optional(&mut *c)
                    .await
                    .map_err(|e| err(backend, "SELECT FOR UPDATE", e))?;
                    sqlx::query("ROLLBACK")
                        .execute(&mut *c)
                        .await
                        .map_err(|e| err(backend, "ROLLBACK", e))?;
                }
                timed_since(started)
            } else {
                let ddl = if backend == "sqlite" {
                    "CREATE TABLE IF NOT EXISTS dlock_bench_floor (name BLOB NOT NULL PRIMARY KEY)"
                } else {
                    "CREATE TABLE IF NOT EXISTS dlock_bench_floor (name VARBINARY(255) NOT NULL PRIMARY KEY) ENGINE=InnoDB"
                };
                sqlx::query(ddl)
                    .execute(&pool)
                    .await
                    .map_err(|e| err(backend, "create the table", e))?;
                // One connection for every cycle, as on PostgreSQL: a statement on the pool
                // would also pay for the pool's ping of each connection it takes back.
                let mut c = pool
                    .acquire()
                    .await
                    .map_err(|e| err(backend, "connect", e))?;
                let started = start.go().await;
                for _ in 0..cycles {
                    sqlx::query("INSERT INTO dlock_bench_floor (name) VALUES (?)")
                        .bind(&name)
                        .execute(&mut *c)
                        .await
                        .map_err(|e| err(backend, "INSERT", e))?;
                    sqlx::query("DELETE FROM dlock_bench_floor WHERE name = ?")
                        .bind(&name)
                        .execute(&mut *c)
                        .await
                        .map_err(|e| err(backend, "DELETE", e))?;
                }
                timed_since(started)
            };
            pool.close().await;
            Ok(measured)
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let base = url.split('?').next().unwrap_or(url);
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .test_before_acquire(false)
                .connect(base)
                .await
                .map_err(|e| err("postgres", "connect", e))?;
            let measured = postgres_floor(&pool, url, cycles, ns, start).await;
            pool.close().await;
            measured
        }
        _ => Ok(None),
    }
}

/// PostgreSQL's floor, on one connection: the advisory cycle, the for-update cycle, or
/// INSERT + a DELETE that announces itself (`pg_notify`, as dlock's releases do).
#[cfg(feature = "postgres")]
async fn postgres_floor(
    pool: &sqlx::PgPool,
    url: &str,
    cycles: u64,
    ns: &str,
    start: &Start,
) -> dlock::Result<Option<Timed>> {
    let e = |what: &'static str| move |e| err("postgres", what, e);
    let name = format!("{ns}/floor").into_bytes();
    let mut c = pool.acquire().await.map_err(e("connect"))?;
    if url.contains("strategy=advisory") {
        // The statements of dlock's advisory cycle, raw: one that takes the lock, the token
        // and the lease, one that unlocks (and resets the session).
        let t = table_of(url);
        sqlx::query(&format!(
            "INSERT INTO {t}_names (name) VALUES ($1) ON CONFLICT (name) DO NOTHING"
        ))
        .bind(&name)
        .execute(&mut *c)
        .await
        .map_err(e("give the name a key"))?;
        let key: i32 = sqlx::query_scalar(&format!("SELECT id FROM {t}_names WHERE name = $1"))
            .bind(&name)
            .fetch_one(&mut *c)
            .await
            .map_err(e("read the key"))?;
        let lock = format!(
            "WITH g AS MATERIALIZED (SELECT pg_try_advisory_lock(1684828003, $1) AS got), \
             f AS (UPDATE {t}_names SET token = token + 1 WHERE id = $1 AND (SELECT got FROM g) \
             RETURNING token) \
             SELECT (SELECT token FROM f), CASE WHEN (SELECT got FROM g) THEN \
             set_config('idle_session_timeout', '30000', false) END, pg_backend_pid()::BIGINT"
        );
        let unlock = "SELECT pg_advisory_unlock(1684828003, $1)::INTEGER, \
             set_config('idle_session_timeout', '0', false), set_config('lock_timeout', '5s', false)";
        let started = start.go().await;
        for _ in 0..cycles {
            sqlx::query(&lock)
                .bind(key)
                .fetch_one(&mut *c)
                .await
                .map_err(e("lock"))?;
            sqlx::query(unlock)
                .bind(key)
                .fetch_one(&mut *c)
                .await
                .map_err(e("unlock"))?;
        }
        return Ok(timed_since(started));
    }
    if url.contains("strategy=for-update") {
        sqlx::query(&format!(
            "INSERT INTO {}_rows (name) VALUES ($1) ON CONFLICT DO NOTHING",
            table_of(url)
        ))
        .bind(&name)
        .execute(&mut *c)
        .await
        .map_err(e("create the row"))?;
        let started = start.go().await;
        for _ in 0..cycles {
            sqlx::query("BEGIN")
                .execute(&mut *c)
                .await
                .map_err(e("BEGIN"))?;
            sqlx::query(&format!(
                "SELECT name FROM {}_rows WHERE name = $1 FOR UPDATE",
                table_of(url)
            ))
            .bind(&name)
            .fetch_optional(&mut *c)
            .await
            .map_err(e("SELECT FOR UPDATE"))?;
            sqlx::query("ROLLBACK")
                .execute(&mut *c)
                .await
                .map_err(e("ROLLBACK"))?;
        }
        return Ok(timed_since(started));
    }
    sqlx::query("CREATE TABLE IF NOT EXISTS dlock_bench_floor (name BYTEA NOT NULL PRIMARY KEY)")
        .execute(&mut *c)
        .await
        .map_err(e("create the table"))?;
    let started = start.go().await;
    for _ in 0..cycles {
        sqlx::query("INSERT INTO dlock_bench_floor (name) VALUES ($1)")
            .bind(&name)
            .execute(&mut *c)
            .await
            .map_err(e("INSERT"))?;
        // A release announces itself (NOTIFY), as dlock's does on PostgreSQL.
        sqlx::query(
            "WITH d AS (DELETE FROM dlock_bench_floor WHERE name = $1 RETURNING name) \
             SELECT pg_notify('dlock_bench_floor', encode(name, 'escape')) FROM d",
        )
        .bind(&name)
        .execute(&mut *c)
        .await
        .map_err(e("DELETE"))?;
    }
    Ok(timed_since(started))
}

/// etcd's floor: the two transactions of an uncontended dlock cycle, on one client with one
/// lease granted up front (as a provider's): put the key if absent, with the lease, reading
/// it and the range's first key by create revision; then delete it if it is still that key.
#[cfg(feature = "etcd")]
async fn etcd_floor(
    url: &str,
    cycles: u64,
    ns: &str,
    start: &Start,
) -> dlock::Result<Option<Timed>> {
    use dlock_etcd::etcd_client::{
        Client, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
        TxnOpResponse,
    };
    let config = dlock_etcd::EtcdConfig::from_url(url)?;
    let mut client = Client::connect(&config.endpoints, None)
        .await
        .map_err(|e| err("etcd", "connect", e))?;
    // Long enough for the whole run without keep-alives (which dlock sends from a task of
    // its own, off the cycle's path); revoked at the end.
    let ttl = i64::try_from(config.lease_ttl.as_secs())
        .unwrap_or(i64::MAX)
        .max(3600);
    let lease = client
        .lease_grant(ttl, None)
        .await
        .map_err(|e| err("etcd", "grant a lease", e))?
        .id();
    let range = format!("{}{ns}%2Ffloor/", config.prefix);
    let key = format!("{range}{lease:x}");
    let first = || {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
    };
    let started = start.go().await;
    let mut measured = Ok(());
    for _ in 0..cycles {
        let put = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.as_str(), "", Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(key.as_str(), None),
                TxnOp::get(range.as_str(), Some(first())),
            ])
            .or_else([
                TxnOp::get(key.as_str(), None),
                TxnOp::get(range.as_str(), Some(first())),
            ]);
        let created = match client.txn(put).await {
            Ok(r) => r,
            Err(e) => {
                measured = Err(err("etcd", "put", e));
                break;
            }
        };
        let revision = created
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.create_revision()),
                _ => None,
            })
            .unwrap_or(0);
        let delete = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        if let Err(e) = client.txn(delete).await {
            measured = Err(err("etcd", "delete", e));
            break;
        }
    }
    let timed = timed_since(started);
    let _ = client.lease_revoke(lease).await;
    measured.map(|()| timed)
}

/// The W4 floor: 8 clients of the client library at once, each with its own connection and
/// name, each making `cycles` floor cycles; all the cycles over the time from the first
/// client's start to the last one's end, or `None` if the store has no floor.
///
/// The clients connect first and start their cycles together, so none runs alone for a
/// while (a sum of per-client rates would count such a stretch at its solo speed), and the
/// rate is measured as dlock's W4 is: total cycles over wall-clock time.
pub(super) async fn concurrent_cycles_per_sec(
    url: &str,
    cycles: u64,
    ns: &str,
) -> dlock::Result<Option<f64>> {
    const CLIENTS: usize = 8;
    let together = std::sync::Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..CLIENTS {
        let (url, ns) = (url.to_owned(), format!("{ns}/floor{i}"));
        let start = Start(Some(std::sync::Arc::clone(&together)));
        clients.spawn(async move { timed(&url, cycles, &ns, &start).await });
    }
    let mut span: Option<Timed> = None;
    // The first error ends the floor at once: a client that failed before the start would
    // otherwise keep the others waiting for it (dropping the set stops them).
    while let Some(done) = clients.join_next().await {
        let done =
            done.map_err(|e| dlock::Error::config(format!("a floor client panicked: {e}")))??;
        let Some(t) = done else {
            return Ok(None);
        };
        span = Some(match span {
            None => t,
            Some(s) => Timed {
                started: s.started.min(t.started),
                ended: s.ended.max(t.ended),
            },
        });
    }
    let all = cycles.saturating_mul(CLIENTS as u64);
    Ok(span.and_then(|s| s.rate(all)))
}

/// When a floor's timed cycles begin: at once, or once every client of a W4 floor is
/// connected and ready (the barrier they share).
struct Start(Option<std::sync::Arc<tokio::sync::Barrier>>);

// Without a server backend no floor starts.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "zookeeper",
        feature = "mysql",
        feature = "sqlite",
        feature = "postgres",
        feature = "etcd"
    )),
    allow(dead_code)
)]
impl Start {
    /// Waits for the start; the time the cycles begin.
    async fn go(&self) -> std::time::Instant {
        if let Some(together) = &self.0 {
            together.wait().await;
        }
        std::time::Instant::now()
    }
}

/// When a floor's timed cycles began and ended.
#[derive(Clone, Copy)]
struct Timed {
    started: std::time::Instant,
    ended: std::time::Instant,
}

impl Timed {
    /// `cycles` over the time from start to end; `None` if no cycle ran or no time passed
    /// (a floor of 0 would make the ratio to it infinite).
    fn rate(self, cycles: u64) -> Option<f64> {
        let secs = self
            .ended
            .saturating_duration_since(self.started)
            .as_secs_f64();
        (cycles > 0 && secs > 0.0).then(|| cycles as f64 / secs)
    }
}

/// The cycles that began at `started` ended now.
#[cfg(any(
    feature = "redis",
    feature = "zookeeper",
    feature = "mysql",
    feature = "sqlite",
    feature = "postgres",
    feature = "etcd"
))]
fn timed_since(started: Instant) -> Option<Timed> {
    Some(Timed {
        started,
        ended: Instant::now(),
    })
}

/// Connections the server counts right now (Redis clients, MySQL threads), for W6; `None`
/// where it is not read (ZooKeeper: one session per provider by design, which its tests check).
pub(super) async fn server_connections(url: &str) -> Option<i64> {
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme {
        #[cfg(feature = "redis")]
        "redis" | "rediss" if !url.contains("cluster=true") => {
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
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            use sqlx::Row;
            sqlx::any::install_default_drivers();
            let base = url
                .split('?')
                .next()
                .unwrap_or(url)
                .replacen("mariadb://", "mysql://", 1);
            let pool = sqlx::any::AnyPoolOptions::new()
                .max_connections(1)
                .connect(&base)
                .await
                .ok()?;
            let row = sqlx::query("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
                .fetch_one(&pool)
                .await
                .ok()?;
            let n: String = row.try_get(1).ok()?;
            pool.close().await;
            n.parse::<i64>().ok().map(|n| n - 1)
        }
        _ => None,
    }
}
