//! Opening the pools of a provider made from a URL, and the session settings of each.

use std::time::Duration;

#[cfg(any(feature = "mysql", feature = "postgres"))]
use sqlx::Executor;

use super::pool::{Driver, Pool};
use crate::config::{Dialect, SqlConfig};

/// Opens the provider's pools for `config`: the statements' pool and, for `for-update`, the
/// pool of connections that hold row locks (autocommit off).
pub(crate) async fn connect(config: &SqlConfig) -> Result<(Pool, Option<Pool>), sqlx::Error> {
    match config.dialect {
        #[cfg(feature = "mysql")]
        Dialect::MySql => {
            let options = mysql_options(config)?;
            let pool =
                mysql_pool(statements_size(config), options.clone(), MYSQL_STATEMENTS).await?;
            let lock_pool = if config.strategy.pins_connections() {
                Some(mysql_pool(config.pool, options, MYSQL_LOCKS).await?)
            } else {
                None
            };
            Ok((pool, lock_pool))
        }
        #[cfg(feature = "_sqlite")]
        Dialect::Sqlite => {
            let options = sqlite_options(config)?;
            crate::mounts::warn_if_shared(options.get_filename());
            // Several processes opening one new file at once race to switch it to WAL (the
            // first connection does): SQLite answers the loser BUSY at once, without its busy
            // timeout. Opening again finds the file in WAL mode.
            let give_up = dlock_core::backend::from_now(SETUP_PATIENCE);
            let mut pause = setup_pauses();
            loop {
                let opened = pool_options::<sqlx::Sqlite>(config.pool)
                    .connect_with(options.clone())
                    .await;
                match opened {
                    Ok(pool) => return Ok((Pool::ours(Driver::Sqlite(pool)), None)),
                    Err(sqlx::Error::Database(db))
                        if crate::error::sqlite_busy(db.as_ref())
                            && tokio::time::Instant::now() < give_up =>
                    {
                        tracing::debug!(error = %db, "opening the SQLite file: trying again");
                        tokio::time::sleep(pause.next_pause()).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        #[cfg(feature = "postgres")]
        Dialect::Postgres => {
            use sqlx::ConnectOptions;
            let options = sqlx::postgres::PgConnectOptions::from_url(config.url.expose())?;
            let pool = pg_pool(statements_size(config), options.clone(), "2s").await?;
            let lock_pool = if config.strategy.pins_connections() {
                Some(pg_pool(config.pool, options, "5s").await?)
            } else {
                None
            };
            Ok((pool, lock_pool))
        }
        #[allow(unreachable_patterns)]
        _ => Err(sqlx::Error::Configuration(
            format!(
                "dlock-sql was built without the driver for {:?}",
                config.dialect
            )
            .into(),
        )),
    }
}

/// How long opening a database and setting up dlock's tables may retry a busy database.
pub(crate) const SETUP_PATIENCE: Duration = Duration::from_secs(10);

/// The pauses between two tries of a setup step on a busy database.
pub(crate) fn setup_pauses() -> dlock_core::backend::Backoff {
    dlock_core::backend::Backoff::new(Duration::from_millis(5), Duration::from_millis(200))
}

/// How long a statement waits for a pooled connection before the pool reports itself busy.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// The most connections the statements' pool opens beside a lock pool: the pinned
/// strategies' statements (a fence, a key, a kill, `describe`) are short, and `?pool=N` sizes
/// the lock pool to the locks held at once, which would otherwise double the connections a
/// provider asks of the server.
#[cfg(any(feature = "mysql", feature = "postgres"))]
const STATEMENTS_BESIDE_LOCKS: u32 = 16;

/// The size of the statements' pool for `config`: `?pool=N`, at most
/// [`STATEMENTS_BESIDE_LOCKS`] where a lock pool of N connections stands beside it.
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn statements_size(config: &SqlConfig) -> u32 {
    if config.strategy.pins_connections() {
        config.pool.min(STATEMENTS_BESIDE_LOCKS)
    } else {
        config.pool
    }
}

/// The options every pool of `size` connections shares, whatever its driver: no ping before a
/// checkout (a dead connection shows as a statement error, which is retried), and
/// [`POOL_WAIT`] for a connection.
#[cfg(any(feature = "mysql", feature = "_sqlite", feature = "postgres"))]
fn pool_options<DB: sqlx::Database>(size: u32) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(size)
        .test_before_acquire(false)
        .acquire_timeout(POOL_WAIT)
}

/// The driver's options for a `mysql://` (or `mariadb://`) URL: the URL's own, with the
/// session time zone pinned to UTC (the lease arithmetic reads the server's clock through
/// `UNIX_TIMESTAMP`, which a local zone would shift around a daylight-saving change).
#[cfg(feature = "mysql")]
fn mysql_options(config: &SqlConfig) -> Result<sqlx::mysql::MySqlConnectOptions, sqlx::Error> {
    use sqlx::ConnectOptions;
    Ok(
        sqlx::mysql::MySqlConnectOptions::from_url(config.url.expose())?
            .timezone(Some("+00:00".to_owned())),
    )
}

/// The statements' pool: short statements only; one that waits on a row lock longer than
/// 1 s is answered as busy and retried by the caller, so that a try with no wait answers
/// within the 2 s the core lets a call run past its wait (racers creating a new name's row
/// wait on the winner's row lock).
///
/// On MariaDB (the `/*M! … */` part, a comment to MySQL) no `max_statement_time` of the user
/// or the server ends a statement: dlock bounds its waits itself, and one ended by the
/// server would be a hard failure where the caller asked to wait.
#[cfg(feature = "mysql")]
const MYSQL_STATEMENTS: &[&str] =
    &["SET SESSION innodb_lock_wait_timeout = 1 /*M!, max_statement_time = 0 */"];

/// The for-update pool: connections with autocommit off, one per held or waiting lock. Every
/// `SELECT … FOR UPDATE` opens a transaction that the release ends (ROLLBACK); a blocked one
/// gives up after 5 s and is tried again.
///
/// READ COMMITTED, so that a transaction locks its row and nothing else: under the default
/// REPEATABLE READ, a try on a name without a row yet locked the gap where the row goes, and
/// an acquirer that stopped right after that try (paused, cut off) kept every new name
/// sorting next to it from being created until the server dropped it (hours).
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_LOCKS: &[&str] = &[
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET autocommit = 0",
    // As in the statements' pool, no MariaDB max_statement_time ends a wait.
    "SET SESSION innodb_lock_wait_timeout = 5 /*M!, max_statement_time = 0 */",
];

/// A MySQL pool whose connections run `session` when they open. No ping before a checkout: a
/// dead connection shows as a statement error, which is retried (and for a hold, reported as
/// a loss). sqlx 0.8 still pings every connection on its way back to the pool,
/// off the statement's path; an attempt runs all its statements on one checkout, so that is
/// one ping per attempt.
#[cfg(feature = "mysql")]
async fn mysql_pool(
    size: u32,
    options: sqlx::mysql::MySqlConnectOptions,
    session: &'static [&'static str],
) -> Result<Pool, sqlx::Error> {
    let pool = pool_options::<sqlx::MySql>(size)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                for statement in session {
                    conn.execute(*statement).await?;
                }
                Ok(())
            })
        })
        .connect_with(options)
        .await?;
    Ok(Pool::ours(Driver::MySql(pool)))
}

