//! Making a provider: from a URL or the application's own pool, its pools opened, the
//! server checked, dlock's tables created and claimed for one strategy.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use dlock_core::backend::ProviderMeta;
use dlock_core::{Capabilities, Error, Result};

use super::{Inner, MIN_LEASE, SqlProvider};
use crate::config::{self, Dialect, SqlConfig, Strategy};
use crate::db::{self, Pool, query};
use crate::election::ElectionSql;
use crate::error::{self, from_sqlx};
#[cfg(feature = "_sqlite")]
use crate::mounts;
use crate::schema::{SchemaSql, schema_version};
use crate::sql::Tables;
use crate::strategy;
#[cfg(feature = "postgres")]
use crate::wait::notify;
use crate::wait::{WakeSources, registry};

/// The pools of a provider: the statements' (the application's, for a provider made with
/// [`SqlProvider::from_pool`]), the lock pool of a pinned strategy, and for `for-update` on
/// the application's pool the provider's own connections for the statements `lock_in` makes
/// beside the caller's transaction.
struct Pools {
    pool: Pool,
    lock_pool: Option<Pool>,
    beside: Option<Pool>,
}

/// The connections of the pool a `for-update` provider on the application's pool opens for
/// `lock_in`'s statements beside the caller's transaction (each a short statement).
#[cfg(any(feature = "mysql", feature = "_sqlite", feature = "postgres"))]
const LOCK_IN_STATEMENTS: u32 = 4;

