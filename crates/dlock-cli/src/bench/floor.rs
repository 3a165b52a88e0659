//! The floor of each backend: the server calls one lock cycle needs, made directly with the
//! client library (no dlock) in the same run, so throughput can be read as a ratio.
//!
//! | backend | floor cycle |
//! | --- | --- |
//! | Redis | the two EVALSHA of dlock's acquire and release scripts |
//! | ZooKeeper | create (ephemeral sequential) and getChildren sent together, then delete |
//! | MySQL, PostgreSQL, SQLite | dlock's statements of the strategy's uncontended cycle ([`dlock_sql::raw::Cycle`]), on one connection (for-update's fence on a second one, as dlock takes it from its pool) |
//! | MySQL, PostgreSQL for-update, besides | the row lock alone: BEGIN + SELECT … FOR UPDATE + ROLLBACK, no fence ([`Floor::LockOnly`]) |
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

/// What a floor makes raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Floor {
    /// The server calls of one uncontended dlock cycle: every store's floor.
    Cycle,
    /// SQL for-update only (`None` elsewhere): the row lock alone, `BEGIN`, `SELECT … FOR
    /// UPDATE`, `ROLLBACK`, without the fencing token dlock takes and commits on another
    /// connection: what a lock without a fence would cost.
    LockOnly,
}

/// Cycles per second of the floor for the store `url` names, or `None` if it has none.
pub(super) async fn cycles_per_sec(
    url: &str,
    cycles: u64,
    ns: &str,
    floor: Floor,
) -> dlock::Result<Option<Measured>> {
    let timed = timed(url, cycles, ns, &Start(None), floor).await?;
    Ok(timed.and_then(|t| {
        Some(Measured {
            rate: t.rate(cycles)?,
            cpu: t.cpu,
        })
    }))
}

/// A floor's cycles per second, and the CPU time its cycles took.
pub(super) struct Measured {
    pub(super) rate: f64,
    pub(super) cpu: Option<std::time::Duration>,
}

/// When a floor's timed cycles began and ended, or `None` if the store has no floor. The
/// cycles begin once `start` says so.
async fn timed(
    url: &str,
    cycles: u64,
    ns: &str,
    start: &Start,
    floor: Floor,
) -> dlock::Result<Option<Timed>> {
    let scheme = url.split("://").next().unwrap_or_default();
    let _ = (cycles, ns, start); // unused when no server backend is compiled in
    // Only a SQL for-update lock has a row lock to measure alone (decided before connecting).
    let for_update = matches!(scheme, "mysql" | "mariadb" | "postgres" | "postgresql")
        && strategy_of(url) == "for-update";
    if floor == Floor::LockOnly && !for_update {
        return Ok(None);
    }
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
            let base = format!("{dir}/lock-");
            for _ in 0..cycles {
                // Sent together, as dlock sends them: the client sends a request when the
                // call is made, and the server answers a session's requests in order.
                let created = client.create(&base, b"", &ephemeral);
                let listed = client.list_children(dir);
                let (_, seq) = created.await.map_err(|e| err("zookeeper", "create", e))?;
                listed
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
                .max_connections(2)
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
            let measured = any_floor(&pool, backend, url, cycles, ns, start, floor).await;
            pool.close().await;
            measured
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let base = url.split('?').next().unwrap_or(url);
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .test_before_acquire(false)
                .connect(base)
                .await
                .map_err(|e| err("postgres", "connect", e))?;
            let measured = postgres_floor(&pool, url, cycles, ns, start, floor).await;
            pool.close().await;
            measured
        }
        _ => Ok(None),
    }
}

/// The lease a floor's for-update and unique-insert cycles give the server, as dlock's
/// default lease does (30 s).
#[cfg(any(feature = "mysql", feature = "sqlite", feature = "postgres"))]
const LEASE_SECS: i64 = 30;

/// The owner a floor's unique-insert and optimistic cycles write, as long as one of dlock's
/// (a client id and a counter).
#[cfg(any(feature = "mysql", feature = "sqlite", feature = "postgres"))]
const OWNER: &str = "0123456789abcdef0123456789abcdef:1";

