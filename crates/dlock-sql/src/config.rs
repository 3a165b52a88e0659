//! `mysql://` and `sqlite://` URLs: the dialect, the strategy and the table prefix.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::{Error, RedactedUrl, Result};

/// How long the row of a name nobody holds stays by default ([`SqlConfig::prune_after`]):
/// long enough that a name in use keeps its row (and its cached version) between holds.
const PRUNE_AFTER: Duration = Duration::from_secs(3600);

/// The database family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// MySQL 8 or MariaDB 10.3+ (older servers are refused at connect).
    MySql,
    /// SQLite 3.35+ (embedded, file-based; older libraries are refused at connect).
    Sqlite,
    /// PostgreSQL 12+.
    Postgres,
}

/// How locks are kept in the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// One row per held lock; the INSERT that wins holds it; an expired row is taken over by a
    /// conditional UPDATE. The default.
    #[default]
    UniqueInsert,
    /// One row per name that stays; acquire is `UPDATE … WHERE version = ?`; the version is the
    /// fencing token.
    Optimistic,
    /// A lock the caller's own transactions can take too (`lock_in`, `lock_in_pg`). On
    /// MySQL/MariaDB a dedicated connection holds `SELECT … FOR UPDATE` on the name's row in
    /// an open transaction; on PostgreSQL (14+) a dedicated session holds the name's advisory
    /// lock, as [`Advisory`](Self::Advisory) does, outside any transaction (a row lock there
    /// would keep a transaction id open, which holds back `VACUUM` in the whole database).
    ForUpdate,
    /// A dedicated session holds a PostgreSQL advisory lock (`pg_advisory_lock`) on the
    /// name's key, a number the name is given once in a table (never a hash); the session's
    /// `idle_session_timeout` is the lease (PostgreSQL 14+).
    Advisory,
    /// A dedicated session holds the server's named lock (`GET_LOCK`) for the name; no table
    /// holds the lock itself, only its fencing token; the session's `wait_timeout` is the
    /// lease (MySQL 8, MariaDB).
    GetLock,
}

impl Strategy {
    /// Every strategy, for reading one by its name: a strategy missing here cannot be named
    /// in a URL.
    const ALL: [Self; 5] = [
        Self::UniqueInsert,
        Self::Optimistic,
        Self::ForUpdate,
        Self::Advisory,
        Self::GetLock,
    ];

    /// The name used in URLs (`?strategy=`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::UniqueInsert => "unique-insert",
            Self::Optimistic => "optimistic",
            Self::ForUpdate => "for-update",
            Self::Advisory => "advisory",
            Self::GetLock => "get-lock",
        }
    }

    /// Whether each held or waiting lock pins a connection of its own (whose session holds
    /// the lock, and whose end ends it).
    pub(crate) const fn pins_connections(self) -> bool {
        matches!(self, Self::ForUpdate | Self::Advisory | Self::GetLock)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = Error;

    /// The strategy whose [`as_str`](Strategy::as_str) is `s`.
    fn from_str(s: &str) -> Result<Self> {
        let named = Self::ALL.into_iter().find(|k| k.as_str() == s);
        named.ok_or_else(|| {
            Error::config(format!(
                "unknown strategy {s:?}: expected unique-insert, optimistic, for-update, \
                 advisory (PostgreSQL) or get-lock (MySQL/MariaDB)"
            ))
        })
    }
}

