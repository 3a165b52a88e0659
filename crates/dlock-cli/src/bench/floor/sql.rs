//! The floor of a SQL store: dlock's statements of one uncontended cycle of the URL's strategy
//! ([`Cycle`]), or the row lock alone, on a pool of two connections (the for-update fence,
//! like dlock's, goes out on the second). MySQL and SQLite go through sqlx's `Any` driver,
//! PostgreSQL through its own; [`floor_on`] makes the statements they share, a [`Driver`]
//! those each makes its own way.

#[cfg(feature = "postgres")]
use std::sync::Arc;

use dlock_sql::Dialect;
use dlock_sql::raw::Cycle;
use sqlx::pool::Pool;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use super::{Floor, Job, Timed, err, strategy_of, timed_since};

/// The lease a floor's for-update and unique-insert cycles give the server, as dlock's
/// default lease does (30 s).
const LEASE_SECS: i64 = 30;

/// The owner a floor's unique-insert and optimistic cycles write, as long as one of dlock's
/// (a client id and a counter).
const OWNER: &str = "0123456789abcdef0123456789abcdef:1";

/// The floor of a MySQL or SQLite store, through sqlx's `Any` driver.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(super) async fn mysql_or_sqlite(job: &Job<'_>, scheme: &str) -> dlock::Result<Option<Timed>> {
    use sqlx::any::AnyPoolOptions;
    let url = job.url;
    sqlx::any::install_default_drivers();
    let base = any_url(url);
    let (backend, dialect) = if scheme == "sqlite" {
        ("sqlite", Dialect::Sqlite)
    } else {
        ("mysql", Dialect::MySql)
    };
    let sqlite = dialect == Dialect::Sqlite;
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
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    conn.execute(synchronous).await?;
                }
                Ok(())
            })
        })
        .connect(&base)
        .await
        .map_err(|e| err(backend, "connect", e))?;
    let measured = match Sql::new(backend, dialect, job) {
        Ok(sql) => floor_on(&pool, &sql, job).await,
        Err(e) => Err(e),
    };
    pool.close().await;
    measured
}

/// PostgreSQL's floor.
#[cfg(feature = "postgres")]
pub(super) async fn postgres(job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let url = job.url;
    let base = url.split('?').next().unwrap_or(url);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .test_before_acquire(false)
        .connect(base)
        .await
        .map_err(|e| err("postgres", "connect", e))?;
    let measured = match Sql::new("postgres", Dialect::Postgres, job) {
        // for-update on PostgreSQL is held as an advisory lock: the same statements.
        Ok(sql) if matches!(sql.strategy.as_str(), "advisory" | "for-update") => {
            advisory(&pool, &sql, job).await
        }
        Ok(sql) => floor_on(&pool, &sql, job).await,
        Err(e) => Err(e),
    };
    pool.close().await;
    measured
}

/// What a floor's statements are made of: dlock's statements for the URL's dialect and
/// table prefix, the strategy, and the name its cycles lock.
struct Sql {
    /// `sqlite`, `mysql` or `postgres`.
    backend: &'static str,
    strategy: String,
    /// The table prefix (`?table=`, `dlock` by default).
    table: String,
    cycle: Cycle,
    name: Vec<u8>,
}

impl Sql {
    /// The statements of the job's store on `backend`, for the name `<ns>/floor`.
    fn new(backend: &'static str, dialect: Dialect, job: &Job<'_>) -> dlock::Result<Self> {
        let table = table_of(job.url);
        Ok(Self {
            backend,
            strategy: strategy_of(job.url).to_owned(),
            cycle: Cycle::new(dialect, &table)?,
            table,
            name: format!("{}/floor", job.ns).into_bytes(),
        })
    }

    /// The error of `what`, with the driver's error.
    fn e<E: std::fmt::Display>(&self, what: &'static str) -> impl Fn(E) -> dlock::Error + use<E> {
        let backend = self.backend;
        move |e| err(backend, what, e)
    }
}

/// The URL sqlx's `Any` driver connects to for a MySQL or SQLite store's: without dlock's
/// options, and MariaDB's scheme as MySQL's.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn any_url(url: &str) -> String {
    url.split('?')
        .next()
        .unwrap_or(url)
        .replacen("mariadb://", "mysql://", 1)
}

/// The table prefix of a SQL store's URL (`?table=`, `dlock` by default): the for-update
/// floor locks a row of the provider's own table. Only `[A-Za-z0-9_]` is kept (the provider
/// refuses anything else anyway).
fn table_of(url: &str) -> String {
    url.split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("table=")))
        .unwrap_or("dlock")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The steps of a floor's cycle that a sqlx driver makes its own way (its rows, its results,
/// its placeholders).
trait Driver: Database {
    /// How a statement names its first parameter.
    const FIRST_PARAM: &'static str;