impl SqlProvider {
    /// Connects to the database a `mysql://`, `mariadb://` or `sqlite://` URL names and creates
    /// dlock's tables if they are missing.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad URL, [`Error::Unsupported`] for `for-update` on SQLite,
    /// [`Error::Connection`] if the database cannot be reached (the message never shows the
    /// password), [`Error::Backend`] if the tables cannot be created.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(SqlConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with(config: SqlConfig) -> Result<Self> {
        let backend = backend_name(config.dialect);
        let enabled = match config.dialect {
            Dialect::MySql => cfg!(feature = "mysql"),
            Dialect::Sqlite => cfg!(feature = "_sqlite"),
            Dialect::Postgres => cfg!(feature = "postgres"),
        };
        if !enabled {
            return Err(Error::config(format!(
                "dlock-sql was built without its `{backend}` feature"
            )));
        }
        config::check_table(&config.table)?;
        if config.dialect == Dialect::Sqlite && config.strategy == Strategy::ForUpdate {
            return Err(Error::unsupported("sqlite", "the for-update strategy"));
        }
        if config.dialect == Dialect::Sqlite {
            create_parent_dir(&config)?;
        }
        let what = format!("connect to {}", config.url);
        let (pool, lock_pool) = db::connect(&config)
            .await
            .map_err(|e| from_sqlx(backend, &what, e))?;
        // The statements' pool is the provider's own: `lock_in` needs nothing beside it.
        let pools = Pools {
            pool,
            lock_pool,
            beside: None,
        };
        Self::start(pools, &config, config.store_id()).await
    }

    /// A provider on a pool the application already has (sqlx's `MySqlPool`, `PgPool` or
    /// `SqlitePool`, made into a [`SqlPool`](crate::SqlPool) by `.into()`), with dlock's tables named
    /// `<table>_…` as `config` says. Of `config`, the strategy, the table prefix,
    /// `create_tables`, `prune_after` and `pool` are read, and its dialect must be the pool's; the pool names
    /// the database (the config's URL is typically the one the pool was made from).
    ///
    /// The statements of the polling strategies run on the pool's connections, so a lock
    /// costs no connection of its own. The strategies that pin a connection per held or
    /// waiting lock (`for-update`, `advisory`) take it from a second pool of `config.pool`
    /// connections that dlock opens with the same connect options: your pool's connections
    /// are never left with a transaction open or a session setting changed. With
    /// `for-update`, a third pool of at most 4 connections serves the statements `lock_in`
    /// makes beside your transaction (the lock's row, its token), which never wait for one of
    /// your pool's connections. On MySQL, leases
    /// are computed on the server's clock in the session's time zone: keep sqlx's default,
    /// UTC.
    ///
    /// On SQLite, dlock's statements wait for the write lock as long as the pool's
    /// `busy_timeout` allows (sqlx's default: 5 s), and the database is switched to WAL mode,
    /// as dlock does for the files it opens by URL (a setting the file keeps): in sqlx's
    /// default rollback-journal mode a reader blocks every writer, and renewals of short
    /// leases fail under load. `for-update` is not offered on SQLite.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use dlock_sql::{SqlConfig, SqlProvider, Strategy};
    /// let url = "mysql://app@db.internal/shop";
    /// let pool = sqlx::MySqlPool::connect(url).await?;
    /// let config = SqlConfig::from_url(url)?
    ///     .with_strategy(Strategy::ForUpdate)
    ///     .with_pool_size(8);
    /// let locks = SqlProvider::from_pool(pool, &config).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a bad table prefix or a config of another dialect than the
    /// pool's, [`Error::Unsupported`] for a strategy the database does not offer,
    /// [`Error::Connection`] if the provider's own pools cannot connect, [`Error::Backend`] if the
    /// tables cannot be created or are not dlock's.
    #[cfg(any(feature = "mysql", feature = "_sqlite", feature = "postgres"))]
    pub async fn from_pool(pool: impl Into<crate::SqlPool>, config: &SqlConfig) -> Result<Self> {
        let pool = pool.into().0;
        let dialect = pool.dialect();
        let backend = backend_name(dialect);
        if config.dialect != dialect {
            return Err(Error::config(format!(
                "the config is for {}, the pool is a {backend} pool",
                backend_name(config.dialect)
            )));
        }
        config::check_table(&config.table)?;
        let strategy = config.strategy;
        if dialect == Dialect::Sqlite && strategy == Strategy::ForUpdate {
            return Err(Error::unsupported("sqlite", "the for-update strategy"));
        }
        // Before the lock pool opens: a strategy the database does not offer opens nothing.
        config::check_dialect(dialect, strategy)?;
        let table = config.table.as_str();
        // The database without credentials, the table prefix and the strategy (as a URL's
        // store id).
        let store = format!("{backend}://{}#{table}/{strategy}", db::server_of(&pool));
        #[cfg(feature = "_sqlite")]
        #[allow(irrefutable_let_patterns)] // SQLite alone is the only driver
        if let db::Driver::Sqlite(p) = &pool {
            mounts::warn_if_shared(p.connect_options().get_filename());
        }
        let lock_pool = if strategy.pins_connections() {
            let opened = db::lock_pool_beside(&pool, config.pool.max(1)).await;
            Some(opened.map_err(|e| from_sqlx(backend, "open the lock pool", e))?)
        } else {
            None
        };
        // `lock_in` takes a lock's row and its token beside the caller's transaction, which
        // holds a connection of the caller's pool: on connections of the provider's own, or
        // a pool of one connection would wait for itself.
        let beside = if strategy == Strategy::ForUpdate {
            let opened = db::statements_beside(&pool, LOCK_IN_STATEMENTS).await;
            Some(opened.map_err(|e| from_sqlx(backend, "open the pool beside yours", e))?)
        } else {
            None
        };
        let pools = Pools {
            pool: Pool::theirs(pool),
            lock_pool,
            beside,
        };
        if dialect == Dialect::Sqlite {
            let wal = "PRAGMA journal_mode = WAL";
            setup(&pools.pool, backend, "switch the database to WAL mode", wal).await?;
        }
        Self::start(pools, config, store).await
    }

    /// Checks the server, creates (if `config` says so) and checks the tables `<table>_…`,
    /// and makes the provider of `config`'s strategy around its pools.
    async fn start(
        Pools {
            pool,
            lock_pool,
            beside,
        }: Pools,
        config: &SqlConfig,
        store_id: String,
    ) -> Result<Self> {
        let (dialect, kind, table) = (config.dialect, config.strategy, config.table.as_str());
        let backend = backend_name(dialect);
        config::check_dialect(dialect, kind)?;
        // for-update on PostgreSQL is held as an advisory lock too (see `strategy::build`).
        if dialect == Dialect::Postgres && kind.pins_connections() {
            check_advisory_server(&pool, kind).await?;
        }
        let mariadb = match dialect {
            Dialect::MySql => check_mysql_server(&pool).await?,
            Dialect::Sqlite => {
                check_sqlite_library(&pool).await?;
                false
            }
            Dialect::Postgres => false,
        };
        let origin = registry::origin(&store_id);
        let tables = Tables {
            dialect,
            prefix: table,
            mariadb,
            origin: &origin,
        };
        let schema = SchemaSql::new(tables);
        if config.create_tables {
            for ddl in &schema.ddl {
                setup(&pool, backend, "create dlock's tables", ddl).await?;
            }
        }
        check_tables(&pool, &schema, backend, config.create_tables).await?;
        check_recorded(&pool, &schema, (dialect, kind), table).await?;
        let polls = !kind.pins_connections();
        let wakes = WakeSources::new(&store_id, polls);
        // Releases of the polling strategies are announced on PostgreSQL (the pinned
        // strategies' waiters wait on the server's lock itself).
        #[cfg(feature = "postgres")]
        let wakes = wakes.with_listener(match pool.driver() {
            db::Driver::Postgres(p) if polls => Some(notify::Wakeups::new(
                (*p.connect_options()).clone(),
                notify::channel(table),
                store_id.clone(),
                notify::LISTEN_IDLE,
            )),
            _ => None,
        });
        let mut caps = Capabilities::all(backend);
        caps.fair = false;
        // Readers share an advisory lock on PostgreSQL; the row strategies have one holder
        // per row.
        caps.read_write = kind == Strategy::Advisory;
        caps.semaphore = false;
        caps.connection_bound = kind.pins_connections();
        caps.min_lease = MIN_LEASE;
        if dialect == Dialect::Postgres && kind.pins_connections() {
            // The server-side lease is idle_session_timeout, in milliseconds up to 2^31 - 1,
            // set to the lease rounded up to whole seconds.
            caps.max_lease = crate::pinned::max_lease(dialect);
        }
        let meta = ProviderMeta::new(caps, store_id.as_str());
        let inner = Arc::new(Inner {
            pool,
            lock_pool,
            beside,
            dialect,
            strategy: kind,
            backend,
            client_id: uuid::Uuid::new_v4().to_string(),
            ids: AtomicU64::new(0),
            store_id,
            wakes,
        });
        let strategy = strategy::build(kind, &inner, tables, config.prune_after);
        strategy.prepare().await?;
        Ok(Self {
            inner,
            strategy,
            meta,
            elections: Arc::new(ElectionSql::new(tables)),
        })
    }
}

