//! dlock's tables: the statements that create them per dialect, the columns each must have,
//! and the settings recorded with them (the strategy they serve, the layout's version).

use crate::config::{Dialect, Strategy};
use crate::sql::Tables;

/// The version of the tables' layout this dlock reads and writes for `strategy` on
/// `dialect`, recorded in `<t>_meta`: 2 for for-update on PostgreSQL, whose locks are
/// advisory locks on the keys of `<t>_names` (in version 1 they were row locks of
/// `<t>_rows`, which advisory locks do not exclude), 1 for the rest.
pub(crate) const fn schema_version(dialect: Dialect, strategy: Strategy) -> &'static str {
    match (dialect, strategy) {
        (Dialect::Postgres, Strategy::ForUpdate) => "2",
        _ => "1",
    }
}

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
    /// How many unique indexes of one column, `name`, a table has (`?`: the table), for the
    /// tables whose names must be unique: a table without one (made by hand) would let two
    /// holders in. (table, statement)
    pub(crate) unique_names: Vec<(String, String)>,
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
            unique_names: columns(s.dialect)
                .into_iter()
                .filter(|(_, columns)| columns.starts_with("name"))
                .map(|(table, _)| {
                    (
                        format!("{t}_{table}"),
                        s.stmt(unique_name_indexes(s.dialect)),
                    )
                })
                .collect(),
        }
    }
}

/// The statement that counts a table's unique indexes of the one column `name` (`?`: the
/// table's name): what makes two rows of one name impossible. Partial, prefix (MySQL) and
/// invalid (PostgreSQL) ones are left out, and on PostgreSQL a deferrable one makes the
/// count 0 whatever else there is (`ON CONFLICT` refuses to work beside it); included columns
/// (`INCLUDE`) do not count as keys. MySQL names the table exactly where the server's table
/// names are case-sensitive (`lower_case_table_names = 0`).
fn unique_name_indexes(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::MySql => {
            "SELECT COUNT(*) FROM (SELECT s.INDEX_NAME \
             FROM information_schema.STATISTICS AS s, (SELECT ? AS t) AS w \
             WHERE s.TABLE_SCHEMA = DATABASE() AND s.NON_UNIQUE = 0 \
             AND (BINARY s.TABLE_NAME = BINARY w.t \
             OR (@@lower_case_table_names <> 0 AND LOWER(s.TABLE_NAME) = LOWER(w.t))) \
             GROUP BY s.INDEX_NAME \
             HAVING COUNT(*) = 1 AND MAX(s.COLUMN_NAME) = 'name' AND MAX(s.SUB_PART) IS NULL) AS u"
        }
        Dialect::Postgres => {
            "SELECT CASE WHEN bool_or(NOT i.indimmediate) THEN 0 ELSE COUNT(*) FILTER \
             (WHERE i.indisvalid AND i.indpred IS NULL) END \
             FROM pg_index i JOIN pg_attribute a \
             ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = to_regclass(?) AND i.indisunique AND i.indnkeyatts = 1 \
             AND a.attname = 'name'"
        }
        Dialect::Sqlite => {
            "SELECT COUNT(*) FROM pragma_index_list(?) AS l \
             WHERE l.\"unique\" = 1 AND l.partial = 0 \
             AND (SELECT COUNT(*) FROM pragma_index_info(l.name)) = 1 \
             AND (SELECT i.name FROM pragma_index_info(l.name) AS i) = 'name'"
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

/// The DDL of dlock's tables on `dialect`, named `<t>_…`: one layout, in each dialect's
/// types.
pub(crate) fn ddl(dialect: Dialect, t: &str) -> Vec<String> {
    // Short text, a lock name (bytes), a counter, a time or token, an auto-increment id
    // (never reused, even after the largest is deleted) and a table's options.
    let (text, name, int, big, serial, options) = match dialect {
        Dialect::MySql => (
            "VARCHAR(64)",
            "VARBINARY(255)",
            "INT",
            "BIGINT",
            "BIGINT NOT NULL AUTO_INCREMENT",
            " ENGINE=InnoDB",
        ),
        Dialect::Sqlite => (
            "TEXT",
            "BLOB",
            "INTEGER",
            "INTEGER",
            "INTEGER PRIMARY KEY AUTOINCREMENT",
            "",
        ),
        Dialect::Postgres => (
            "TEXT",
            "BYTEA",
            "INT",
            "BIGINT",
            "BIGINT GENERATED ALWAYS AS IDENTITY",
            "",
        ),
    };
    // Bytes of any length up to 64 KiB (MySQL's BLOB).
    let blob = match dialect {
        Dialect::MySql | Dialect::Sqlite => "BLOB",
        Dialect::Postgres => "BYTEA",
    };
    let table = |suffix: &str, columns: String| {
        format!("CREATE TABLE IF NOT EXISTS {t}_{suffix} ({columns}){options}")
    };
    // The holds' name and id, and the seeds' id: SQLite's auto-increment column must be the
    // table's primary key (the name is then unique).
    let (keys, seed) = match dialect {
        Dialect::Sqlite => (
            format!("id {serial}, name {name} NOT NULL UNIQUE"),
            serial.to_owned(),
        ),
        Dialect::MySql | Dialect::Postgres => (
            format!("name {name} NOT NULL PRIMARY KEY, id {serial} UNIQUE"),
            format!("{serial} PRIMARY KEY"),
        ),
    };
    let mut ddl = vec![
        table(
            "meta",
            format!("name {text} NOT NULL PRIMARY KEY, value {text} NOT NULL"),
        ),
        table(
            "holds",
            format!(
                "{keys}, owner {text} NOT NULL, \
                 holds {int} NOT NULL, takeovers {big} NOT NULL DEFAULT 0, \
                 expires_at {big} NOT NULL"
            ),
        ),
        table(
            "versions",
            format!(
                "name {name} NOT NULL PRIMARY KEY, owner {text} NOT NULL DEFAULT '', \
                 holds {int} NOT NULL DEFAULT 0, version {big} NOT NULL DEFAULT 0, \
                 expires_at {big} NOT NULL DEFAULT 0"
            ),
        ),
        table("seeds", format!("id {seed}")),
        table(
            "fence",
            format!("name {name} NOT NULL PRIMARY KEY, token {big} NOT NULL"),
        ),
        // Elections' proposals. Not among the tables checked at connect: a database whose
        // tables were made by hand before elections existed still serves locks.
        table(
            "elections",
            format!(
                "name {name} NOT NULL PRIMARY KEY, term {big} NOT NULL, proposal {blob} NOT NULL"
            ),
        ),
    ];
    if dialect != Dialect::Sqlite {
        // The row strategies' rows (SQLite has no row locks).
        ddl.push(table("rows", format!("name {name} NOT NULL PRIMARY KEY")));
    }
    if dialect == Dialect::Postgres {
        // Advisory locks: each name gets its own key once, from one sequence for the whole
        // database (advisory locks are per database, so two table prefixes must not hand out
        // the same key); never a hash, so two names never share one.
        ddl.push("CREATE SEQUENCE IF NOT EXISTS dlock_advisory_keys AS INTEGER".to_owned());
        ddl.push(table(
            "names",
            format!(
                "name {name} NOT NULL PRIMARY KEY, \
                 id INTEGER NOT NULL UNIQUE DEFAULT nextval('dlock_advisory_keys'), \
                 token {big} NOT NULL DEFAULT 0"
            ),
        ));
    }
    ddl
}