    /// for-update: the fencing token, taken on the second connection `f`, of the row that
    /// `rows` (the lock's answer) says is locked.
    async fn fence(sql: &Sql, rows: &[Self::Row], f: &mut Self::Connection) -> dlock::Result<()>;

    /// optimistic: claims the name at `version`; the version after the claim.
    async fn claim(sql: &Sql, c: &mut Self::Connection, version: i64) -> dlock::Result<i64>;

    /// unique-insert: inserts the hold.
    async fn insert_hold(sql: &Sql, c: &mut Self::Connection) -> dlock::Result<()>;
}

/// Sets `c` up as the session dlock's pinned holds live in ([`Cycle::lock_session`]).
async fn lock_session<DB>(sql: &Sql, c: &mut DB::Connection) -> dlock::Result<()>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    for setting in sql.cycle.lock_session() {
        text::<DB>(sql, c, setting, "set the lock session").await?;
    }
    Ok(())
}

/// Runs `statements` (one or more, sent as text, as dlock sends its pinned ones) on `c`: the
/// rows they answered.
async fn text<DB>(
    sql: &Sql,
    c: &mut DB::Connection,
    statements: &str,
    what: &'static str,
) -> dlock::Result<Vec<DB::Row>>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    c.fetch_all(statements).await.map_err(sql.e(what))
}

