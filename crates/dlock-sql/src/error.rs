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
/// [`Error::Connection`]; the database's answers that the lock is taken by someone else
/// (see [`contention`]) are retryable [`Error::Backend`]s; a database that refuses writes
/// (see [`refuses_writes`]) is a non-retryable [`Error::Backend`] that names the cause.
pub(crate) fn from_sqlx(backend: &'static str, what: &str, e: sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = &e
        && let Some(cause) = refuses_writes(db.as_ref())
    {
        // Not retryable: the same server refuses the same statement until an operator
        // changes it (or a failover moves the name to another server, which a new
        // provider, not a retry on these connections, reaches).
        return Error::backend(
            backend,
            format!("{what}: the database refuses writes ({cause}): {e}"),
            false,
            e,
        );
    }
    match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            Error::connection(backend, format!("{what}: {e}"), e)
        }
        sqlx::Error::Tls(_) => Error::connection(backend, format!("{what}: {e}"), e),
        sqlx::Error::Configuration(_) => Error::config_caused(format!("{what}: {e}"), e),
        sqlx::Error::Database(db) if pg_code(db.as_ref()).is_some() => {
            let code = pg_code(db.as_ref()).unwrap_or_default();
            // Connection errors: the server shutting down or refusing connections for now,
            // every connection exception (class 08), and a session the server ended for
            // sitting idle, which the client reads as the answer to its next statement (that
            // statement never ran): 57P05 `idle_session_timeout` (which managed services set
            // on their roles) on a connection idle in the pool or a pinned hold's (its
            // lease), 25P03 `idle_in_transaction_session_timeout` on a connection the
            // application left in a transaction. The database could not be reached on that
            // connection, which no caller may read as "held", and another connection can
            // help. 53300: too many connections.
            if pg_connection_code(&code) || code == "53300" {
                return Error::connection(backend, format!("{what}: {e}"), e);
            }
            let retryable = contention(db.as_ref());
            Error::backend(backend, format!("{what}: {e}"), retryable, e)
        }
        sqlx::Error::Database(db) => {
            // a session that ended, or too many connections
            if mysql_code(db.as_ref()).is_some_and(|c| mysql_connection_code(c) || c == 1040) {
                return Error::connection(backend, format!("{what}: {e}"), e);
            }
            let retryable = contention(db.as_ref());
            Error::backend(backend, format!("{what}: {e}"), retryable, e)
        }
        _ => Error::backend(backend, format!("{what}: {e}"), false, e),
    }
}

/// Whether `e` is MySQL's or MariaDB's deadlock answer (ER_LOCK_DEADLOCK): InnoDB then rolls
/// back the victim's whole transaction, not only its statement.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_deadlock(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(mysql_code)
        .is_some_and(|code| code == 1213)
}

/// Whether the database answered that the lock is taken by someone else: a row or advisory
/// lock not available (NOWAIT refused, a lock wait that ran out), a deadlock or serialization
/// failure among contenders, a busy or locked SQLite file. Trying again can help, and until
/// then the lock counts as held.
fn contention(db: &dyn sqlx::error::DatabaseError) -> bool {
    if let Some(code) = pg_code(db) {
        return pg_contention(&code);
    }
    match mysql_code(db) {
        Some(code) => mysql_contention(code),
        None => sqlite_busy(db),
    }
}

/// [`contention`] for a PostgreSQL SQLSTATE: serialization_failure, deadlock_detected,
/// lock_not_available.
fn pg_contention(code: &str) -> bool {
    matches!(code, "40001" | "40P01" | "55P03")
}

/// [`contention`] for a MySQL or MariaDB error number: ER_LOCK_DEADLOCK,
/// ER_LOCK_WAIT_TIMEOUT, ER_LOCK_NOWAIT.
fn mysql_contention(code: u16) -> bool {
    matches!(code, 1213 | 1205 | 3572)
}

/// Whether `e`, an error of an acquisition's attempt, is the database's answer that the lock
/// is taken (see [`contention`]): such an attempt ended like one that found the lock held.
/// Every other retryable error means the database could not be asked (a connection that
/// broke or could not be had, no answer in time), which is never "held".
pub(crate) fn answered_busy(e: &Error) -> bool {
    let Error::Backend {
        source: Some(source),
        ..
    } = e
    else {
        return false;
    };
    match source.downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Database(db)) => contention(db.as_ref()),
        _ => false,
    }
}

/// Why the database refuses to write, if that is what `db` says: a server in read-only mode
/// (a replica, or a primary demoted by a failover), a read-only session or transaction, a
/// PostgreSQL hot standby, a read-only SQLite file.
fn refuses_writes(db: &dyn sqlx::error::DatabaseError) -> Option<&'static str> {
    if let Some(code) = pg_code(db) {
        // A session the server ended (one in crash recovery, say) is a connection error.
        if pg_connection_code(&code) {
            return None;
        }
        return pg_refusal(&code, db.message());
    }
    if let Some(code) = mysql_code(db) {
        return mysql_refusal(code);
    }
    sqlite_refusal(db.code().and_then(|c| c.parse::<u32>().ok()))
}