/// Creates the directory of a SQLite file (the driver creates the file, not its directory).
fn create_parent_dir(config: &SqlConfig) -> Result<()> {
    let path = config.sqlite_path()?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::config_caused(
                format!(
                    "cannot create the directory {} for the SQLite file: {e}",
                    dir.display()
                ),
                e,
            )
        })?;
    }
    Ok(())
}

/// The MySQL or MariaDB server's version and replication checks (see
/// [`check_server_version`], [`check_single_primary`]); says whether it is MariaDB.
async fn check_mysql_server(pool: &Pool) -> Result<bool> {
    let backend = "mysql";
    let row = query("SELECT VERSION()")
        .fetch_one(pool)
        .await
        .map_err(|e| from_sqlx(backend, "read the server version", e))?;
    let version = row
        .text(0)
        .map_err(|e| from_sqlx(backend, "read the server version", e))?;
    let mariadb = check_server_version(&version)?;
    let mut settings = Vec::new();
    for show in [
        "SHOW VARIABLES LIKE 'wsrep\\_on'",
        "SHOW VARIABLES LIKE 'group\\_replication\\_group\\_name'",
        "SHOW VARIABLES LIKE 'group\\_replication\\_single\\_primary\\_mode'",
    ] {
        let what = "read the server's replication settings";
        let row = query(show)
            .fetch_optional(pool)
            .await
            .map_err(|e| from_sqlx(backend, what, e))?;
        if let Some(row) = row {
            let pair = row.text(0).and_then(|name| Ok((name, row.text(1)?)));
            settings.push(pair.map_err(|e| from_sqlx(backend, what, e))?);
        }
    }
    check_single_primary(&settings)?;
    Ok(mariadb)
}

