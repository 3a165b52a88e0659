//! dlock's tables: the statements that create them per dialect, the columns each must have,
//! and the settings recorded with them (the strategy they serve, the layout's version).

use crate::config::Dialect;
use crate::sql::Tables;

/// The version of the tables' layout this dlock reads and writes, recorded in `<t>_meta`.
pub(crate) const SCHEMA_VERSION: &str = "1";

/// The tables, and the strategy they serve.
#[derive(Debug, Clone)]
pub(crate) struct SchemaSql {
    /// Creates the tables (and PostgreSQL's advisory key sequence) where missing.
    pub(crate) ddl: Vec<String>,
    /// Reads no row but names every column dlock uses, one statement per table: it fails on
    /// a missing table or column. (table, statement)
    pub(crate) probes: Vec<(String, String)>,
    /// Records a setting (`?`: its name, its value) if none is recorded yet.
    pub(crate) claim: String,
    /// A recorded setting (`?`: its name).
    pub(crate) read: String,
}

impl SchemaSql {
    pub(crate) fn new(s: Tables<'_>) -> Self {
        let t = s.prefix;
        let (insert_ignore, ignore_suffix) = s.insert_ignore();
        let probes = columns(s.dialect)
            .into_iter()
            .map(|(table, columns)| {
                (
                    format!("{t}_{table}"),
                    format!("SELECT {columns} FROM {t}_{table} WHERE 1 = 0"),
                )
            })
            .collect();
        Self {
            ddl: ddl(s.dialect, t),
            probes,
            claim: s.stmt(format!(
                "{insert_ignore} {t}_meta (name, value) VALUES (?, ?){ignore_suffix}"
            )),
            read: s.stmt(format!("SELECT value FROM {t}_meta WHERE name = ?")),
        }
    }
}

/// The columns dlock uses in each of its tables on `dialect` (as [`ddl`] makes them):
/// (table suffix, columns).
fn columns(dialect: Dialect) -> Vec<(&'static str, &'static str)> {
    let mut tables = vec![
        ("meta", "name, value"),
        ("holds", "name, id, owner, holds, takeovers, expires_at"),
        ("versions", "name, owner, holds, version, expires_at"),
        ("seeds", "id"),
        ("fence", "name, token"),
    ];
    if dialect != Dialect::Sqlite {
        tables.push(("rows", "name"));
    }
    if dialect == Dialect::Postgres {
        tables.push(("names", "name, id, token"));
    }
    tables
}

/// The DDL of dlock's tables on `dialect`, named `<t>_…`.
pub(crate) fn ddl(dialect: Dialect, t: &str) -> Vec<String> {
    match dialect {
        Dialect::MySql => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_meta (\
                 name VARCHAR(64) NOT NULL PRIMARY KEY, \
                 value VARCHAR(64) NOT NULL) ENGINE=InnoDB"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_holds (\
                 name VARBINARY(255) NOT NULL PRIMARY KEY, \
                 id BIGINT NOT NULL AUTO_INCREMENT UNIQUE, \
                 owner VARCHAR(64) NOT NULL, \
                 holds INT NOT NULL, \
                 takeovers BIGINT NOT NULL DEFAULT 0, \
                 expires_at BIGINT NOT NULL) ENGINE=InnoDB"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_versions (\
                 name VARBINARY(255) NOT NULL PRIMARY KEY, \
                 owner VARCHAR(64) NOT NULL DEFAULT '', \
                 holds INT NOT NULL DEFAULT 0, \
                 version BIGINT NOT NULL DEFAULT 0, \
                 expires_at BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_seeds (\
                 id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY) ENGINE=InnoDB"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_rows (\
                 name VARBINARY(255) NOT NULL PRIMARY KEY) ENGINE=InnoDB"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_fence (\
                 name VARBINARY(255) NOT NULL PRIMARY KEY, \
                 token BIGINT NOT NULL) ENGINE=InnoDB"
            ),
        ],
        Dialect::Sqlite => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_meta (\
                 name TEXT NOT NULL PRIMARY KEY, \
                 value TEXT NOT NULL)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_holds (\
                 id INTEGER PRIMARY KEY AUTOINCREMENT, \
                 name BLOB NOT NULL UNIQUE, \
                 owner TEXT NOT NULL, \
                 holds INTEGER NOT NULL, \
                 takeovers INTEGER NOT NULL DEFAULT 0, \
                 expires_at INTEGER NOT NULL)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_versions (\
                 name BLOB NOT NULL PRIMARY KEY, \
                 owner TEXT NOT NULL DEFAULT '', \
                 holds INTEGER NOT NULL DEFAULT 0, \
                 version INTEGER NOT NULL DEFAULT 0, \
                 expires_at INTEGER NOT NULL DEFAULT 0)"
            ),
            // AUTOINCREMENT: ids are never reused, even after the largest is deleted.
            format!("CREATE TABLE IF NOT EXISTS {t}_seeds (id INTEGER PRIMARY KEY AUTOINCREMENT)"),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_fence (\
                 name BLOB NOT NULL PRIMARY KEY, \
                 token INTEGER NOT NULL)"
            ),
        ],
        Dialect::Postgres => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_meta (\
                 name TEXT NOT NULL PRIMARY KEY, \
                 value TEXT NOT NULL)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_holds (\
                 name BYTEA NOT NULL PRIMARY KEY, \
                 id BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE, \
                 owner TEXT NOT NULL, \
                 holds INT NOT NULL, \
                 takeovers BIGINT NOT NULL DEFAULT 0, \
                 expires_at BIGINT NOT NULL)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_versions (\
                 name BYTEA NOT NULL PRIMARY KEY, \
                 owner TEXT NOT NULL DEFAULT '', \
                 holds INT NOT NULL DEFAULT 0, \
                 version BIGINT NOT NULL DEFAULT 0, \
                 expires_at BIGINT NOT NULL DEFAULT 0)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_seeds (\
                 id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY)"
            ),
            format!("CREATE TABLE IF NOT EXISTS {t}_rows (name BYTEA NOT NULL PRIMARY KEY)"),
            // Advisory locks: each name gets its own key once, from one sequence for the
            // whole database (advisory locks are per database, so two table prefixes must
            // not hand out the same key); never a hash, so two names never share one.
            "CREATE SEQUENCE IF NOT EXISTS dlock_advisory_keys AS INTEGER".to_owned(),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_names (\
                 name BYTEA NOT NULL PRIMARY KEY, \
                 id INTEGER NOT NULL UNIQUE DEFAULT nextval('dlock_advisory_keys'), \
                 token BIGINT NOT NULL DEFAULT 0)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_fence (\
                 name BYTEA NOT NULL PRIMARY KEY, \
                 token BIGINT NOT NULL)"
            ),
        ],
    }
}
