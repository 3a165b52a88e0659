//! The rigs the SQL tests share: the servers and files they run on, the URLs they make, the
//! databases read behind dlock's back, worker processes, and a log of the statements sent.
#![allow(dead_code)]

use std::time::Duration;

use dlock_conformance::{Names, eventually, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_sql::SqlProvider;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};

mod statement_log;
mod workers;

// Each test binary uses some of the rigs.
#[allow(unused_imports)]
pub(crate) use statement_log::Statements;
#[allow(unused_imports)]
pub(crate) use workers::{await_held, spawn_worker};

/// The tests here that start worker processes or kill connections run one at a time, so their
/// timing does not depend on each other's load.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A mutex on `name` of `p`, with the default options, acquired.
pub(crate) async fn hold(p: &SqlProvider, name: &str) -> dlock_core::LockGuard {
    use dlock_core::{LockOptions, LockProvider};
    p.lock(name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap()
}

pub(crate) async fn admin(url: &str) -> AnyPool {
    sqlx::any::install_default_drivers();
    let url = url.split('?').next().unwrap();
    AnyPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap()
}

pub(crate) fn sqlite_url(strategy: &str) -> (String, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("dlock-sql-{}.db", uuid::Uuid::new_v4().simple()));
    (
        format!("sqlite://{}?strategy={strategy}", path.display()),
        path,
    )
}

pub(crate) fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// The table prefix the tests give `strategy` on a shared server: one set of tables serves
/// one strategy (a provider with another is refused).
pub(crate) fn prefix(strategy: &str) -> String {
    format!("dlock_{}", strategy.replace('-', "_"))
}

/// The table prefix a test URL names (`dlock` by default).
pub(crate) fn table_of(url: &str) -> String {
    url.split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("table=")))
        .unwrap_or("dlock")
        .to_owned()
}

/// `base` for a for-update provider, on the for-update tables.
pub(crate) fn for_update(base: &str) -> String {
    with_query(
        base,
        &format!("strategy=for-update&table={}", prefix("for-update")),
    )
}

/// `url` with `pair` added to its query string (a configured URL may have one already).
pub(crate) fn with_query(url: &str, pair: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{pair}")
}

/// Every (url, label) this machine can test: MySQL strategies when configured, SQLite ones
/// always. SQLite files are returned for cleanup.
pub(crate) fn targets(strategies: &[&str]) -> Vec<(String, String, Option<std::path::PathBuf>)> {
    let mut out = Vec::new();
    if let Some(mysql) = service_url("DLOCK_MYSQL_URL") {
        // Advisory locks are PostgreSQL's.
        for s in strategies.iter().filter(|s| **s != "advisory") {
            out.push((
                with_query(&mysql, &format!("strategy={s}&table={}", prefix(s))),
                format!("mysql/{s}"),
                None,
            ));
        }
    }
    // SQLite has neither row locks nor named locks.
    for s in strategies
        .iter()
        .filter(|s| !["for-update", "advisory", "get-lock"].contains(*s))
    {
        let (url, path) = sqlite_url(s);
        out.push((url, format!("sqlite/{s}"), Some(path)));
    }
    out
}

/// [`targets`], and PostgreSQL's strategies when `DLOCK_POSTGRES_URL` is configured.
pub(crate) fn targets_with_postgres(
    strategies: &[&str],
) -> Vec<(String, String, Option<std::path::PathBuf>)> {
    let mut out = targets(strategies);
    if let Some(pg) = service_url("DLOCK_POSTGRES_URL") {
        // Named locks (get-lock) are MySQL's.
        for s in strategies.iter().filter(|s| **s != "get-lock") {
            out.push((
                with_query(&pg, &format!("strategy={s}&table={}", prefix(s))),
                format!("postgres/{s}"),
                None,
            ));
        }
    }
    out
}