/// Refuses a SQLite library older than the statements need (`RETURNING`: 3.35), which only a
/// system library (`sqlite-unbundled`) can be.
async fn check_sqlite_library(pool: &Pool) -> Result<()> {
    let what = "read the SQLite library's version";
    let row = query("SELECT sqlite_version()")
        .fetch_one(pool)
        .await
        .map_err(|e| from_sqlx("sqlite", what, e))?;
    let version = row.text(0).map_err(|e| from_sqlx("sqlite", what, e))?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < (3, 35) {
        return Err(Error::unsupported(
            "sqlite",
            format!(
                "SQLite {version}: dlock's statements need 3.35 or newer (RETURNING); link a \
                 newer libsqlite3, or build with the `sqlite` feature, which compiles one in"
            ),
        ));
    }
    Ok(())
}

/// Refuses a server on which fencing tokens could go backwards; says whether it is MariaDB.
///
/// The tokens come from `AUTO_INCREMENT` counters and counter rows: a server that resets
/// `AUTO_INCREMENT` on restart (MySQL before 8.0, MariaDB before 10.2.4) could hand out a
/// token twice, and `for-update` needs `NOWAIT` (MySQL 8.0, MariaDB 10.3).
fn check_server_version(version: &str) -> Result<bool> {
    if version.contains("TiDB") {
        return Err(Error::unsupported(
            "mysql",
            format!(
                "server version {version:?}: TiDB hands out AUTO_INCREMENT values from a cache \
                 per node, so fencing tokens would not grow with each grant"
            ),
        ));
    }
    let mariadb = version.contains("MariaDB");
    // MariaDB may prefix its version with "5.5.5-" for old replication clients.
    let numbers = if mariadb {
        version.strip_prefix("5.5.5-").unwrap_or(version)
    } else {
        version
    };
    let mut parts = numbers
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    let (floor, name) = if mariadb {
        ((10, 3), "MariaDB 10.3")
    } else {
        ((8, 0), "MySQL 8.0")
    };
    if (major, minor) < floor {
        return Err(Error::unsupported(
            "mysql",
            format!(
                "server version {version:?}: dlock needs {name} or later (older servers reset \
                 AUTO_INCREMENT on restart, so fencing tokens could repeat)"
            ),
        ));
    }
    Ok(mariadb)
}

/// Refuses a server of a multi-primary cluster, given its `(variable, value)` settings: row
/// locks there are each node's own (Galera certifies writes at commit and never sees a
/// `FOR UPDATE`; Group Replication in multi-primary mode likewise), so two nodes grant one
/// lock, and `AUTO_INCREMENT` steps per node, so tokens are not ordered across nodes.
fn check_single_primary(settings: &[(String, String)]) -> Result<()> {
    let value = |name: &str| {
        settings
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let on = |v: Option<&str>| v.is_some_and(|v| v.eq_ignore_ascii_case("ON") || v == "1");
    let cluster = if on(value("wsrep_on")) {
        "a Galera cluster node (wsrep_on is ON)"
    } else if value("group_replication_group_name").is_some_and(|g| !g.is_empty())
        && value("group_replication_single_primary_mode")
            .is_some_and(|v| v.eq_ignore_ascii_case("OFF") || v == "0")
    {
        "a Group Replication member in multi-primary mode"
    } else {
        return Ok(());
    };
    Err(Error::unsupported(
        "mysql",
        format!(
            "{cluster}: its nodes lock rows each on their own, so two nodes could grant one \
             lock, and tokens are not ordered across them; use a single-primary server"
        ),
    ))
}

/// The advisory strategy's server-side lease is `idle_session_timeout`, which PostgreSQL 14
/// brought: an older server is refused (a paused holder would keep its lock for ever).
async fn check_advisory_server(pool: &Pool, kind: Strategy) -> Result<()> {
    let err = |e| from_sqlx("postgres", "read the server version", e);
    let version = query("SELECT current_setting('server_version_num')::BIGINT")
        .fetch_one(pool)
        .await
        .and_then(|row| row.int(0))
        .map_err(err)?;
    if version < 140_000 {
        return Err(Error::unsupported(
            "postgres",
            format!(
                "the {kind} strategy on server version {version}: it holds advisory locks, \
                 which need PostgreSQL 14 or later (idle_session_timeout is the lease); use \
                 unique-insert"
            ),
        ));
    }
    Ok(())
}

/// The backend name errors and handles carry.
fn backend_name(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::MySql => "mysql",
        Dialect::Sqlite => "sqlite",
        Dialect::Postgres => "postgres",
    }
}

