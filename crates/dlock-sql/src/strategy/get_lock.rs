//! get-lock (MySQL 8, MariaDB): a pinned session holds the server's named lock
//! (`GET_LOCK`); a waiter waits in `GET_LOCK` itself. No table holds the lock: the lock's
//! server-wide name is the SHA-256 of the database, the table prefix and the lock's name (64
//! hexadecimal digits, the most `GET_LOCK` takes), so two databases or two prefixes never
//! share a lock. The fencing token is a counter row per name in `<prefix>_fence`, taken by the
//! session that was granted the lock, in the same round trip as the grant; the session's
//! `wait_timeout` is the lease.

use std::sync::Arc;

use dlock_core::backend::{Deadline, later};
use dlock_core::{Error, LockKind, LockName, LockStatus, Result, async_trait};
use tokio::time::Instant;

use super::{Attempt, Grant, LockStrategy, missing_id, unusable};
use crate::Inner;
use crate::db::{Conn, query};
use crate::pinned::{Held, PinnedHold, Pinning, Release, Waits, server_seconds, server_wait};
use crate::sql::{Tables, hex};

/// The get-lock strategy of one provider.
#[derive(Debug)]
pub(crate) struct GetLock {
    sql: GetLockSql,
    pinning: Pinning,
}

/// A get-lock hold: the named lock of its session.
type GetLockHold = Held<ReleaseLock>;

/// A get-lock hold is given back with `RELEASE_LOCK`.
#[derive(Debug)]
struct ReleaseLock {
    strategy: Arc<GetLock>,
}

#[async_trait]
impl Release for ReleaseLock {
    async fn release(&self, hold: &PinnedHold) -> bool {
        let release = self.strategy.sql.release(hold.name.as_str().as_bytes());
        hold.conn.lock().await.unlock_batch(&release).await
    }
}

#[async_trait]
impl LockStrategy for GetLock {
    async fn try_lock(
        self: Arc<Self>,
        attempt: Attempt,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.lock(attempt, deadline).await
    }

    async fn describe(&self, name: &LockName) -> Result<LockStatus> {
        let err = self.pinning.inner.err("describe");
        let bytes = name.as_str().as_bytes();
        let row = query(&self.sql.describe)
            .bind(bytes)
            .bind(bytes)
            .fetch_one(&self.pinning.inner.pool)
            .await
            .map_err(err)?;
        let token = row
            .optional_int(1)
            .map_err(err)?
            .and_then(|t| u64::try_from(t).ok());
        if row.is_null(0).map_err(err)? {
            Ok(LockStatus::free(token))
        } else {
            Ok(LockStatus::held_by(LockKind::Mutex, Vec::new()).with_last_token(token))
        }
    }

    fn holder_connection_id(&self, name: &str) -> Option<u64> {
        self.pinning.holder_connection_id(name)
    }
}

impl GetLock {
    pub(crate) fn new(inner: Arc<Inner>, tables: Tables<'_>) -> Self {
        let sql = GetLockSql::new(tables);
        let pinning = Pinning::new(inner, &sql.hold_timeout);
        Self { sql, pinning }
    }