/// How to reach the database and which strategy to use. `Debug` never shows the password.
///
/// URLs:
/// - `mysql://user:password@host[:port]/database[?strategy=…&table=…&pool=N]` (also
///   `mariadb://`);
/// - `sqlite://path/to/file.db[?strategy=…&table=…]` (relative path) or
///   `sqlite:///absolute/path.db`; the file is created if missing. A relative path is taken
///   from the working directory at connect, so processes started in different directories
///   use different files and do not exclude each other: give processes that share locks an
///   absolute path.
///
/// | query parameter | meaning | default |
/// | --- | --- | --- |
/// | `strategy` | `unique-insert`, `optimistic`, `for-update`, `advisory` (PostgreSQL) or `get-lock` (MySQL/MariaDB) | `unique-insert` |
/// | `table` | prefix of the tables dlock creates (`[A-Za-z0-9_]`, at most 40) | `dlock` |
/// | `pool` | maximum connections of the provider's pool; for `for-update`, `advisory` and `get-lock`, of its lock pool (a connection per held or waiting lock), beside a statements' pool of at most 16 | `16` (MySQL), `8` (SQLite) |
/// | `create_tables` | `false`: never create dlock's tables, only check them (a role without `CREATE`; see [`SqlConfig::table_ddl`]) | `true` |
/// | `prune_after_ms` | unique-insert and optimistic: delete the row of a name nobody has held for this long (a holder that died, a name used once); `0`: never (see [`SqlConfig::prune_after`]) | `3600000` (an hour) |
/// | `synchronous` | SQLite only: `full` (a commit survives an OS crash, so a fencing token never repeats) or `normal` (faster; a crash may lose the last commits, and with them tokens) | `full` |
///
/// The driver's parameters are passed on: for MySQL `ssl-mode`, `ssl-ca`, `ssl-cert`,
/// `ssl-key`, `charset`, `collation`, `statement-cache-capacity`, `socket`,
/// `pipes-as-concat`, `enable-cleartext-plugin`; for SQLite `mode` (`rwc`, `rw`, `ro`),
/// `cache` (`private` only), `immutable` (`false` only), `vfs` (not one whose name ends in
/// `-none`, nor `memdb`: without file locks processes would not exclude each other). Any
/// other parameter is refused, so that a typo never silently means the default. The MySQL session time zone is always UTC (no `timezone`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SqlConfig {
    /// The database URL, less dlock's own parameters.
    pub url: RedactedUrl,
    /// MySQL/MariaDB or SQLite.
    pub dialect: Dialect,
    /// The locking strategy.
    pub strategy: Strategy,
    /// Prefix of dlock's tables.
    pub table: String,
    /// Maximum pool connections.
    pub pool: u32,
    /// How long SQLite waits for its write lock before `SQLITE_BUSY`.
    pub busy_timeout: Duration,
    /// SQLite: commits are synced to disk before they count (`synchronous=FULL`), so that no
    /// fencing token can repeat after an OS crash. `?synchronous=normal` turns it off.
    pub durable: bool,
    /// Whether the provider creates dlock's tables where missing (`?create_tables=false`
    /// turns it off, for a role that may not create tables: they must then exist, as
    /// [`table_ddl`](Self::table_ddl) makes them). Either way the tables are checked at
    /// connect, and one of the wrong shape or schema version is refused.
    pub create_tables: bool,
    /// unique-insert and optimistic: how long a name's row stays after its last hold ended
    /// (released, or expired with a holder that died) before the provider deletes it, so
    /// that tables do not keep a row for every name ever used; `None` keeps them
    /// (`?prune_after_ms=0`). Every provider looks for such rows every quarter of this (at
    /// most every 10 minutes), a few hundred rows per statement. A row is deleted only while
    /// its lease has been over for this long, checked in the `DELETE` itself, so a held
    /// name's row is never touched; a name used again after its row went gets a new row
    /// whose tokens lie above the old ones (they come from counters that are never reused).
    /// The other strategies keep a row per name: it counts its tokens.
    pub prune_after: Option<Duration>,
}

/// A pool the application already has, for [`SqlProvider::from_pool`](crate::SqlProvider::from_pool):
/// made by `.into()` from sqlx's `MySqlPool`, `PgPool` or `SqlitePool` (of the drivers this
/// crate was built with).
#[derive(Clone, Debug)]
pub struct SqlPool(pub(crate) crate::db::Driver);