/// `sql` with PostgreSQL's numbered placeholders when `url` is PostgreSQL's.
pub(crate) fn q(url: &str, sql: &str) -> String {
    if !url.starts_with("postgres") {
        return sql.to_owned();
    }
    let mut n = 0;
    sql.chars()
        .map(|c| {
            if c == '?' {
                n += 1;
                format!("${n}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A PostgreSQL advisory read-write lock on its own tables.
pub(crate) async fn advisory_rw(base: &str) -> (SqlProvider, String) {
    let url = with_query(
        base,
        &format!("strategy=advisory&table={}", prefix("advisory")),
    );
    (SqlProvider::connect(&url).await.unwrap(), url)
}

/// How many advisory locks on `name`'s key the server has granted, and how many it has not
/// (waiting statements).
pub(crate) async fn advisory_locks(db: &AnyPool, name: &str) -> (i64, i64) {
    let t = prefix("advisory");
    let key: i32 = sqlx::query(&format!("SELECT id FROM {t}_names WHERE name = $1"))
        .bind(name.as_bytes().to_vec())
        .fetch_one(db)
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
    let row = sqlx::query(
        "SELECT COUNT(*) FILTER (WHERE granted), COUNT(*) FILTER (WHERE NOT granted) \
         FROM pg_locks WHERE locktype = 'advisory' AND classid = 1684828003 \
         AND objid = $1::INTEGER::OID AND objsubid = 2",
    )
    .bind(key)
    .fetch_one(db)
    .await
    .unwrap();
    (row.try_get(0).unwrap(), row.try_get(1).unwrap())
}

/// With both connections of `provider`'s pool (those `alive` counts) ended by the server while
/// idle, a free lock is still acquired, released and acquired again.
pub(crate) async fn ends_idle_connections(
    label: &str,
    provider: &SqlProvider,
    admin: &AnyPool,
    alive: &str,
) {
    let name = Names::new().name("idle-ended");
    let lock = provider.lock(&name, LockOptions::default()).unwrap();
    eventually(
        Duration::from_secs(20),
        &format!("{label}: the server ends the pool's idle connections"),
        || async {
            let n: i64 = sqlx::query(alive)
                .fetch_one(admin)
                .await
                .map_err(|e| e.to_string())?
                .try_get(0)
                .map_err(|e| e.to_string())?;
            if n == 0 {
                Ok(())
            } else {
                Err(format!("{n} still open"))
            }
        },
    )
    .await;
    for round in 0..2 {
        let g = lock
            .try_acquire(Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{label}: round {round}: acquire of a free lock on a pool whose idle \
                     connections the server ended: {e}"
                )
            })
            .unwrap_or_else(|| panic!("{label}: round {round}: a free lock was reported held"));
        g.release().await.unwrap();
    }
}

/// The backends of the provider whose connections carry `app` as their application name,
/// apart from its release listener.
pub(crate) const OWN_BACKENDS: &str = "SELECT COUNT(*) FROM pg_stat_activity \
     WHERE application_name = $1 AND query NOT LIKE 'LISTEN%'";

pub(crate) async fn own_backends(db: &AnyPool, app: &str) -> i64 {
    sqlx::query(OWN_BACKENDS)
        .bind(app)
        .fetch_one(db)
        .await
        .unwrap()
        .get(0)
}

/// A PostgreSQL URL for `strategy` on its shared tables, whose connections name themselves
/// `app`, with `extra` query parameters.
pub(crate) fn pg_app_url(pg: &str, strategy: &str, app: &str, extra: &str) -> String {
    with_query(
        pg,
        &format!(
            "strategy={strategy}&table={}&application_name={app}{extra}",
            prefix(strategy)
        ),
    )
}

/// A provider on the application's `pool` with `strategy`, dlock's tables `<table>_…` and
/// (for the pinned strategies) a lock pool of `lock_pool` connections.
#[allow(dead_code)]
pub(crate) async fn on_pool(
    pool: impl Into<dlock_sql::SqlPool>,
    strategy: dlock_sql::Strategy,
    table: &str,
    lock_pool: u32,
) -> dlock_core::Result<SqlProvider> {
    let pool = pool.into();
    // The config's URL only gives the dialect: the pool names the database.
    let url = match pool.dialect() {
        dlock_sql::Dialect::Postgres => "postgres://localhost",
        dlock_sql::Dialect::Sqlite => "sqlite://unused.db",
        _ => "mysql://localhost",
    };
    let config = dlock_sql::SqlConfig::from_url(url)
        .unwrap()
        .with_strategy(strategy)
        .with_table(table)
        .with_pool_size(lock_pool);
    SqlProvider::from_pool(pool, &config).await
}