/// The floor's cycles of `sql`'s strategy (for-update, get-lock, optimistic, or else
/// unique-insert) on `pool`.
async fn floor_on<DB>(pool: &Pool<DB>, sql: &Sql, job: &Job<'_>) -> dlock::Result<Option<Timed>>
where
    DB: Driver,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    Vec<u8>: for<'q> Encode<'q, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
    (i64,): for<'r> FromRow<'r, DB::Row>,
{
    let (cycle, name) = (&sql.cycle, &sql.name);
    let (cycles, start) = (job.cycles, job.start);
    let mut c = pool.acquire().await.map_err(sql.e("connect"))?;
    match sql.strategy.as_str() {
        "for-update" => {
            sqlx::query(cycle.insert_row())
                .bind(name)
                .execute(&mut *c)
                .await
                .map_err(sql.e("create the row"))?;
            if job.floor == Floor::LockOnly {
                let lock = format!(
                    "SELECT name FROM {}_rows WHERE name = {} FOR UPDATE",
                    sql.table,
                    DB::FIRST_PARAM
                );
                let started = start.go().await;
                for _ in 0..cycles {
                    text::<DB>(sql, &mut c, "BEGIN", "BEGIN").await?;
                    sqlx::query(&lock)
                        .bind(name)
                        .fetch_optional(&mut *c)
                        .await
                        .map_err(sql.e("SELECT FOR UPDATE"))?;
                    text::<DB>(sql, &mut c, "ROLLBACK", "ROLLBACK").await?;
                }
                return Ok(timed_since(started));
            }
            // On MySQL autocommit off, so that the row stays locked until the ROLLBACK (the
            // fence's connection keeps autocommit, as dlock's).
            lock_session::<DB>(sql, &mut c).await?;
            let mut f = pool.acquire().await.map_err(sql.e("connect"))?;
            let (lock, unlock) = (cycle.lock_row(name, LEASE_SECS), cycle.unlock_row());
            let started = start.go().await;
            for _ in 0..cycles {
                let rows = text::<DB>(sql, &mut c, &lock, "lock").await?;
                DB::fence(sql, &rows, &mut f).await?;
                sqlx::query(cycle.confirm_lease())
                    .bind(LEASE_SECS)
                    .execute(&mut *c)
                    .await
                    .map_err(sql.e("confirm the lease"))?;
                text::<DB>(sql, &mut c, &unlock, "unlock").await?;
            }
            Ok(timed_since(started))
        }
        "get-lock" => {
            // Autocommit off: the token's INSERT commits in the lock's round trip, as dlock's.
            lock_session::<DB>(sql, &mut c).await?;
            let (lock, unlock) = (cycle.named_lock(name, LEASE_SECS), cycle.named_unlock(name));
            let started = start.go().await;
            for _ in 0..cycles {
                let rows = text::<DB>(sql, &mut c, &lock, "lock").await?;
                if rows.is_empty() {
                    return Err(err(
                        "mysql",
                        "lock",
                        "GET_LOCK's round trip answered no row",
                    ));
                }
                text::<DB>(sql, &mut c, &unlock, "unlock").await?;
            }
            Ok(timed_since(started))
        }
        // optimistic, or else unique-insert: the driver's claim or insert, then the release,
        // which names the owner, and on PostgreSQL its announcement, as dlock's.
        strategy => {
            let optimistic = strategy == "optimistic";
            let mut version = 0;
            if optimistic {
                sqlx::query(cycle.insert_version())
                    .bind(name)
                    .bind(0i64)
                    .execute(&mut *c)
                    .await
                    .map_err(sql.e("create the version"))?;
                version = sqlx::query_scalar(cycle.select_version())
                    .bind(name)
                    .fetch_one(&mut *c)
                    .await
                    .map_err(sql.e("read the version"))?;
            }
            let started = start.go().await;
            for _ in 0..cycles {
                let (release, what) = if optimistic {
                    version = DB::claim(sql, &mut c, version).await?;
                    let release = sqlx::query(cycle.release_version()).bind(name).bind(OWNER);
                    (release.bind(version), "release")
                } else {
                    DB::insert_hold(sql, &mut c).await?;
                    let release = sqlx::query(cycle.delete_hold()).bind(name).bind(OWNER);
                    (release, "delete")
                };
                release.execute(&mut *c).await.map_err(sql.e(what))?;
                if let Some(announce) = cycle.announce_release() {
                    sqlx::query(announce)
                        .bind(name)
                        .execute(&mut *c)
                        .await
                        .map_err(sql.e("announce"))?;
                }
            }
            Ok(timed_since(started))
        }
    }
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl Driver for sqlx::Any {
    const FIRST_PARAM: &'static str = "?";

    async fn fence(sql: &Sql, rows: &[Self::Row], f: &mut Self::Connection) -> dlock::Result<()> {
        if rows.is_empty() {
            return Err(err(sql.backend, "lock", "the row was not granted"));
        }
        sqlx::query(sql.cycle.next_fence())
            .bind(&sql.name)
            .execute(&mut *f)
            .await
            .map_err(sql.e("fence"))?;
        Ok(())
    }

    async fn claim(sql: &Sql, c: &mut Self::Connection, version: i64) -> dlock::Result<i64> {
        let claim = sqlx::query(sql.cycle.claim_version())
            .bind(OWNER)
            .bind(LEASE_SECS * 1000)
            .bind(&sql.name)
            .bind(version);
        let claimed = if sql.backend == "sqlite" {
            claim.fetch_optional(&mut *c).await.map(|row| row.is_some())
        } else {
            claim
                .execute(&mut *c)
                .await
                .map(|done| done.rows_affected() == 1)
        };
        if !claimed.map_err(sql.e("claim"))? {
            return Err(err(sql.backend, "claim", "the version moved"));
        }
        Ok(version + 1)
    }

    async fn insert_hold(sql: &Sql, c: &mut Self::Connection) -> dlock::Result<()> {
        let insert = sqlx::query(sql.cycle.insert_hold())
            .bind(&sql.name)
            .bind(OWNER)
            .bind(LEASE_SECS * 1000);
        if sql.backend == "sqlite" {
            insert.fetch_one(&mut *c).await.map(drop)
        } else {
            insert.execute(&mut *c).await.map(drop)
        }
        .map_err(sql.e("insert"))
    }
}

#[cfg(feature = "postgres")]
impl Driver for sqlx::Postgres {
    const FIRST_PARAM: &'static str = "$1";

    async fn fence(_: &Sql, _: &[Self::Row], _: &mut Self::Connection) -> dlock::Result<()> {
        // for-update on PostgreSQL is measured as the advisory cycle it is.
        Err(err(
            "postgres",
            "fence",
            "for-update on PostgreSQL has no row lock to fence",
        ))
    }

    async fn claim(sql: &Sql, c: &mut Self::Connection, version: i64) -> dlock::Result<i64> {
        let claimed: Option<i64> = sqlx::query_scalar(sql.cycle.claim_version())
            .bind(OWNER)
            .bind(LEASE_SECS * 1000)
            .bind(&sql.name)
            .bind(version)
            .fetch_optional(&mut *c)
            .await
            .map_err(sql.e("claim"))?;
        claimed.ok_or_else(|| err("postgres", "claim", "the version moved"))
    }

    async fn insert_hold(sql: &Sql, c: &mut Self::Connection) -> dlock::Result<()> {
        sqlx::query(sql.cycle.insert_hold())
            .bind(&sql.name)
            .bind(OWNER)
            .bind(LEASE_SECS * 1000)
            .fetch_one(&mut *c)
            .await
            .map_err(sql.e("insert"))?;
        Ok(())
    }
}

/// PostgreSQL's advisory floor: the statements of dlock's advisory cycle, raw: one that takes
/// the lock, the token and the lease, one that unlocks (and resets the session).
#[cfg(feature = "postgres")]
async fn advisory(pool: &sqlx::PgPool, sql: &Sql, job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let cycle = &sql.cycle;
    let mut c = pool.acquire().await.map_err(sql.e("connect"))?;
    sqlx::query(cycle.advisory_new_key())
        .bind(&sql.name)
        .bind(&sql.name)
        .execute(&mut *c)
        .await
        .map_err(sql.e("give the name a key"))?;
    let key: i32 = sqlx::query_scalar(cycle.advisory_key())
        .bind(&sql.name)
        .fetch_one(&mut *c)
        .await
        .map_err(sql.e("read the key"))?;
    let key = i64::from(key);
    let started = job.start.go().await;
    for _ in 0..job.cycles {
        advisory_cycle(cycle, &mut c, key).await?;
    }
    Ok(timed_since(started))
}

/// One advisory cycle on `c`: the statement that takes the lock of `key`, its token and its
/// lease, then the one that unlocks.
#[cfg(feature = "postgres")]
async fn advisory_cycle(cycle: &Cycle, c: &mut sqlx::PgConnection, key: i64) -> dlock::Result<()> {
    use sqlx::Row;
    let row = sqlx::query(cycle.advisory_lock())
        .bind(key)
        .bind(LEASE_SECS)
        .fetch_one(&mut *c)
        .await
        .map_err(|e| err("postgres", "lock", e))?;
    // The lease column is NULL while the lock is busy: a floor of failed tries would measure
    // something else.
    let leased: Option<String> = row.try_get(1).map_err(|e| err("postgres", "lock", e))?;
    if leased.is_none() {
        return Err(err("postgres", "lock", "the advisory lock was not granted"));
    }
    sqlx::query(cycle.advisory_unlock())
        .bind(key)
        .fetch_one(&mut *c)
        .await
        .map_err(|e| err("postgres", "unlock", e))?;
    Ok(())
}

/// PostgreSQL's W7 floor for the pinned strategies (advisory, and for-update, which is held
/// the same way): `tasks` tasks on one pool of as many connections as the provider's lock
/// pool (`?pool=`, 16 by default), each on a name of its own; a cycle takes a connection,
/// sends the advisory cycle's two statements on it and gives it back, as a pinned hold takes
/// and gives back a connection of its provider's lock pool. `None` for the row strategies,
/// whose statements take turns on the provider's pool another way.
#[cfg(feature = "postgres")]
pub(super) async fn postgres_shared(
    url: &str,
    tasks: u64,
    cycles: u64,
    ns: &str,
) -> dlock::Result<Option<f64>> {
    if !matches!(strategy_of(url), "advisory" | "for-update") {
        return Ok(None);
    }
    let config = dlock_sql::SqlConfig::from_url(url)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(config.pool)
        .test_before_acquire(false)
        .connect(url.split('?').next().unwrap_or(url))
        .await
        .map_err(|e| err("postgres", "connect", e))?;
    let cycle = Arc::new(Cycle::new(Dialect::Postgres, &table_of(url))?);
    let mut keys = Vec::new();
    for task in 0..tasks {
        let name = format!("{ns}/floor{task}").into_bytes();
        sqlx::query(cycle.advisory_new_key())
            .bind(&name)
            .bind(&name)
            .execute(&pool)
            .await
            .map_err(|e| err("postgres", "give a name a key", e))?;
        let key: i32 = sqlx::query_scalar(cycle.advisory_key())
            .bind(&name)
            .fetch_one(&pool)
            .await
            .map_err(|e| err("postgres", "read a key", e))?;
        keys.push(i64::from(key));
    }
    let (keys, shared) = (Arc::new(keys), pool.clone());
    let measured = super::tasks_together(tasks, cycles, move |task, _| {
        let (pool, cycle, keys) = (shared.clone(), Arc::clone(&cycle), Arc::clone(&keys));
        async move {
            let key = usize::try_from(task)
                .ok()
                .and_then(|t| keys.get(t).copied())
                .ok_or_else(|| err("postgres", "lock", "a task without its key"))?;
            let mut c = pool
                .acquire()
                .await
                .map_err(|e| err("postgres", "connect", e))?;
            advisory_cycle(&cycle, &mut c, key).await
        }
    })
    .await;
    pool.close().await;
    measured
}

/// The connections of the URL's user the PostgreSQL of `url` counts, less the one asking.
#[cfg(feature = "postgres")]
pub(super) async fn postgres_connections(url: &str) -> Option<i64> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url.split('?').next().unwrap_or(url))
        .await
        .ok()?;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE usename = current_user AND pid <> pg_backend_pid()",
    )
    .fetch_one(&pool)
    .await
    .ok()?;
    pool.close().await;
    Some(n)
}

/// The threads the MySQL of `url` counts as connected, less the one asking.
#[cfg(feature = "mysql")]
pub(super) async fn mysql_connections(url: &str) -> Option<i64> {
    use sqlx::Row;
    sqlx::any::install_default_drivers();
    let base = any_url(url);
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