impl SqlPool {
    /// The pool's database family.
    pub fn dialect(&self) -> Dialect {
        self.0.dialect()
    }
}

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
impl From<sqlx::MySqlPool> for SqlPool {
    fn from(pool: sqlx::MySqlPool) -> Self {
        Self(crate::db::Driver::MySql(pool))
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl From<sqlx::PgPool> for SqlPool {
    fn from(pool: sqlx::PgPool) -> Self {
        Self(crate::db::Driver::Postgres(pool))
    }
}

#[cfg(feature = "_sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "_sqlite")))]
impl From<sqlx::SqlitePool> for SqlPool {
    fn from(pool: sqlx::SqlitePool) -> Self {
        Self(crate::db::Driver::Sqlite(pool))
    }
}

/// The URL parameters the sqlx driver of `dialect` understands (passed on to it).
fn driver_parameters(dialect: Dialect) -> &'static [&'static str] {
    match dialect {
        Dialect::MySql => &[
            "ssl-mode",
            "ssl-ca",
            "ssl-cert",
            "ssl-key",
            "charset",
            "collation",
            "statement-cache-capacity",
            "socket",
            "pipes-as-concat",
            "enable-cleartext-plugin",
        ],
        Dialect::Sqlite => &["mode", "cache", "immutable", "vfs"],
        Dialect::Postgres => &[
            "sslmode",
            "sslrootcert",
            "sslcert",
            "sslkey",
            "application_name",
            "statement-cache-capacity",
            "options",
        ],
    }
}

fn driver_parameter(dialect: Dialect, key: &str) -> bool {
    driver_parameters(dialect).contains(&key)
}

#[cfg(feature = "serde")]
dlock_core::backend::deserialize_from_url!(SqlConfig);

impl SqlConfig {
    /// Parses a `mysql://`, `mariadb://`, `postgres://` (`postgresql://`) or `sqlite://` URL.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for another scheme, a bad parameter, or a table prefix that is not a
    /// plain identifier. Messages never contain the password.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = RedactedUrl::parse(url)?;
        let dialect = match parsed.scheme() {
            "mysql" | "mariadb" => Dialect::MySql,
            "sqlite" => Dialect::Sqlite,
            "postgres" | "postgresql" => Dialect::Postgres,
            other => {
                return Err(Error::config(format!(
                    "the sql backend takes mysql://, mariadb://, postgres:// or sqlite:// URLs, \
                     not {other}://"
                )));
            }
        };
        let mut strategy = Strategy::default();
        let mut table = "dlock".to_owned();
        let mut pool = match dialect {
            Dialect::MySql | Dialect::Postgres => 16,
            Dialect::Sqlite => 8,
        };
        let mut passed = Vec::new();
        let mut durable = true;
        let mut create_tables = true;
        let mut prune_after = Some(PRUNE_AFTER);
        for (key, value) in parsed.query_pairs() {
            match key.as_str() {
                "strategy" => strategy = value.parse()?,
                "create_tables" => {
                    create_tables = match value.to_ascii_lowercase().as_str() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => {
                            return Err(Error::config(format!(
                                "create_tables={value:?}: expected true or false"
                            )));
                        }
                    }
                }
                "synchronous" if dialect == Dialect::Sqlite => {
                    durable = match value.to_ascii_lowercase().as_str() {
                        "full" => true,
                        "normal" => false,
                        _ => {
                            return Err(Error::config(format!(
                                "synchronous={value:?}: expected full or normal"
                            )));
                        }
                    }
                }
                "timezone" | "time-zone" if dialect == Dialect::MySql => {
                    // The lease arithmetic reads the server's clock in the session's zone.
                    return Err(Error::config(
                        "timezone: dlock pins the MySQL session time zone to UTC (leases are \
                         computed on the server's clock); remove the parameter",
                    ));
                }
                "table" => table = value,
                "prune_after_ms" => {
                    let ms: u64 = value.parse().map_err(|_| {
                        Error::config(format!(
                            "prune_after_ms={value:?}: expected a number of milliseconds (0: never)"
                        ))
                    })?;
                    prune_after = (ms > 0).then(|| Duration::from_millis(ms));
                }
                "pool" => {
                    pool = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        Error::config(format!("pool={value:?}: expected a positive integer"))
                    })?;
                }
                other if driver_parameter(dialect, other) => passed.push((key, value)),
                other => {
                    // A typo (`stratgey=for-update`) must not silently mean the default.
                    return Err(Error::config(format!(
                        "unknown query parameter {other:?} (dlock's: strategy, table, pool, \
                         create_tables, prune_after_ms{}; \
                         the driver's: {})",
                        if dialect == Dialect::Sqlite {
                            ", synchronous"
                        } else {
                            ""
                        },
                        driver_parameters(dialect).join(", ")
                    )));
                }
            }
        }
        check_table(&table)?;
        if dialect == Dialect::Sqlite && strategy == Strategy::ForUpdate {
            return Err(Error::unsupported(
                "sqlite",
                "the for-update strategy (SQLite has no row locks: use unique-insert or optimistic)",
            ));
        }
        check_dialect(dialect, strategy)?;
        let mut driver_url = parsed.expose().clone();
        driver_url.set_query(None);
        if dialect == Dialect::Sqlite
            && driver_url.path().is_empty()
            && driver_url.host_str().is_none_or(str::is_empty)
        {
            return Err(Error::config(
                "sqlite:// needs a file path, e.g. sqlite://locks.db",
            ));
        }
        if !passed.is_empty() {
            driver_url.query_pairs_mut().extend_pairs(passed.iter());
        }
        Ok(Self {
            url: RedactedUrl::parse(driver_url.as_str())?,
            dialect,
            strategy,
            table,
            pool,
            busy_timeout: Duration::from_secs(5),
            durable,
            create_tables,
            prune_after,
        })
    }

    /// The statements that create dlock's tables (`<table>_…`) for this configuration's
    /// database, as a provider runs them at connect: for an administrator to run once where
    /// the provider's role may not create tables (`?create_tables=false`).
    ///
    /// ```
    /// let c = dlock_sql::SqlConfig::from_url("postgres://app@db/shop?create_tables=false").unwrap();
    /// assert!(!c.create_tables);
    /// assert!(c.table_ddl().iter().any(|s| s.starts_with("CREATE TABLE IF NOT EXISTS dlock_holds")));
    /// ```
    pub fn table_ddl(&self) -> Vec<String> {
        crate::schema::ddl(self.dialect, &self.table)
    }

    /// The file of a `sqlite://` URL, as a path: the text after `sqlite://`, percent-decoded
    /// (a space is `%20` in a URL), so a directory with a space or non-ASCII characters works.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the decoded path is not UTF-8.
    pub(crate) fn sqlite_path(&self) -> Result<std::path::PathBuf> {
        let text = self.url.expose().as_str();
        let encoded = text
            .strip_prefix("sqlite://")
            .unwrap_or(text)
            .split('?')
            .next()
            .unwrap_or_default();
        decode_path(encoded).map(Into::into).ok_or_else(|| {
            Error::config(format!(
                "the SQLite path {encoded:?} is not valid UTF-8 once decoded"
            ))
        })
    }

    /// Sets the most connections of the provider's pool (of its lock pool, for
    /// [`SqlProvider::from_pool`](crate::SqlProvider::from_pool)); 0 counts as 1.
    pub fn with_pool_size(mut self, connections: u32) -> Self {
        self.pool = connections.max(1);
        self
    }

    /// Sets whether the provider creates dlock's tables where missing (see
    /// [`create_tables`](Self::create_tables)).
    pub fn with_create_tables(mut self, create: bool) -> Self {
        self.create_tables = create;
        self
    }

    /// Sets how long a name's row stays after its last hold ended (see
    /// [`prune_after`](Self::prune_after)); `None` keeps every row.
    pub fn with_prune_after(mut self, after: Option<Duration>) -> Self {
        self.prune_after = after;
        self
    }

    /// Sets the strategy.
    pub fn with_strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Sets the table prefix (not checked here; [`SqlProvider::connect_with`](crate::SqlProvider::connect_with) checks it).
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The store id: the database URL without credentials or parameters, with the table prefix
    /// and strategy (different tables or strategies are different stores).
    pub(crate) fn store_id(&self) -> String {
        // mariadb:// and mysql:// name the same server, as do postgresql:// and postgres://.
        let url = self.url.store_id();
        let url = if let Some(rest) = url.strip_prefix("mariadb://") {
            format!("mysql://{rest}")
        } else if let Some(rest) = url.strip_prefix("postgresql://") {
            format!("postgres://{rest}")
        } else {
            url
        };
        format!("{url}#{}/{}", self.table, self.strategy)
    }
}

