//! Mapping sqlx errors into the core error, with retryability.

use dlock_core::Error;
use sqlx::error::ErrorKind;

/// What a database error means to the locking code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Meaning {
    /// A unique-key violation: somebody else's row is there.
    Duplicate,
    /// The row lock is held by someone else (NOWAIT failed, or the lock wait timed out).
    Busy,
    /// Anything else.
    Other,
}

/// Classifies a sqlx error.
pub(crate) fn meaning(e: &sqlx::Error) -> Meaning {
    let Some(db) = e.as_database_error() else {
        return Meaning::Other;
    };
    if db.kind() == ErrorKind::UniqueViolation {
        return Meaning::Duplicate;
    }
    if pg_code(db).as_deref() == Some("55P03") {
        // lock_not_available: NOWAIT failed, or lock_timeout ran out.
        return Meaning::Busy;
    }
    match mysql_code(db) {
        // ER_LOCK_WAIT_TIMEOUT, ER_LOCK_NOWAIT (MySQL), and MariaDB's NOWAIT answer.
        Some(1205 | 3572) => Meaning::Busy,
        _ => Meaning::Other,
    }
}

/// Whether a `CREATE ... IF NOT EXISTS` failed because another session created the same
/// object at the same moment: PostgreSQL checks for the table before it creates it, without a
/// lock, so of two sessions that both find it missing the later one fails with
/// `duplicate_table` (42P07), `duplicate_object` (42710) or a unique violation in the catalog.
/// Run again, the statement finds the object and does nothing.
pub(crate) fn created_meanwhile(e: &sqlx::Error) -> bool {
    let Some(db) = e.as_database_error() else {
        return false;
    };
    db.kind() == ErrorKind::UniqueViolation
        || matches!(pg_code(db).as_deref(), Some("42P07" | "42710"))
}

/// The PostgreSQL SQLSTATE, if it is a PostgreSQL error.
fn pg_code(db: &dyn sqlx::error::DatabaseError) -> Option<String> {
    #[cfg(feature = "postgres")]
    if let Some(p) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return Some(p.code().to_owned());
    }
    let _ = db;
    None
}

/// The MySQL error number, if it is one.
fn mysql_code(db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    #[cfg(feature = "mysql")]
    if let Some(m) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return Some(m.number());
    }
    let _ = db;
    None
}

/// Converts a sqlx error at the crate boundary. `backend` is `"mysql"`, `"postgres"` or
/// `"sqlite"`.
///
/// I/O errors, pool timeouts, lost connections, a server going away or refusing connections,
/// and a session the server ended (killed, or idle past its timeout) are
/// [`Error::Connection`]; deadlocks (`ER_LOCK_DEADLOCK`), lock wait timeouts
/// and `SQLITE_BUSY`/`SQLITE_LOCKED` are retryable [`Error::Backend`]s.
pub(crate) fn from_sqlx(backend: &'static str, what: &str, e: sqlx::Error) -> Error {
    match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            Error::connection(backend, format!("{what}: {e}"), e)
        }
        sqlx::Error::Tls(_) => Error::connection(backend, format!("{what}: {e}"), e),
        sqlx::Error::Configuration(_) => Error::Config {
            message: format!("{what}: {e}"),
            source: Some(Box::new(e)),
        },
        sqlx::Error::Database(db) if pg_code(db.as_ref()).is_some() => {
            let code = pg_code(db.as_ref()).unwrap_or_default();
            // Connection errors: the server shutting down or refusing connections for now,
            // every connection exception (class 08), and a session the server ended for
            // sitting idle, which the client reads as the answer to its next statement (that
            // statement never ran): 57P05 `idle_session_timeout` (which managed services set
            // on their roles) on a connection idle in the pool, 25P03
            // `idle_in_transaction_session_timeout` (the for-update lease) on an
            // acquisition's connection. The database could not be reached on that
            // connection, which no caller may read as "held", and another connection can
            // help. Serialization failures, deadlocks and a lock not available are retryable.
            // 53300: too many connections.
            if pg_connection_code(&code) || code == "53300" {
                return Error::connection(backend, format!("{what}: {e}"), e);
            }
            let retryable = matches!(code.as_str(), "40001" | "40P01" | "55P03");
            Error::backend(backend, format!("{what}: {e}"), retryable, e)
        }
        sqlx::Error::Database(db) => {
            let retryable = match mysql_code(db.as_ref()) {
                // a session that ended, or too many connections
                Some(c) if mysql_connection_code(c) || c == 1040 => {
                    return Error::connection(backend, format!("{what}: {e}"), e);
                }
                // deadlock, lock wait timeout, NOWAIT, read-only during failover
                Some(1213 | 1205 | 3572 | 1290 | 1836) => true,
                Some(_) => false,
                None => sqlite_busy(db.as_ref()),
            };
            Error::backend(backend, format!("{what}: {e}"), retryable, e)
        }
        _ => Error::backend(backend, format!("{what}: {e}"), false, e),
    }
}

/// Whether `e` says the connection it came on is gone (an I/O error, the session ended by
/// the server): that connection is not used again, and the others opened with it may be gone
/// too.
pub(crate) fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => match pg_code(db.as_ref()) {
            Some(code) => pg_connection_code(&code),
            None => mysql_code(db.as_ref()).is_some_and(mysql_connection_code),
        },
        _ => false,
    }
}

/// PostgreSQL's codes for a session that ended: the server shutting down, a connection
/// exception (class 08), a session ended for sitting idle.
fn pg_connection_code(code: &str) -> bool {
    matches!(code, "57P01" | "57P02" | "57P03" | "57P05" | "25P03") || code.starts_with("08")
}

/// MySQL's codes for a session that ended: server gone, lost connection, server shutting
/// down, connection killed (MariaDB's `ER_CONNECTION_KILLED`), and MySQL 8.0.24+'s
/// `ER_CLIENT_INTERACTION_TIMEOUT` (4031), which the server sends before it closes a
/// connection idle past its `wait_timeout` (a for-update hold's server-side lease; older
/// servers just close it, which reads as 2013).
fn mysql_connection_code(code: u16) -> bool {
    matches!(code, 2006 | 2013 | 1053 | 1927 | 4031)
}

/// SQLite's BUSY (5) or LOCKED (6), with their extended codes: another connection has the
/// lock; trying again can help.
pub(crate) fn sqlite_busy(db: &dyn sqlx::error::DatabaseError) -> bool {
    db.code()
        .and_then(|c| c.parse::<u32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection MySQL 8 closed for idling past its `wait_timeout` (the for-update
    /// lease) says so with 4031: the session, and every lock in it, is gone.
    #[test]
    fn mysql_8s_idle_disconnect_is_a_lost_connection() {
        for code in [2006, 2013, 1053, 1927, 4031] {
            assert!(mysql_connection_code(code), "{code}");
        }
        for code in [1205, 1213, 1062] {
            assert!(!mysql_connection_code(code), "{code}");
        }
    }
}