/// The floor of a MySQL or SQLite store, through sqlx's `Any` driver on a pool of two
/// connections (the for-update fence, like dlock's, goes out on the second): dlock's
/// statements of one uncontended cycle of the URL's strategy, or the row lock alone.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
async fn any_floor(
    pool: &sqlx::AnyPool,
    backend: &'static str,
    url: &str,
    cycles: u64,
    ns: &str,
    start: &Start,
    floor: Floor,
) -> dlock::Result<Option<Timed>> {
    use sqlx::Executor;
    let e = |what: &'static str| move |e| err(backend, what, e);
    let name = format!("{ns}/floor").into_bytes();
    let dialect = if backend == "sqlite" {
        dlock_sql::Dialect::Sqlite
    } else {
        dlock_sql::Dialect::MySql
    };
    let cycle = dlock_sql::raw::Cycle::new(dialect, &table_of(url))?;
    let mut c = pool.acquire().await.map_err(e("connect"))?;
    let strategy = strategy_of(url);
    if strategy == "for-update" {
        sqlx::query(cycle.insert_row())
            .bind(&name)
            .execute(&mut *c)
            .await
            .map_err(e("create the row"))?;
        if floor == Floor::LockOnly {
            let lock = format!(
                "SELECT name FROM {}_rows WHERE name = ? FOR UPDATE",
                table_of(url)
            );
            let started = start.go().await;
            for _ in 0..cycles {
                c.execute("BEGIN").await.map_err(e("BEGIN"))?;
                sqlx::query(&lock)
                    .bind(&name)
                    .fetch_optional(&mut *c)
                    .await
                    .map_err(e("SELECT FOR UPDATE"))?;
                c.execute("ROLLBACK").await.map_err(e("ROLLBACK"))?;
            }
            return Ok(timed_since(started));
        }
        // The session of dlock's holds: on MySQL autocommit off, so that the row stays
        // locked until the ROLLBACK (the fence's connection keeps autocommit, as dlock's).
        for setting in cycle.lock_session() {
            c.execute(*setting)
                .await
                .map_err(e("set the lock session"))?;
        }
        let mut f = pool.acquire().await.map_err(e("connect"))?;
        let (lock, unlock) = (cycle.lock_row(&name, LEASE_SECS), cycle.unlock_row());
        let started = start.go().await;
        for _ in 0..cycles {
            let rows = c.fetch_all(lock.as_str()).await.map_err(e("lock"))?;
            if rows.is_empty() {
                return Err(err(backend, "lock", "the row was not granted"));
            }
            sqlx::query(cycle.next_fence())
                .bind(&name)
                .execute(&mut *f)
                .await
                .map_err(e("fence"))?;
            if let Some(confirm) = cycle.confirm_lease() {
                sqlx::query(confirm)
                    .bind(LEASE_SECS)
                    .execute(&mut *c)
                    .await
                    .map_err(e("confirm the lease"))?;
            }
            c.execute(unlock.as_str()).await.map_err(e("unlock"))?;
        }
        return Ok(timed_since(started));
    }
    let sqlite = dialect == dlock_sql::Dialect::Sqlite;
    if strategy == "optimistic" {
        sqlx::query(cycle.insert_version())
            .bind(&name)
            .bind(0i64)
            .execute(&mut *c)
            .await
            .map_err(e("create the version"))?;
        let mut version: i64 = sqlx::query_scalar(cycle.select_version())
            .bind(&name)
            .fetch_one(&mut *c)
            .await
            .map_err(e("read the version"))?;
        let started = start.go().await;
        for _ in 0..cycles {
            let claim = sqlx::query(cycle.claim_version())
                .bind(OWNER)
                .bind(LEASE_SECS * 1000)
                .bind(&name)
                .bind(version);
            let claimed = if sqlite {
                claim.fetch_optional(&mut *c).await.map(|row| row.is_some())
            } else {
                claim
                    .execute(&mut *c)
                    .await
                    .map(|done| done.rows_affected() == 1)
            };
            if !claimed.map_err(e("claim"))? {
                return Err(err(backend, "claim", "the version moved"));
            }
            version += 1;
            sqlx::query(cycle.release_version())
                .bind(&name)
                .bind(OWNER)
                .bind(version)
                .execute(&mut *c)
                .await
                .map_err(e("release"))?;
        }
        return Ok(timed_since(started));
    }
    let started = start.go().await;
    for _ in 0..cycles {
        let insert = sqlx::query(cycle.insert_hold())
            .bind(&name)
            .bind(OWNER)
            .bind(LEASE_SECS * 1000);
        if sqlite {
            insert.fetch_one(&mut *c).await.map(drop)
        } else {
            insert.execute(&mut *c).await.map(drop)
        }
        .map_err(e("insert"))?;
        sqlx::query(cycle.delete_hold())
            .bind(&name)
            .bind(OWNER)
            .execute(&mut *c)
            .await
            .map_err(e("delete"))?;
    }
    Ok(timed_since(started))
}