/// [`refuses_writes`] for a MySQL or MariaDB error number.
fn mysql_refusal(code: u16) -> Option<&'static str> {
    match code {
        // ER_OPTION_PREVENTS_STATEMENT: the server's message names the option.
        1290 => Some(
            "the server runs with read_only or super_read_only: a replica, or a primary \
             demoted by a failover",
        ),
        // ER_READ_ONLY_MODE
        1836 => Some("the server is in read-only mode"),
        // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
        1792 => Some("the session's transactions are read-only (transaction_read_only)"),
        _ => None,
    }
}

/// [`refuses_writes`] for a PostgreSQL SQLSTATE and message.
fn pg_refusal(code: &str, message: &str) -> Option<&'static str> {
    // A hot standby says so only in its messages: a transaction id or a lock a standby cannot
    // give ("cannot assign TransactionIds during recovery", "... while recovery is in
    // progress"), under several SQLSTATEs.
    if message.contains("during recovery") || message.contains("recovery is in progress") {
        return Some("the server is a hot standby, in recovery");
    }
    // read_only_sql_transaction: what a hot standby answers to every write, and a session
    // whose role or database sets default_transaction_read_only.
    (code == "25006").then_some(
        "a read-only transaction: default_transaction_read_only on the role, the database or \
         the session, or a hot standby",
    )
}

/// [`refuses_writes`] for a SQLite result code (extended codes included).
fn sqlite_refusal(code: Option<u32>) -> Option<&'static str> {
    // SQLITE_READONLY and its extended codes.
    code.filter(|c| c & 0xff == 8).map(|_| {
        "the SQLite file is read-only: mode=ro, the permissions of the file or its \
         directory, or a read-only mount"
    })
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

    /// A server that refuses writes is named as such: MySQL/MariaDB `read_only` or
    /// `super_read_only` (1290), read-only mode (1836), a read-only transaction (1792).
    /// Nothing else is.
    #[test]
    fn mysql_servers_that_refuse_writes_are_named() {
        for code in [1290, 1836, 1792] {
            assert!(mysql_refusal(code).is_some(), "{code}");
        }
        for code in [1205, 1213, 3572, 1062, 2013, 1040, 1146] {
            assert!(mysql_refusal(code).is_none(), "{code}");
        }
        assert!(mysql_refusal(1290).is_some_and(|c| c.contains("read_only")));
    }

    /// PostgreSQL: a read-only transaction (25006, also what a hot standby answers to every
    /// write) and a hot standby's own messages; a lock not available is not a refusal.
    #[test]
    fn postgres_servers_that_refuse_writes_are_named() {
        let read_only = pg_refusal("25006", "cannot execute INSERT in a read-only transaction");
        assert!(read_only.is_some_and(|c| c.contains("default_transaction_read_only")));
        let standby = pg_refusal("XX000", "cannot assign TransactionIds during recovery");
        assert!(standby.is_some_and(|c| c.contains("hot standby")));
        let standby = pg_refusal(
            "55000",
            "cannot acquire lock mode AccessExclusiveLock on database objects while recovery \
             is in progress",
        );
        assert!(standby.is_some_and(|c| c.contains("hot standby")));
        for code in ["55P03", "40001", "40P01", "23505", "57P01"] {
            assert!(pg_refusal(code, "some error").is_none(), "{code}");
        }
    }

    /// SQLite: SQLITE_READONLY (8) and its extended codes; BUSY, LOCKED and CANTOPEN are not.
    #[test]
    fn a_read_only_sqlite_file_is_named() {
        // SQLITE_READONLY, _RECOVERY, _CANTLOCK, _ROLLBACK, _DBMOVED, _CANTINIT, _DIRECTORY
        for code in [8, 264, 520, 776, 1032, 1288, 1544] {
            assert!(sqlite_refusal(Some(code)).is_some(), "{code}");
        }
        for code in [5, 6, 14, 517, 1] {
            assert!(sqlite_refusal(Some(code)).is_none(), "{code}");
        }
        assert!(sqlite_refusal(None).is_none());
    }

    /// A refusal is not contention, so it is not retryable: an acquisition stops at once with
    /// it instead of retrying until its deadline and taking it for a lock held by someone
    /// else. Contention is retryable.
    #[test]
    fn a_refusal_is_not_contention() {
        for code in [1290, 1836, 1792] {
            assert!(!mysql_contention(code), "{code}");
        }
        for code in [1213, 1205, 3572] {
            assert!(
                mysql_contention(code) && mysql_refusal(code).is_none(),
                "{code}"
            );
        }
        assert!(!pg_contention("25006"));
        for code in ["40001", "40P01", "55P03"] {
            assert!(
                pg_contention(code) && pg_refusal(code, "").is_none(),
                "{code}"
            );
        }
        let e = from_sqlx("mysql", "acquire", sqlx::Error::PoolTimedOut);
        assert!(e.is_retryable() && !answered_busy(&e), "{e}");
    }

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