/// Decodes the `%XX` escapes of a SQLite path as sqlx's driver does (both with the
/// `percent-encoding` crate): a `%` that starts no escape is a `%`; `None` if the result is
/// not UTF-8.
fn decode_path(text: &str) -> Option<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

/// The strategies of one server family: advisory is PostgreSQL's, get-lock MySQL's.
pub(crate) fn check_dialect(dialect: Dialect, strategy: Strategy) -> Result<()> {
    let backend = match dialect {
        Dialect::MySql => "mysql",
        Dialect::Sqlite => "sqlite",
        Dialect::Postgres => "postgres",
    };
    match strategy {
        Strategy::Advisory if dialect != Dialect::Postgres => Err(Error::unsupported(
            backend,
            "the advisory strategy (PostgreSQL advisory locks: use for-update or unique-insert)",
        )),
        Strategy::GetLock if dialect != Dialect::MySql => Err(Error::unsupported(
            backend,
            "the get-lock strategy (MySQL and MariaDB named locks: use advisory on PostgreSQL, \
             unique-insert on SQLite)",
        )),
        _ => Ok(()),
    }
}

/// A table prefix dlock can format into its statements unquoted on every dialect: 1 to 40 of
/// `[A-Za-z0-9_]`, not starting with a digit (PostgreSQL and SQLite read an unquoted name that
/// starts with one as a number).
pub(crate) fn check_table(table: &str) -> Result<()> {
    if table.is_empty()
        || table.len() > 40
        || !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || table.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(Error::config(format!(
            "table={table:?}: a table prefix is 1 to 40 of [A-Za-z0-9_], not starting with a \
             digit"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mysql_urls() {
        let c = SqlConfig::from_url(
            "mysql://u:secret@127.0.0.1:3306/db?strategy=optimistic&table=locks_1&pool=4&ssl-mode=disabled",
        )
        .unwrap();
        assert_eq!(c.dialect, Dialect::MySql);
        assert_eq!(c.strategy, Strategy::Optimistic);
        assert_eq!(c.table, "locks_1");
        assert_eq!(c.pool, 4);
        assert_eq!(
            c.url.expose().as_str(),
            "mysql://u:secret@127.0.0.1:3306/db?ssl-mode=disabled"
        );
        assert!(!format!("{c:?}").contains("secret"));
        assert_eq!(c.store_id(), "mysql://127.0.0.1:3306/db#locks_1/optimistic");
        let m = SqlConfig::from_url("mariadb://u@h/db").unwrap();
        assert_eq!(m.store_id(), "mysql://h:3306/db#dlock/unique-insert");
        assert_eq!(m.prune_after, Some(Duration::from_secs(3600)));
    }

    #[test]
    fn prune_after_is_milliseconds_or_never() {
        let c = SqlConfig::from_url("sqlite://l.db?prune_after_ms=1500").unwrap();
        assert_eq!(c.prune_after, Some(Duration::from_millis(1500)));
        assert!(c.url.expose().query().is_none());
        let never = SqlConfig::from_url("sqlite://l.db?prune_after_ms=0").unwrap();
        assert_eq!(never.prune_after, None);
        for bad in ["-1", "1h", ""] {
            let e = SqlConfig::from_url(&format!("sqlite://l.db?prune_after_ms={bad}"));
            assert!(matches!(e, Err(Error::Config { .. })), "{bad}: {e:?}");
        }
    }

    #[test]
    fn parses_sqlite_urls() {
        let c = SqlConfig::from_url("sqlite:///tmp/x/locks.db").unwrap();
        assert_eq!(c.dialect, Dialect::Sqlite);
        assert_eq!(c.strategy, Strategy::UniqueInsert);
        assert_eq!(c.url.expose().as_str(), "sqlite:///tmp/x/locks.db");
        assert!(c.durable);
        let rel = SqlConfig::from_url("sqlite://locks.db?strategy=optimistic").unwrap();
        assert_eq!(rel.strategy, Strategy::Optimistic);
        assert_eq!(rel.sqlite_path().unwrap(), std::path::Path::new("locks.db"));
        let fast = SqlConfig::from_url("sqlite:///tmp/Jane%20Doe/jos%C3%A9.db?synchronous=normal")
            .unwrap();
        assert!(!fast.durable);
        assert_eq!(
            fast.sqlite_path().unwrap(),
            std::path::Path::new("/tmp/Jane Doe/josé.db")
        );
    }

    #[test]
    fn strategies_are_read_by_their_names() {
        for strategy in Strategy::ALL {
            assert_eq!(strategy.as_str().parse::<Strategy>().unwrap(), strategy);
        }
        assert!("Optimistic".parse::<Strategy>().is_err());
    }

    #[test]
    fn rejects_bad_urls() {
        dlock_conformance::refuses_urls(
            SqlConfig::from_url,
            &[
                "oracle://u:secret@h/db",
                "mysql://u:secret@h/db?strategy=gets",
                "mysql://u:secret@h/db?table=x;drop",
                "mysql://u:secret@h/db?table=",
                "postgres://u:secret@h/db?table=1locks",
                "mysql://u:secret@h/db?pool=0",
                "mysql://u:secret@h/db?stratgey=for-update",
                "sqlite://x.db?ssl-mode=disabled",
                "sqlite://x.db?synchronous=off",
                "mysql://u:secret@h/db?synchronous=full",
                "mysql://u:secret@h/db?timezone=%2B01:00",
                "sqlite://",
            ],
        );
        let e = SqlConfig::from_url("mysql://u@h/db?stratgey=for-update").unwrap_err();
        assert!(e.to_string().contains("strategy, table, pool"), "{e}");
        let e = SqlConfig::from_url("sqlite://x.db?strategy=for-update").unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        for url in [
            "postgres://u:secret@h/db?strategy=get-lock",
            "sqlite://x.db?strategy=get-lock",
            "mysql://u:secret@h/db?strategy=advisory",
        ] {
            let e = SqlConfig::from_url(url).unwrap_err();
            assert!(matches!(e, Error::Unsupported { .. }), "{url}: {e}");
        }
        assert!(SqlConfig::from_url("mariadb://u@h/db?strategy=get-lock").is_ok());
    }
}

#[cfg(test)]
mod decode_tests {
    use super::decode_path;

    #[test]
    fn percent_decoding_matches_the_driver() {
        assert_eq!(
            decode_path("/home/Jane%20Doe/x.db").unwrap(),
            "/home/Jane Doe/x.db"
        );
        assert_eq!(
            decode_path("/home/jos%C3%A9/x.db").unwrap(),
            "/home/josé/x.db"
        );
        assert_eq!(decode_path("/a%2/b%zz%").unwrap(), "/a%2/b%zz%");
        assert!(decode_path("/bad%FF").is_none());
    }
}