/// The strategy a SQL store's URL names (`unique-insert` when it names none).
fn strategy_of(url: &str) -> &str {
    url.split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("strategy=")))
        .unwrap_or("unique-insert")
}

/// PostgreSQL's floor, on a pool of two connections (the for-update fence, like dlock's,
/// goes out on the second): dlock's statements of one uncontended cycle of the URL's
/// strategy, or the row lock alone.
#[cfg(feature = "postgres")]
async fn postgres_floor(
    pool: &sqlx::PgPool,
    url: &str,
    cycles: u64,
    ns: &str,
    start: &Start,
    floor: Floor,
) -> dlock::Result<Option<Timed>> {
    use sqlx::{Executor, Row};
    let e = |what: &'static str| move |e| err("postgres", what, e);
    let name = format!("{ns}/floor").into_bytes();
    let t = table_of(url);
    let cycle = dlock_sql::raw::Cycle::new(dlock_sql::Dialect::Postgres, &t)?;
    let mut c = pool.acquire().await.map_err(e("connect"))?;
    let strategy = strategy_of(url);
    if strategy == "advisory" {
        // The statements of dlock's advisory cycle, raw: one that takes the lock, the token
        // and the lease, one that unlocks (and resets the session).
        sqlx::query(cycle.advisory_new_key())
            .bind(&name)
            .execute(&mut *c)
            .await
            .map_err(e("give the name a key"))?;
        let key: i32 = sqlx::query_scalar(cycle.advisory_key())
            .bind(&name)
            .fetch_one(&mut *c)
            .await
            .map_err(e("read the key"))?;
        let key = i64::from(key);
        let started = start.go().await;
        for _ in 0..cycles {
            let row = sqlx::query(cycle.advisory_lock())
                .bind(key)
                .bind(LEASE_SECS)
                .fetch_one(&mut *c)
                .await
                .map_err(e("lock"))?;
            // The lease column is NULL while the lock is busy: a floor of failed tries would
            // measure something else.
            let leased: Option<String> = row.try_get(1).map_err(e("lock"))?;
            if leased.is_none() {
                return Err(err("postgres", "lock", "the advisory lock was not granted"));
            }
            sqlx::query(cycle.advisory_unlock())
                .bind(key)
                .fetch_one(&mut *c)
                .await
                .map_err(e("unlock"))?;
        }
        return Ok(timed_since(started));
    }
    if strategy == "for-update" {
        sqlx::query(cycle.insert_row())
            .bind(&name)
            .execute(&mut *c)
            .await
            .map_err(e("create the row"))?;
        if floor == Floor::LockOnly {
            let lock = format!("SELECT name FROM {t}_rows WHERE name = $1 FOR UPDATE");
            let started = start.go().await;
            for _ in 0..cycles {
                c.execute("BEGIN").await.map_err(e("BEGIN"))?;
                sqlx::query(&lock)
                    .bind(&name)
                    .fetch_optional(&mut *c)
                    .await
                    .map_err(e("SELECT FOR UPDATE"))?;
                c.execute("ROLLBACK").await.map_err(e("ROLLBACK"))?;
            }
            return Ok(timed_since(started));
        }
        let mut f = pool.acquire().await.map_err(e("connect"))?;
        let (lock, unlock) = (cycle.lock_row(&name, LEASE_SECS), cycle.unlock_row());
        let started = start.go().await;
        for _ in 0..cycles {
            let rows = c.fetch_all(lock.as_str()).await.map_err(e("lock"))?;
            let row = rows
                .first()
                .ok_or_else(|| err("postgres", "lock", "the row was not granted"))?;
            let session: i64 = row.try_get(0).map_err(e("lock"))?;
            let transaction: i64 = row.try_get(1).map_err(e("lock"))?;
            sqlx::query(cycle.next_fence())
                .bind(&name)
                .bind(transaction)
                .bind(session)
                .fetch_one(&mut *f)
                .await
                .map_err(e("fence"))?;
            c.execute(unlock.as_str()).await.map_err(e("unlock"))?;
        }
        return Ok(timed_since(started));
    }
    if strategy == "optimistic" {
        sqlx::query(cycle.insert_version())
            .bind(&name)
            .bind(0i64)
            .execute(&mut *c)
            .await
            .map_err(e("create the version"))?;
        let mut version: i64 = sqlx::query_scalar(cycle.select_version())
            .bind(&name)
            .fetch_one(&mut *c)
            .await
            .map_err(e("read the version"))?;
        let started = start.go().await;
        for _ in 0..cycles {
            let claimed: Option<i64> = sqlx::query_scalar(cycle.claim_version())
                .bind(OWNER)
                .bind(LEASE_SECS * 1000)
                .bind(&name)
                .bind(version)
                .fetch_optional(&mut *c)
                .await
                .map_err(e("claim"))?;
            version = claimed.ok_or_else(|| err("postgres", "claim", "the version moved"))?;
            sqlx::query(cycle.release_version())
                .bind(&name)
                .bind(OWNER)
                .bind(version)
                .execute(&mut *c)
                .await
                .map_err(e("release"))?;
        }
        return Ok(timed_since(started));
    }
    // unique-insert; its release notifies, as dlock's does.
    let started = start.go().await;
    for _ in 0..cycles {
        sqlx::query(cycle.insert_hold())
            .bind(&name)
            .bind(OWNER)
            .bind(LEASE_SECS * 1000)
            .fetch_one(&mut *c)
            .await
            .map_err(e("insert"))?;
        sqlx::query(cycle.delete_hold())
            .bind(&name)
            .bind(OWNER)
            .execute(&mut *c)
            .await
            .map_err(e("delete"))?;
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
        clients.spawn(async move { timed(&url, cycles, &ns, &start, Floor::Cycle).await });
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
                cpu: None,
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
    /// Waits for the start; when the cycles begin.
    async fn go(&self) -> Began {
        if let Some(together) = &self.0 {
            together.wait().await;
        }
        Began {
            at: std::time::Instant::now(),
            cpu: super::cpu_time(),
        }
    }
}

/// When a floor's timed cycles began, and the process's CPU time then.
#[derive(Clone, Copy)]
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
struct Began {
    at: std::time::Instant,
    cpu: Option<std::time::Duration>,
}

/// When a floor's timed cycles began and ended, and the process's CPU time over them (of
/// every client of a W4 floor, not only this one's).
#[derive(Clone, Copy)]
struct Timed {
    started: std::time::Instant,
    ended: std::time::Instant,
    cpu: Option<std::time::Duration>,
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
fn timed_since(began: Began) -> Option<Timed> {
    Some(Timed {
        started: began.at,
        ended: Instant::now(),
        cpu: super::cpu_time()
            .zip(began.cpu)
            .and_then(|(now, then)| now.checked_sub(then)),
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
