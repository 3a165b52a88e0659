//! Every statement dlock runs, per dialect. Lock names and owners are always bound parameters;
//! only the validated table prefix is formatted in.

use crate::config::Dialect;

/// The DDL and statements of one provider.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) ddl: Vec<String>,
    // unique-insert
    pub(crate) insert_hold: String,
    pub(crate) take_over_hold: String,
    pub(crate) select_hold_token: String,
    pub(crate) delete_hold: String,
    pub(crate) renew_hold: String,
    // optimistic
    pub(crate) claim_version: String,
    pub(crate) select_version: String,
    pub(crate) insert_version: String,
    pub(crate) release_version: String,
    pub(crate) release_version_by_owner: String,
    pub(crate) renew_version: String,
    // for-update
    pub(crate) insert_row: String,
    pub(crate) row_exists: String,
    pub(crate) lock_row: String,
    pub(crate) lock_row_nowait: String,
    pub(crate) lock_wait_timeout: String,
    pub(crate) connection_id: String,
    pub(crate) hold_timeout: String,
    pub(crate) reset_hold_timeout: String,
    pub(crate) next_fence: String,
    // inspection
    pub(crate) describe_hold: String,
    pub(crate) describe_version: String,
    pub(crate) describe_fence: String,
}

/// The database clock, in milliseconds since the epoch.
fn now(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::MySql => "CAST(ROUND(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000) AS SIGNED)",
        Dialect::Sqlite => "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
    }
}

impl Statements {
    pub(crate) fn new(dialect: Dialect, t: &str) -> Self {
        let now = now(dialect);
        let ddl = match dialect {
            Dialect::MySql => vec![
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
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_fence (\
                     name BLOB NOT NULL PRIMARY KEY, \
                     token INTEGER NOT NULL)"
                ),
            ],
        };
        let (insert_ignore, claim_version, next_fence) = match dialect {
            Dialect::MySql => (
                "INSERT IGNORE INTO",
                // LAST_INSERT_ID(expr) hands the new version back with the UPDATE's answer.
                format!(
                    "UPDATE {t}_versions SET owner = ?, holds = 1, \
                     version = LAST_INSERT_ID(version + 1), expires_at = {now} + ? \
                     WHERE name = ? AND version = ? AND (owner = '' OR expires_at <= {now})"
                ),
                format!(
                    "INSERT INTO {t}_fence (name, token) VALUES (?, LAST_INSERT_ID(1)) \
                     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)"
                ),
            ),
            Dialect::Sqlite => (
                "INSERT OR IGNORE INTO",
                format!(
                    "UPDATE {t}_versions SET owner = ?, holds = 1, version = version + 1, \
                     expires_at = {now} + ? \
                     WHERE name = ? AND version = ? AND (owner = '' OR expires_at <= {now}) \
                     RETURNING version"
                ),
                format!(
                    "INSERT INTO {t}_fence (name, token) VALUES (?, 1) \
                     ON CONFLICT(name) DO UPDATE SET token = token + 1 RETURNING token"
                ),
            ),
        };
        Self {
            ddl,
            insert_hold: format!(
                "INSERT INTO {t}_holds (name, owner, holds, takeovers, expires_at) \
                 VALUES (?, ?, 1, 0, {now} + ?){}",
                match dialect {
                    Dialect::MySql => "",
                    Dialect::Sqlite => " RETURNING id",
                }
            ),
            take_over_hold: format!(
                "UPDATE {t}_holds SET owner = ?, holds = 1, takeovers = takeovers + 1, \
                 expires_at = {now} + ? WHERE name = ? AND expires_at <= {now}"
            ),
            select_hold_token: format!(
                "SELECT id, takeovers FROM {t}_holds WHERE name = ? AND owner = ?"
            ),
            delete_hold: format!("DELETE FROM {t}_holds WHERE name = ? AND owner = ?"),
            renew_hold: format!(
                "UPDATE {t}_holds SET expires_at = {now} + ? WHERE name = ? AND owner = ?"
            ),
            claim_version,
            select_version: format!("SELECT version FROM {t}_versions WHERE name = ?"),
            insert_version: format!("{insert_ignore} {t}_versions (name) VALUES (?)"),
            release_version: format!(
                "UPDATE {t}_versions SET owner = '', holds = 0, expires_at = 0 \
                 WHERE name = ? AND owner = ? AND version = ?"
            ),
            release_version_by_owner: format!(
                "UPDATE {t}_versions SET owner = '', holds = 0, expires_at = 0 \
                 WHERE name = ? AND owner = ?"
            ),
            renew_version: format!(
                "UPDATE {t}_versions SET expires_at = {now} + ? \
                 WHERE name = ? AND owner = ? AND version = ?"
            ),
            insert_row: format!("{insert_ignore} {t}_rows (name) VALUES (?)"),
            row_exists: format!("SELECT 1 FROM {t}_rows WHERE name = ?"),
            lock_row: format!("SELECT CONNECTION_ID() FROM {t}_rows WHERE name = ? FOR UPDATE"),
            lock_row_nowait: format!(
                "SELECT CONNECTION_ID() FROM {t}_rows WHERE name = ? FOR UPDATE NOWAIT"
            ),
            lock_wait_timeout: "SET SESSION innodb_lock_wait_timeout = ?, wait_timeout = ?"
                .to_owned(),
            connection_id: "SELECT CONNECTION_ID()".to_owned(),
            // The server-side lease of a for-update hold: the server closes a connection idle
            // this long, which rolls back and frees the row (a paused or cut-off holder).
            hold_timeout: "SET SESSION wait_timeout = ?".to_owned(),
            reset_hold_timeout: "SET SESSION wait_timeout = DEFAULT".to_owned(),
            next_fence,
            describe_hold: format!(
                "SELECT owner, id, takeovers, expires_at - {now} FROM {t}_holds WHERE name = ?"
            ),
            describe_version: format!(
                "SELECT owner, version, expires_at - {now} FROM {t}_versions WHERE name = ?"
            ),
            describe_fence: format!("SELECT token FROM {t}_fence WHERE name = ?"),
        }
    }
}