/// Where an application's pool connects, without credentials: `host:port/database` of a
/// server, the file of SQLite (as a URL's store id names them).
#[cfg(any(feature = "mysql", feature = "_sqlite", feature = "postgres"))]
pub(crate) fn server_of(driver: &Driver) -> String {
    // The server drivers' connect options have getters of the same names, and no trait.
    #[cfg(any(feature = "mysql", feature = "postgres"))]
    macro_rules! endpoint {
        ($options:expr) => {{
            let o = $options;
            let database = o.get_database().unwrap_or_default();
            format!("{}:{}/{database}", o.get_host(), o.get_port())
        }};
    }
    match driver {
        #[cfg(feature = "mysql")]
        Driver::MySql(p) => endpoint!(p.connect_options()),
        #[cfg(feature = "postgres")]
        Driver::Postgres(p) => endpoint!(p.connect_options()),
        #[cfg(feature = "_sqlite")]
        Driver::Sqlite(p) => p.connect_options().get_filename().display().to_string(),
    }
}

/// A lock pool of `size` connections opened with the connect options of an application's
/// MySQL or PostgreSQL pool, set up as dlock's own lock pools are.
#[cfg(any(feature = "mysql", feature = "_sqlite", feature = "postgres"))]
pub(crate) async fn lock_pool_beside(driver: &Driver, size: u32) -> Result<Pool, sqlx::Error> {
    match driver {
        #[cfg(feature = "mysql")]
        Driver::MySql(p) => mysql_pool(size, (*p.connect_options()).clone(), MYSQL_LOCKS).await,
        #[cfg(feature = "postgres")]
        Driver::Postgres(p) => pg_pool(size, (*p.connect_options()).clone(), "5s").await,
        #[cfg(feature = "_sqlite")]
        Driver::Sqlite(_) => {
            let _ = size;
            Err(sqlx::Error::Configuration("SQLite has no lock pool".into()))
        }
    }
}

/// A pool of `size` connections for statements, opened with the connect options of an
/// application's MySQL or PostgreSQL pool, set up as dlock's own statements' pools are.
#[cfg(any(feature = "mysql", feature = "_sqlite", feature = "postgres"))]
pub(crate) async fn statements_beside(driver: &Driver, size: u32) -> Result<Pool, sqlx::Error> {
    match driver {
        #[cfg(feature = "mysql")]
        Driver::MySql(p) => {
            mysql_pool(size, (*p.connect_options()).clone(), MYSQL_STATEMENTS).await
        }
        #[cfg(feature = "postgres")]
        Driver::Postgres(p) => pg_pool(size, (*p.connect_options()).clone(), "2s").await,
        #[cfg(feature = "_sqlite")]
        Driver::Sqlite(_) => {
            let _ = size;
            Err(sqlx::Error::Configuration(
                "SQLite has no pool beside the application's".into(),
            ))
        }
    }
}