/// Refuses tables a statement of dlock would fail on: a table missing (never created, with
/// `create_tables=false`) or one of the same name made by someone else without the columns
/// dlock uses; and tables that would not keep two rows of one name apart (made by hand
/// without a unique index of `name`).
async fn check_tables(
    pool: &Pool,
    sql: &SchemaSql,
    backend: &'static str,
    created: bool,
) -> Result<()> {
    for (table, probe) in &sql.probes {
        let Err(e) = query(probe).fetch_optional(pool).await else {
            continue;
        };
        let e = from_sqlx(backend, "check dlock's tables", e);
        if e.is_retryable() {
            return Err(e);
        }
        let fix = if created {
            "a table of that name that is not dlock's? Use another ?table= prefix"
        } else {
            "create the tables as SqlConfig::table_ddl gives them, or connect once with \
             create_tables=true"
        };
        return Err(Error::config_caused(
            format!("the table {table} is missing or lacks the columns dlock uses ({e}): {fix}"),
            e,
        ));
    }
    for (table, count) in &sql.unique_names {
        let unique = query(count)
            .bind(table.as_str())
            .fetch_one(pool)
            .await
            .and_then(|row| row.int(0))
            .map_err(|e| from_sqlx(backend, "check dlock's tables", e))?;
        if unique == 0 {
            return Err(Error::config(format!(
                "the table {table} has no unique index of its column name alone (checked at \
                 each statement: not deferrable, not partial, not of a prefix), so two rows \
                 of one lock name (two holders) could both be written: create the tables as \
                 SqlConfig::table_ddl gives them, or add one \
                 (CREATE UNIQUE INDEX … ON {table} (name))"
            )));
        }
    }
    Ok(())
}

/// Records the strategy and the schema version of the tables `<table>_…` if none is
/// recorded, and refuses tables that serve another strategy (two strategies on one set of
/// tables keep their holds in different tables, so they would not exclude each other) or
/// have another layout.
async fn check_recorded(
    pool: &Pool,
    sql: &SchemaSql,
    (dialect, strategy): (Dialect, Strategy),
    table: &str,
) -> Result<()> {
    let backend = backend_name(dialect);
    let wanted = strategy.to_string();
    let recorded = record(pool, sql, backend, "strategy", &wanted, table).await?;
    if recorded != wanted {
        return Err(Error::config(format!(
            "the tables {table}_… serve the {recorded} strategy, and this provider asks for \
             {wanted}: two strategies on one set of tables do not exclude each other. Use \
             ?strategy={recorded} like the others, or another ?table= prefix"
        )));
    }
    let wanted = schema_version(dialect, strategy);
    let version = record(pool, sql, backend, "schema", wanted, table).await?;
    if version == wanted {
        return Ok(());
    }
    if dialect == Dialect::Postgres && strategy == Strategy::ForUpdate && version == "1" {
        return Err(Error::config(format!(
            "the tables {table}_… were written by a dlock that held for-update locks on \
             PostgreSQL as row locks (schema version 1); this one holds them as advisory locks \
             (version {wanted}), and the two do not exclude each other. Stop every older dlock \
             that uses these tables, then run `UPDATE {table}_meta SET value = '{wanted}' \
             WHERE name = 'schema'` once (tokens go on from where they were), or use another \
             ?table= prefix"
        )));
    }
    Err(Error::config(format!(
        "the tables {table}_… have schema version {version}, and this dlock reads and writes \
         version {wanted}: use a dlock of their version, or another ?table= prefix"
    )))
}

