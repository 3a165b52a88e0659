//! `mysql://` and `sqlite://` URLs: the dialect, the strategy and the table prefix.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::{Error, RedactedUrl, Result};

/// The database family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// MySQL 8 or MariaDB 10.6+.
    MySql,
    /// SQLite 3.42+ (embedded, file-based).
    Sqlite,
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
    /// A dedicated connection holds `SELECT … FOR UPDATE` on the name's row in an open
    /// transaction (MySQL/MariaDB only).
    ForUpdate,
}

impl Strategy {
    /// The name used in URLs (`?strategy=`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::UniqueInsert => "unique-insert",
            Self::Optimistic => "optimistic",
            Self::ForUpdate => "for-update",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "unique-insert" => Ok(Self::UniqueInsert),
            "optimistic" => Ok(Self::Optimistic),
            "for-update" => Ok(Self::ForUpdate),
            other => Err(Error::config(format!(
                "unknown strategy {other:?}: expected unique-insert, optimistic or for-update"
            ))),
        }
    }
}

/// How to reach the database and which strategy to use. `Debug` never shows the password.
///
/// URLs:
/// - `mysql://user:password@host[:port]/database[?strategy=…&table=…&pool=N]` (also
///   `mariadb://`);
/// - `sqlite://path/to/file.db[?strategy=…&table=…]` (relative path) or
///   `sqlite:///absolute/path.db`; the file is created if missing.
///
/// | query parameter | meaning | default |
/// | --- | --- | --- |
/// | `strategy` | `unique-insert`, `optimistic` or `for-update` | `unique-insert` |
/// | `table` | prefix of the tables dlock creates (`[A-Za-z0-9_]`, at most 40) | `dlock` |
/// | `pool` | maximum connections of the provider's pool | `16` (MySQL), `8` (SQLite) |
///
/// Other parameters are passed to the driver (e.g. `ssl-mode=required`).
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
            "timezone",
            "pipes-as-concat",
            "enable-cleartext-plugin",
        ],
        Dialect::Sqlite => &["mode", "cache", "immutable", "vfs"],
    }
}

fn driver_parameter(dialect: Dialect, key: &str) -> bool {
    driver_parameters(dialect).contains(&key)
}

impl SqlConfig {
    /// Parses a `mysql://`, `mariadb://` or `sqlite://` URL.
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
            other => {
                return Err(Error::config(format!(
                    "the sql backend takes mysql://, mariadb:// or sqlite:// URLs, not {other}://"
                )));
            }
        };
        let mut strategy = Strategy::default();
        let mut table = "dlock".to_owned();
        let mut pool = match dialect {
            Dialect::MySql => 16,
            Dialect::Sqlite => 8,
        };
        let mut passed = Vec::new();
        for (key, value) in parsed.query_pairs() {
            match key.as_str() {
                "strategy" => strategy = value.parse()?,
                "table" => table = value,
                "pool" => {
                    pool = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        Error::config(format!("pool={value:?}: expected a positive integer"))
                    })?;
                }
                other if driver_parameter(dialect, other) => passed.push((key, value)),
                other => {
                    // A typo (`stratgey=for-update`) must not silently mean the default.
                    return Err(Error::config(format!(
                        "unknown query parameter {other:?} (dlock's: strategy, table, pool; \
                         the driver's: {})",
                        driver_parameters(dialect).join(", ")
                    )));
                }
            }
        }
        if table.is_empty()
            || table.len() > 40
            || !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(Error::config(format!(
                "table={table:?}: a table prefix is 1 to 40 of [A-Za-z0-9_]"
            )));
        }
        if dialect == Dialect::Sqlite && strategy == Strategy::ForUpdate {
            return Err(Error::unsupported(
                "sqlite",
                "the for-update strategy (SQLite has no row locks: use unique-insert or optimistic)",
            ));
        }
        let mut driver_url = parsed.expose().clone();
        driver_url.set_query(None);
        if dialect == Dialect::MySql && driver_url.scheme() == "mariadb" {
            // The driver knows the family as mysql://.
            let text = driver_url.as_str().replacen("mariadb://", "mysql://", 1);
            driver_url = RedactedUrl::parse(&text)?.expose().clone();
        }
        if dialect == Dialect::Sqlite {
            if driver_url.path().is_empty() && driver_url.host_str().is_none_or(str::is_empty) {
                return Err(Error::config(
                    "sqlite:// needs a file path, e.g. sqlite://locks.db",
                ));
            }
            passed.retain(|(k, _)| k != "mode");
            passed.push(("mode".into(), "rwc".into()));
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
        })
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
        format!("{}#{}/{}", self.url.store_id(), self.table, self.strategy)
    }
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
        assert_eq!(m.url.expose().scheme(), "mysql");
    }

    #[test]
    fn parses_sqlite_urls() {
        let c = SqlConfig::from_url("sqlite:///tmp/x/locks.db").unwrap();
        assert_eq!(c.dialect, Dialect::Sqlite);
        assert_eq!(c.strategy, Strategy::UniqueInsert);
        assert_eq!(c.url.expose().as_str(), "sqlite:///tmp/x/locks.db?mode=rwc");
        let rel = SqlConfig::from_url("sqlite://locks.db?strategy=optimistic").unwrap();
        assert_eq!(rel.strategy, Strategy::Optimistic);
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "postgres://u:secret@h/db",
            "mysql://u:secret@h/db?strategy=gets",
            "mysql://u:secret@h/db?table=x;drop",
            "mysql://u:secret@h/db?table=",
            "mysql://u:secret@h/db?pool=0",
            "mysql://u:secret@h/db?stratgey=for-update",
            "sqlite://x.db?ssl-mode=disabled",
            "sqlite://",
        ] {
            let e = SqlConfig::from_url(bad).unwrap_err();
            assert!(matches!(e, Error::Config { .. }), "{bad}: {e}");
            assert!(!e.to_string().contains("secret"), "{bad}: {e}");
        }
        let e = SqlConfig::from_url("mysql://u@h/db?stratgey=for-update").unwrap_err();
        assert!(e.to_string().contains("strategy, table, pool"), "{e}");
        let e = SqlConfig::from_url("sqlite://x.db?strategy=for-update").unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    }
}