    /// Takes the named lock of `a`'s name on a session of its own, waiting until `deadline`,
    /// with its fencing token taken in the granting round trip.
    ///
    /// The hold's lease is the server's: the session's `wait_timeout`, set in the same round
    /// trip before the lock is asked for, so a holder that stops talking (paused, cut off) is
    /// disconnected and its lock freed. The first try does not wait (an uncontended lock is
    /// one round trip); the session of a try that waits is killed (from another connection)
    /// if the acquisition is dropped, so nothing it might be granted outlives it. A session
    /// whose try failed is closed, never returned to the pool: it may hold the lock.
    async fn lock(self: &Arc<Self>, a: Attempt, deadline: Deadline) -> Result<Option<Grant>> {
        let err = self.pinning.inner.err("lock");
        let mut conn = self.pinning.pin(&a.name, deadline).await?;
        let lease = server_seconds(a.ttl());
        let name = a.name.as_str().as_bytes();
        let mut first = true;
        let mut waits = Waits::default();
        loop {
            let wait = server_wait(std::mem::take(&mut first), deadline);
            let batch = self.sql.lock(name, lease, wait.unwrap_or(0));
            let mut sent = Instant::now();
            let answer = match wait {
                Some(_) => {
                    let lock = async |c: &mut Conn| c.batch(&batch).await;
                    waits.run(&self.pinning, &mut conn, lock).await?.1
                }
                None => conn.get()?.batch(&batch).await,
            };
            let row = match answer {
                Ok(rows) => rows.into_iter().next(),
                Err(e) => {
                    conn.close();
                    return Err(err(e));
                }
            };
            let Some(row) = row else {
                conn.close();
                return Err(unusable(
                    self.pinning.inner.backend,
                    "GET_LOCK's round trip answered no row".to_owned(),
                ));
            };
            let parsed = (|| Ok((row.optional_int(0)?, row.optional_int(1)?, row.int(2)?)))();
            let (got, token, session) = match parsed {
                Ok(parsed) => parsed,
                Err(e) => {
                    conn.close();
                    return Err(err(e));
                }
            };
            let session = u64::try_from(session).unwrap_or(0);
            waits.session_is(session);
            match got {
                Some(1) => {
                    let Some(token) = token.and_then(|t| u64::try_from(t).ok()) else {
                        conn.close();
                        return Err(missing_id(self.pinning.inner.backend, &a.name));
                    };
                    if wait.is_some() {
                        // The lock may have been waited for long: the client's lease runs
                        // from after the wait (the server counts idle time from there too).
                        sent = self.pinning.start_lease(&mut conn, a.ttl()).await?;
                    }
                    let fixed_at = (!a.lease.is_watchdog()).then(|| later(sent, a.ttl()));
                    let pinned = self.pinning.first_hold(conn, a, session, fixed_at)?;
                    let signal = pinned.signal.clone();
                    let hold = GetLockHold {
                        pinned,
                        how: ReleaseLock {
                            strategy: Arc::clone(self),
                        },
                    };
                    return Ok(Some(Grant {
                        hold: Arc::new(hold),
                        token,
                        sent,
                        signal: Some(signal),
                    }));
                }
                Some(0) => {
                    // A busy try put the server's default idle timeout back itself.
                    if conn.busy(deadline, None).await {
                        return Ok(None);
                    }
                }
                _ => {
                    // NULL: the wait was interrupted (`KILL QUERY`, a statement time limit
                    // the server enforces anyway); nothing is held. The session is closed all
                    // the same, and the caller may try again.
                    conn.close();
                    return Err(Error::backend_failed(
                        self.pinning.inner.backend,
                        format!(
                            "GET_LOCK was interrupted (answered NULL) for {:?}",
                            a.name.as_str()
                        ),
                        true,
                    ));
                }
            }
        }
    }
}

/// get-lock's statements. Those of an attempt and of a release are not prepared (several
/// statements in one round trip), so the name goes in as hexadecimal digits.
#[derive(Debug, Clone)]
pub(crate) struct GetLockSql {
    /// The table prefix (checked: it goes into the statements as it is).
    prefix: String,
    /// MariaDB rather than MySQL: how a statement lifts the server's time limit.
    mariadb: bool,
    /// The server-side lease of a held lock (`?`: seconds).
    hold_timeout: String,
    /// The session back to the server's default idle timeout.
    reset: String,
    /// Who holds a name's lock (its connection id, NULL if free) and its last token (`?`:
    /// name, name).
    describe: String,
}

impl GetLockSql {
    pub(crate) fn new(s: Tables<'_>) -> Self {
        let t = s.prefix;
        Self {
            prefix: t.to_owned(),
            mariadb: s.mariadb,
            hold_timeout: "SET SESSION wait_timeout = ?".to_owned(),
            reset: "SET SESSION wait_timeout = DEFAULT".to_owned(),
            describe: format!(
                "SELECT IS_USED_LOCK({}), (SELECT token FROM {t}_fence WHERE name = ?)",
                Self::key(t, "?")
            ),
        }
    }

    /// The server-wide name of the lock of the name that `name` (an SQL expression) gives:
    /// its SHA-256, with the database and the prefix, in 64 hexadecimal digits. Every part is
    /// bytes: a name need not be valid in the connection's character set. The database and
    /// the prefix are folded to lower case, because a server with `lower_case_table_names`
    /// gives two spellings the same tables; folding can only make two sets of tables share
    /// locks, never one set have two.
    fn key(prefix: &str, name: &str) -> String {
        let prefix = prefix.to_ascii_lowercase();
        format!(
            "SHA2(CONCAT_WS(X'00', CAST(LOWER(DATABASE()) AS BINARY), CAST('{prefix}' AS BINARY), \
             CAST({name} AS BINARY)), 256)"
        )
    }