/// Records `value` for the setting `key` of the tables `<table>_…` unless one is recorded,
/// and returns the recorded one; again while the database is busy (for
/// `db::SETUP_PATIENCE`).
async fn record(
    pool: &Pool,
    sql: &SchemaSql,
    backend: &'static str,
    key: &str,
    value: &str,
    table: &str,
) -> Result<String> {
    let give_up = dlock_core::backend::from_now(db::SETUP_PATIENCE);
    let mut pause = db::setup_pauses();
    loop {
        let claimed = query(&sql.claim).bind(key).bind(value).execute(pool).await;
        let recorded = match claimed {
            Ok(_) => query(&sql.read).bind(key).fetch_optional(pool).await,
            Err(e) => Err(e),
        };
        match recorded {
            Ok(Some(row)) => {
                return row
                    .text(0)
                    .map_err(|e| from_sqlx(backend, "read the tables' settings", e));
            }
            Ok(None) => {
                return Err(Error::backend_failed(
                    backend,
                    format!("{table}_meta has no {key} after recording one"),
                    true,
                ));
            }
            Err(e) => {
                let e = from_sqlx(backend, "record the tables' settings", e);
                if !e.is_retryable() || tokio::time::Instant::now() >= give_up {
                    return Err(e);
                }
                tokio::time::sleep(pause.next_pause()).await;
            }
        }
    }
}

/// Runs one statement that sets up dlock's tables, again while the database answers that it
/// is busy (for `db::SETUP_PATIENCE`) or that the table appeared meanwhile (twice):
/// - several applications opening one new SQLite file at once race to switch it to WAL and
///   create the tables; in rollback-journal mode SQLite answers a lock upgrade that would
///   deadlock with `SQLITE_BUSY` at once, without waiting for its busy timeout;
/// - two providers creating one PostgreSQL table at once: one of them fails on the catalog's
///   unique index although the statement says IF NOT EXISTS. The next try sees the table.
async fn setup(pool: &Pool, backend: &'static str, what: &str, sql: &str) -> Result<()> {
    let give_up = dlock_core::backend::from_now(db::SETUP_PATIENCE);
    let mut pause = db::setup_pauses();
    let mut duplicates = 0;
    loop {
        let e = match pool.raw(sql).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        // Another application creating the same tables at this moment: the next try finds them.
        let duplicate = error::created_meanwhile(&e);
        let e = from_sqlx(backend, what, e);
        let again = if duplicate {
            duplicates += 1;
            duplicates < 3
        } else {
            e.is_retryable() && tokio::time::Instant::now() < give_up
        };
        if !again {
            return Err(e);
        }
        tracing::debug!(error = %e, "setting up dlock's tables: trying again");
        tokio::time::sleep(pause.next_pause()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{check_server_version, check_single_primary};

    #[test]
    fn multi_primary_clusters_are_refused() {
        let settings = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect()
        };
        for safe in [
            settings(&[]),
            settings(&[("wsrep_on", "OFF")]),
            settings(&[
                (
                    "group_replication_group_name",
                    "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                ),
                ("group_replication_single_primary_mode", "ON"),
            ]),
            settings(&[
                ("group_replication_group_name", ""),
                ("group_replication_single_primary_mode", "OFF"),
            ]),
        ] {
            assert!(check_single_primary(&safe).is_ok(), "{safe:?}");
        }
        for unsafe_ in [
            settings(&[("wsrep_on", "ON")]),
            settings(&[
                (
                    "group_replication_group_name",
                    "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                ),
                ("group_replication_single_primary_mode", "OFF"),
            ]),
        ] {
            let e = check_single_primary(&unsafe_).unwrap_err();
            assert!(
                matches!(e, dlock_core::Error::Unsupported { .. }),
                "{unsafe_:?}: {e}"
            );
        }
    }

    #[test]
    fn servers_that_could_repeat_tokens_are_refused() {
        assert!(check_server_version("10.11.19-MariaDB-0+deb12u1").unwrap());
        assert!(!check_server_version("8.0.36").unwrap());
        assert!(!check_server_version("8.4.0-commercial").unwrap());
        assert!(check_server_version("5.5.5-10.3.39-MariaDB").unwrap());
        for old in [
            "8.0.11-TiDB-v7.5.0",
            "5.7.44-log",
            "10.2.44-MariaDB",
            "5.5.5-10.1.48-MariaDB",
            "garbage",
        ] {
            let e = check_server_version(old).unwrap_err();
            assert!(
                matches!(e, dlock_core::Error::Unsupported { .. }),
                "{old}: {e}"
            );
        }
    }
}