/// A PostgreSQL pool whose statements give up on a row lock after `lock_timeout` (they are
/// retried; the for-update pool sets its own bound per wait).
#[cfg(feature = "postgres")]
async fn pg_pool(
    size: u32,
    options: sqlx::postgres::PgConnectOptions,
    lock_timeout: &'static str,
) -> Result<Pool, sqlx::Error> {
    let pool = pool_options::<sqlx::Postgres>(size)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                conn.execute(format!("SET lock_timeout = '{lock_timeout}'").as_str())
                    .await?;
                // A database or role that defaults to repeatable read would answer a waiter
                // granted behind another with a serialization error.
                conn.execute(
                    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
                )
                .await?;
                // A statement_timeout (or PostgreSQL 17's transaction_timeout) of the role,
                // the database or the URL would end a wait for a lock as a hard failure.
                // dlock bounds its waits itself (lock_timeout, the caller's deadline). In the
                // same round trip, the session's own idle_session_timeout (the role's, the
                // database's or the URL's) is recorded: a pinned hold's lease replaces it
                // while it holds, and its release puts it back (`IDLE_SESSION_DEFAULT`).
                conn.execute(
                    "SELECT set_config('statement_timeout', '0', false), \
                     (SELECT set_config('transaction_timeout', '0', false) \
                     WHERE current_setting('server_version_num')::INT >= 170000), \
                     set_config('dlock.idle_session_timeout', \
                     COALESCE(current_setting('idle_session_timeout', true), '0'), false)",
                )
                .await?;
                Ok(())
            })
        })
        .connect_with(options)
        .await?;
    Ok(Pool::ours(Driver::Postgres(pool)))
}

/// The driver's options for a `sqlite://` URL: the file by its path (never re-parsed as a
/// URL, so any directory name works), WAL, the busy timeout, and the driver parameters the
/// URL names.
#[cfg(feature = "_sqlite")]
fn sqlite_options(config: &SqlConfig) -> Result<sqlx::sqlite::SqliteConnectOptions, sqlx::Error> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    let bad = |key: &str, value: &str, expected: &str| {
        sqlx::Error::Configuration(format!("{key}={value:?}: expected {expected}").into())
    };
    let path = config
        .sqlite_path()
        .map_err(|e| sqlx::Error::Configuration(e.to_string().into()))?;
    // A relative path names a file in the working directory at connect: every connection of
    // the provider opens that one file, even after the process changes directory.
    let path = std::path::absolute(&path)
        .map_err(|e| sqlx::Error::Configuration(format!("{}: {e}", path.display()).into()))?;
    let mut options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(config.busy_timeout)
        .synchronous(if config.durable {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        });
    for (key, value) in config.url.expose().query_pairs() {
        options = match (&*key, &*value) {
            ("mode", "rwc") => options.create_if_missing(true),
            ("mode", "rw") => options.create_if_missing(false),
            ("mode", "ro") => options.create_if_missing(false).read_only(true),
            ("mode", v) => return Err(bad("mode", v, "rwc, rw or ro")),
            // A shared cache locks tables between the process's connections, answering
            // SQLITE_LOCKED at once instead of waiting its busy timeout; an immutable file and
            // the VFSs without file locks let processes share the file without excluding
            // each other (and keep WAL off).
            ("cache", "private") => options.shared_cache(false),
            ("cache", v) => return Err(bad("cache", v, "private (a shared cache is refused)")),
            ("immutable", "false" | "0") => options.immutable(false),
            ("immutable", v) => {
                return Err(bad(
                    "immutable",
                    v,
                    "false (an immutable file is never locked)",
                ));
            }
            ("vfs", v) if v.ends_with("-none") || v == "memdb" => {
                return Err(bad("vfs", v, "a VFS with file locks"));
            }
            ("vfs", v) => options.vfs(v.to_owned()),
            (k, v) => return Err(bad(k, v, "no such SQLite parameter")),
        };
    }
    Ok(options)
}

#[cfg(all(test, feature = "_sqlite"))]
mod tests {
    use super::*;

    /// A relative SQLite path is made absolute once, at connect: a pool connection opened
    /// after the process changed directory opens the same file.
    #[test]
    fn a_relative_sqlite_path_is_fixed_at_connect() {
        let config = SqlConfig::from_url("sqlite://relative/locks.db").expect("a valid URL");
        let options = sqlite_options(&config).expect("valid options");
        let file = options.get_filename();
        assert!(file.is_absolute(), "{}", file.display());
        assert!(file.ends_with("relative/locks.db"), "{}", file.display());
    }
}