    /// One try at `name`'s lock, in one round trip. A try that waits (`wait` seconds) first
    /// makes the session's idle timeout the hold's lease (`lease` seconds), so that a waiter
    /// frozen or cut off when it is granted is disconnected after its lease. `GET_LOCK` then
    /// waits, free of the server's statement time limit (the wait is the caller's); if it
    /// granted, the same session takes the name's next fencing token and commits it (the
    /// lock pool's sessions run with autocommit off). Last, the idle timeout becomes the
    /// lease if granted and the server's default if not, so a busy session goes back to the
    /// pool as it came. It answers (1 if granted, 0 if busy, NULL if interrupted; the token,
    /// or NULL; the session's id).
    pub(crate) fn lock(&self, name: &[u8], lease: i64, wait: i64) -> String {
        let (t, hex) = (&self.prefix, hex(name));
        let key = Self::key(t, &format!("X'{hex}'"));
        let lease_first = if wait > 0 {
            format!("SET SESSION wait_timeout = {lease}; ")
        } else {
            String::new()
        };
        let get_lock = format!("SELECT GET_LOCK({key}, {wait}) INTO @dlock_got");
        let get_lock = if self.mariadb {
            format!("SET STATEMENT max_statement_time = 0 FOR {get_lock}")
        } else {
            get_lock.replacen("SELECT ", "SELECT /*+ MAX_EXECUTION_TIME(0) */ ", 1)
        };
        format!(
            "{lease_first}{get_lock}; \
             INSERT INTO {t}_fence (name, token) SELECT X'{hex}', LAST_INSERT_ID(1) FROM DUAL \
             WHERE @dlock_got = 1 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1); \
             COMMIT AND NO CHAIN NO RELEASE; \
             SET SESSION wait_timeout = IF(@dlock_got = 1, {lease}, @@GLOBAL.wait_timeout); \
             SELECT @dlock_got, IF(@dlock_got = 1, LAST_INSERT_ID(), NULL), CONNECTION_ID()"
        )
    }

    /// The release of `name`'s lock, in one round trip: the session's idle timeout back to
    /// the server's default, then `RELEASE_LOCK` (1 if this session held the lock).
    pub(crate) fn release(&self, name: &[u8]) -> String {
        let key = Self::key(&self.prefix, &format!("X'{}'", hex(name)));
        format!("{}; SELECT RELEASE_LOCK({key})", self.reset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dialect;

    /// The name goes into the unprepared statements as hexadecimal digits only, and the
    /// lock's server-wide name includes the database and the prefix.
    #[test]
    fn a_try_spells_the_name_in_hex_digits_and_lifts_the_time_limit() {
        let sql = GetLockSql::new(Tables {
            dialect: Dialect::MySql,
            prefix: "dlock_t",
            mariadb: true,
            origin: "o",
        });
        let name = "a'; DROP TABLE t; -- \\ \" é";
        let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
        let key = format!(
            "SHA2(CONCAT_WS(X'00', CAST(LOWER(DATABASE()) AS BINARY), CAST('dlock_t' AS BINARY), \
             CAST(X'{hex}' AS BINARY)), 256)"
        );
        let lock = sql.lock(name.as_bytes(), 30, 0);
        assert!(
            lock.starts_with("SET STATEMENT max_statement_time = 0 FOR SELECT GET_LOCK("),
            "{lock}"
        );
        assert!(lock.contains(&format!("GET_LOCK({key}, 0)")), "{lock}");
        assert!(
            lock.contains("wait_timeout = IF(@dlock_got = 1, 30, @@GLOBAL.wait_timeout)"),
            "{lock}"
        );
        let waiting = sql.lock(name.as_bytes(), 30, 5);
        assert!(
            waiting.starts_with("SET SESSION wait_timeout = 30; SET STATEMENT"),
            "{waiting}"
        );
        assert!(
            lock.contains(&format!("SELECT X'{hex}', LAST_INSERT_ID(1)")),
            "{lock}"
        );
        assert!(!lock.contains(name), "{lock}");
        assert_eq!(
            sql.release(name.as_bytes()),
            format!("SET SESSION wait_timeout = DEFAULT; SELECT RELEASE_LOCK({key})")
        );
    }
}
