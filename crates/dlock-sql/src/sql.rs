//! Every statement dlock runs, per dialect, grouped by the strategy that runs it: each
//! strategy owns its group ([`UniqueInsertSql`], [`OptimisticSql`], [`RowLockSql`],
//! [`AdvisorySql`]), the pinned strategies share [`SessionSql`], and the provider's set-up
//! runs [`SchemaSql`](crate::schema::SchemaSql). Lock names and owners are bound parameters; only the validated table
//! prefix is formatted in, with one exception: the for-update first try
//! ([`RowLockSql::lock_row_first_try`]) sends several statements in one round trip, which
//! cannot take parameters, so the name goes in as hexadecimal digits (and the lease as a
//! number), which no name can break out of.

use std::time::Duration;

use crate::config::Dialect;

/// What the statements of one provider are written for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tables<'a> {
    /// The database family.
    pub(crate) dialect: Dialect,
    /// The prefix of dlock's tables (checked: it goes into the statements as it is).
    pub(crate) prefix: &'a str,
    /// MariaDB rather than MySQL (MySQL dialect only): picks MariaDB's spelling where MySQL's
    /// differs.
    pub(crate) mariadb: bool,
    /// Where this process's releases come from, named in their notifications
    /// ([`crate::wait::registry::origin`]).
    pub(crate) origin: &'a str,
}

/// `sql` as `dialect` takes it: PostgreSQL numbers its placeholders (`?` becomes `$1`, `$2`,
/// …; no statement here has a `?` inside a string literal).
pub(crate) fn numbered(dialect: Dialect, sql: String) -> String {
    if dialect != Dialect::Postgres {
        return sql;
    }
    let mut out = String::with_capacity(sql.len() + sql.len() / 2);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// A renewal of many holds on one table in one statement: the UPDATE up to its list of holds
/// (`?`: the lease in ms, then per hold the columns of its row), and the SELECT of those of
/// the holds that are (still) their owners' (`?`: per hold the columns; it answers the
/// columns).
#[derive(Debug, Clone)]
pub(crate) struct RenewMany {
    renew_head: String,
    check_head: String,
    /// The columns of a hold's row: name and owner, and the version on the optimistic table.
    columns: &'static str,
    dialect: Dialect,
}

impl RenewMany {
    fn new(s: &Tables<'_>, table: &str, columns: &'static str) -> Self {
        let (t, now) = (s.prefix, s.now());
        Self {
            renew_head: format!(
                "UPDATE {t}_{table} SET expires_at = {now} + ? WHERE ({columns}) IN ("
            ),
            check_head: format!("SELECT {columns} FROM {t}_{table} WHERE ({columns}) IN ("),
            columns,
            dialect: s.dialect,
        }
    }

    /// The renewal of `holds` holds.
    pub(crate) fn renew(&self, holds: usize) -> String {
        self.with_holds(&self.renew_head, holds)
    }

    /// The check of `holds` holds.
    pub(crate) fn check(&self, holds: usize) -> String {
        self.with_holds(&self.check_head, holds)
    }

    fn with_holds(&self, head: &str, holds: usize) -> String {
        let width = self.columns.split(',').count();
        let tuple = format!("({})", vec!["?"; width].join(", "));
        let mut sql = head.to_owned();
        sql.push_str(&vec![tuple; holds].join(", "));
        sql.push(')');
        numbered(self.dialect, sql)
    }
}

/// The pruning of a row strategy's table: the look for rows whose lease has been over for a
/// while (`?`: that while in ms; it answers their names, at most [`PRUNE_AT_ONCE`]), and the
/// `DELETE` of those of them still so (`?`: the while, then the names).
#[derive(Debug, Clone)]
pub(crate) struct PruneSql {
    /// The look.
    pub(crate) select: String,
    delete_head: String,
    dialect: Dialect,
}

/// The most names one pruning statement names.
pub(crate) const PRUNE_AT_ONCE: usize = 500;

impl PruneSql {
    pub(crate) fn new(s: &Tables<'_>, table: &str) -> Self {
        let (t, now) = (s.prefix, s.now());
        Self {
            select: s.stmt(format!(
                "SELECT name FROM {t}_{table} WHERE expires_at <= {now} - ? LIMIT {PRUNE_AT_ONCE}"
            )),
            // The condition again: a name claimed since the look keeps its row (PostgreSQL
            // checks it on the row's newest version, InnoDB on the row it locks).
            delete_head: format!(
                "DELETE FROM {t}_{table} WHERE expires_at <= {now} - ? AND name IN ("
            ),
            dialect: s.dialect,
        }
    }

    /// The `DELETE` of `names` names.
    pub(crate) fn delete(&self, names: usize) -> String {
        let mut sql = self.delete_head.clone();
        sql.push_str(&vec!["?"; names].join(", "));
        sql.push(')');
        numbered(self.dialect, sql)
    }
}

impl Tables<'_> {
    /// `sql` as the dialect takes it: PostgreSQL numbers its placeholders (`?` becomes `$1`,
    /// `$2`, …; no statement here has a `?` inside a string literal).
    pub(crate) fn stmt(&self, sql: impl Into<String>) -> String {
        numbered(self.dialect, sql.into())
    }

    /// The database clock, in milliseconds since the epoch.
    fn now(&self) -> &'static str {
        match self.dialect {
            Dialect::MySql => "CAST(ROUND(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000) AS SIGNED)",
            // julianday() keeps SQLite's clock to the millisecond (unixepoch('subsec') would
            // need SQLite 3.42, newer than many systems' libsqlite3).
            Dialect::Sqlite => {
                "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
            }
            // clock_timestamp(), not now(): now() is the start of the transaction.
            Dialect::Postgres => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
        }
    }

    /// An INSERT that does nothing where the key exists: the words before the table, and
    /// those after the values.
    pub(crate) fn insert_ignore(&self) -> (&'static str, &'static str) {
        match self.dialect {
            Dialect::MySql => ("INSERT IGNORE INTO", ""),
            Dialect::Sqlite => ("INSERT OR IGNORE INTO", ""),
            Dialect::Postgres => ("INSERT INTO", " ON CONFLICT DO NOTHING"),
        }
    }

    /// On PostgreSQL, the statement that announces a release of a name (`?`: the name) to the
    /// waiters of other processes: a `NOTIFY` of the provider's channel with the name in hex
    /// (any name, in any database encoding), then `/` and the release's origin (hex digits).
    /// It is a statement of its own, sent after the release committed and committed without
    /// waiting for its flush: a release never holds PostgreSQL's cluster-wide notify lock
    /// through its own commit, and never fails because the notify queue is full (a listener
    /// that stopped reading holds it back); an announcement lost costs a waiter one poll.
    pub(crate) fn announcement(&self) -> Option<String> {
        let (t, origin) = (self.prefix, self.origin);
        (self.dialect == Dialect::Postgres).then(|| {
            format!(
                "SELECT set_config('synchronous_commit', 'off', true), \
                 pg_notify('{t}_release', encode($1, 'hex') || '/{origin}')"
            )
        })
    }
}

/// unique-insert: one row per held lock.
#[derive(Debug, Clone)]
pub(crate) struct UniqueInsertSql {
    /// Inserts the hold (`?`: name, owner, lease in ms); on PostgreSQL and SQLite returns its
    /// id, and no row when the name is held (MySQL gives the id as the last insert id, and a
    /// held name as a duplicate-key error).
    pub(crate) insert_hold: String,
    /// Takes an expired hold over (`?`: owner, lease in ms, name).
    pub(crate) take_over_hold: String,
    /// The id and takeovers of an owner's hold (`?`: name, owner).
    pub(crate) select_hold_token: String,
    /// Deletes an owner's hold (`?`: name, owner).
    pub(crate) delete_hold: String,
    /// Renews an owner's hold (`?`: lease in ms, name, owner).
    pub(crate) renew_hold: String,
    /// Renews many owners' holds at once (per hold: name, owner).
    pub(crate) renew_holds: RenewMany,
    /// Deletes the rows of holders that died a while ago.
    pub(crate) prune_holds: PruneSql,
    /// The owner, id, takeovers and milliseconds left of a name's hold (`?`: name).
    pub(crate) describe_hold: String,
}

impl UniqueInsertSql {
    pub(crate) fn new(s: Tables<'_>) -> Self {
        let (t, now) = (s.prefix, s.now());
        Self {
            insert_hold: s.stmt(format!(
                "INSERT INTO {t}_holds (name, owner, holds, takeovers, expires_at) \
                 VALUES (?, ?, 1, 0, {now} + ?){}",
                match s.dialect {
                    Dialect::MySql => "",
                    // A held name inserts nothing: on PostgreSQL a failing INSERT would be a
                    // server ERROR naming the lock in the log, an aborted transaction and a
                    // dead tuple per poll of every waiter.
                    Dialect::Sqlite | Dialect::Postgres => {
                        " ON CONFLICT (name) DO NOTHING RETURNING id"
                    }
                }
            )),
            take_over_hold: s.stmt(format!(
                "UPDATE {t}_holds SET owner = ?, holds = 1, takeovers = takeovers + 1, \
                 expires_at = {now} + ? WHERE name = ? AND expires_at <= {now}"
            )),
            select_hold_token: s.stmt(format!(
                "SELECT id, takeovers FROM {t}_holds WHERE name = ? AND owner = ?"
            )),
            delete_hold: s.stmt(format!(
                "DELETE FROM {t}_holds WHERE name = ? AND owner = ?"
            )),
            renew_hold: s.stmt(format!(
                "UPDATE {t}_holds SET expires_at = {now} + ? WHERE name = ? AND owner = ?"
            )),
            renew_holds: RenewMany::new(&s, "holds", "name, owner"),
            prune_holds: PruneSql::new(&s, "holds"),
            describe_hold: s.stmt(format!(
                "SELECT owner, id, takeovers, expires_at - {now} FROM {t}_holds WHERE name = ?"
            )),
        }
    }
}

/// optimistic: one row per name that stays, claimed by its version.
#[derive(Debug, Clone)]
pub(crate) struct OptimisticSql {
    /// Claims the version after one last seen (`?`: owner, lease in ms, name, version); on
    /// PostgreSQL and SQLite returns the new version (MySQL gives it as the last insert id).
    pub(crate) claim_version: String,
    /// The version of a name (`?`: name).
    pub(crate) select_version: String,
    /// Creates a name's row at a version (`?`: name, version), nothing if it exists.
    pub(crate) insert_version: String,
    /// Frees an owner's claim of a version (`?`: name, owner,
    /// version).
    pub(crate) release_version: String,
    /// Frees an owner's claim of any version (`?`: name, owner).
    pub(crate) release_version_by_owner: String,
    /// Renews an owner's claim (`?`: lease in ms, name, owner, version).
    pub(crate) renew_version: String,
    /// Renews many owners' claims at once (per hold: name, owner, version).
    pub(crate) renew_versions: RenewMany,
    /// Deletes the rows of names nobody has held for a while.
    pub(crate) prune_versions: PruneSql,
    /// A new seed: a number never handed out before for these tables (an AUTO_INCREMENT
    /// row, deleted again at once; the counter is kept across deletes and restarts).
    pub(crate) new_seed: String,
    /// Deletes a seed's row (`?`: the seed).
    pub(crate) drop_seed: String,
    /// Moves a free row to the versions of a new seed (`?`: the new version, name, version).
    pub(crate) reseed_version: String,
    /// Whether the row is at version `?` and free (`?`: name, version).
    pub(crate) version_free: String,
    /// The highest version of the tables (0 if none).
    pub(crate) max_version: String,
    /// The owner, version and milliseconds left of a name's row (`?`: name).
    pub(crate) describe_version: String,
}

impl OptimisticSql {
    pub(crate) fn new(s: Tables<'_>) -> Self {
        let (t, now) = (s.prefix, s.now());
        let (insert_ignore, ignore_suffix) = s.insert_ignore();
        let claim_version = match s.dialect {
            // LAST_INSERT_ID(expr) hands the new version back with the UPDATE's answer.
            Dialect::MySql => format!(
                "UPDATE {t}_versions SET owner = ?, holds = 1, \
                 version = LAST_INSERT_ID(version + 1), expires_at = {now} + ? \
                 WHERE name = ? AND version = ? AND (owner = '' OR expires_at <= {now})"
            ),
            Dialect::Sqlite | Dialect::Postgres => format!(
                "UPDATE {t}_versions SET owner = ?, holds = 1, version = version + 1, \
                 expires_at = {now} + ? \
                 WHERE name = ? AND version = ? AND (owner = '' OR expires_at <= {now}) \
                 RETURNING version"
            ),
        };
        Self {
            claim_version: s.stmt(claim_version),
            select_version: s.stmt(format!("SELECT version FROM {t}_versions WHERE name = ?")),
            // A free row's `expires_at` is when it was made or last freed: how long it has
            // been idle, for its pruning.
            insert_version: s.stmt(format!(
                "{insert_ignore} {t}_versions (name, version, expires_at) \
                 VALUES (?, ?, {now}){ignore_suffix}"
            )),
            release_version: s.stmt(format!(
                "UPDATE {t}_versions SET owner = '', holds = 0, expires_at = {now} \
                 WHERE name = ? AND owner = ? AND version = ?"
            )),
            release_version_by_owner: s.stmt(format!(
                "UPDATE {t}_versions SET owner = '', holds = 0, expires_at = {now} \
                 WHERE name = ? AND owner = ?"
            )),
            renew_version: s.stmt(format!(
                "UPDATE {t}_versions SET expires_at = {now} + ? \
                 WHERE name = ? AND owner = ? AND version = ?"
            )),
            renew_versions: RenewMany::new(&s, "versions", "name, owner, version"),
            prune_versions: PruneSql::new(&s, "versions"),
            new_seed: match s.dialect {
                Dialect::MySql => format!("INSERT INTO {t}_seeds () VALUES ()"),
                Dialect::Sqlite | Dialect::Postgres => {
                    format!("INSERT INTO {t}_seeds DEFAULT VALUES RETURNING id")
                }
            },
            drop_seed: s.stmt(format!("DELETE FROM {t}_seeds WHERE id = ?")),
            reseed_version: s.stmt(format!(
                "UPDATE {t}_versions SET version = ? \
                 WHERE name = ? AND version = ? AND (owner = '' OR expires_at <= {now})"
            )),
            version_free: s.stmt(format!(
                "SELECT 1 FROM {t}_versions \
                 WHERE name = ? AND version = ? AND (owner = '' OR expires_at <= {now})"
            )),
            max_version: format!("SELECT COALESCE(MAX(version), 0) FROM {t}_versions"),
            describe_version: s.stmt(format!(
                "SELECT owner, version, expires_at - {now} FROM {t}_versions WHERE name = ?"
            )),
        }
    }
}

/// The session of a pinned connection (for-update, advisory): its id on the server, and the
/// end of a session from another connection.
#[derive(Debug, Clone)]
pub(crate) struct SessionSql {
    dialect: Dialect,
    /// The session's id on the server (MySQL's connection id, PostgreSQL's backend pid).
    pub(crate) connection_id: String,
    /// MySQL: whether a connection is still there (`?`: its id), to wait for a killed one to
    /// end. PostgreSQL's kill waits itself.
    pub(crate) connection_left: Option<String>,
}

/// How long a kill of a cancelled lock wait's session waits for the session to end.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(2);

impl SessionSql {
    pub(crate) fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            connection_id: format!("SELECT {}", session_id(dialect)),
            connection_left: (dialect == Dialect::MySql).then(|| {
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?".to_owned()
            }),
        }
    }

    /// Ends server connection `id`, whatever it is doing (a cancelled lock wait's session,
    /// which its client closes anyway). Not only its statement: a statement's cancel that
    /// reaches the server before the statement itself (the client sent it, then dropped the
    /// wait) finds the session idle and is lost, and the statement then waits its whole lock
    /// timeout on a session nobody reads. Connection ids are not reused that soon (MySQL
    /// counts up; a PostgreSQL pid comes back only after the kernel's pid range wraps).
    /// PostgreSQL's waits up to [`KILL_WAIT`] for the session to end; MySQL's returns at
    /// once, and [`connection_left`](Self::connection_left) tells when it ended.
    pub(crate) fn kill_connection(&self, id: u64) -> String {
        match self.dialect {
            Dialect::Postgres => {
                format!(
                    "SELECT pg_terminate_backend({id}, {})",
                    KILL_WAIT.as_millis()
                )
            }
            _ => format!("KILL CONNECTION {id}"),
        }
    }
}

/// The expression of a session's id on the server.
fn session_id(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "pg_backend_pid()::BIGINT",
        _ => "CONNECTION_ID()",
    }
}

/// The digits of a name in a statement that is not prepared ([`hex`]).
const HEX: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lower-case hexadecimal digits, for a name in a statement that cannot take
/// parameters (several statements in one round trip): no name (quotes, backslashes, comment
/// marks, any byte) can end a literal spelled this way.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(2 * bytes.len());
    for b in bytes {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    hex
}

/// for-update on MySQL/MariaDB: the row of a name, locked by a transaction, and its fencing
/// tokens. (for-update on PostgreSQL is held with [`AdvisorySql`]'s statements.)
#[derive(Debug, Clone)]
pub(crate) struct RowLockSql {
    /// MariaDB rather than MySQL, for a lock in the caller's transaction.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) mariadb: bool,
    /// Creates a name's row (`?`: name), nothing if it exists.
    pub(crate) insert_row: String,
    /// Whether a name's row exists, read without locking (`?`: name).
    pub(crate) row_exists: String,
    /// Locks a name's row, waiting (`?`: name): the session's id.
    pub(crate) lock_row: String,
    /// As `lock_row`, without waiting.
    pub(crate) lock_row_nowait: String,
    /// Sets the wait and the server-side lease before a waiting try (`?`: wait in seconds,
    /// lease in seconds).
    pub(crate) lock_wait_timeout: String,
    /// The server-side lease of a held for-update row (`?`: seconds).
    pub(crate) hold_timeout: String,
    /// What gives a for-update connection the server's default idle timeout back before it
    /// returns to the pool.
    pub(crate) reset_hold_timeout: String,
    /// The next fencing token of a name, committed on its own (`?`: name).
    pub(crate) next_fence: String,
    /// The last fencing token of a name (`?`: name).
    pub(crate) describe_fence: String,
    /// Whether the row is locked, learned with a shared lock that does not wait (it fails at
    /// once if a holder has the row), never by taking the lock (`?`: name).
    pub(crate) row_locked: String,
}

impl RowLockSql {
    /// `lock_row` waiting at most `seconds` for the row, set for the statement alone
    /// (MariaDB's `SET STATEMENT`, MySQL's `SET_VAR` hint), so the session's own
    /// `innodb_lock_wait_timeout` is never changed. On MariaDB no `max_statement_time` of the
    /// session or the user ends the wait sooner.
    #[cfg(feature = "mysql")]
    pub(crate) fn lock_row_within(&self, seconds: i64) -> String {
        let seconds = seconds.max(1);
        if self.mariadb {
            format!(
                "SET STATEMENT innodb_lock_wait_timeout = {seconds}, max_statement_time = 0 \
                 FOR {}",
                self.lock_row
            )
        } else {
            let hint = format!("SELECT /*+ SET_VAR(innodb_lock_wait_timeout = {seconds}) */ ");
            self.lock_row.replacen("SELECT ", &hint, 1)
        }
    }

    /// The statements on MySQL/MariaDB (`s`'s dialect is not asked: for-update rows are
    /// MySQL's alone).
    pub(crate) fn new(s: Tables<'_>) -> Self {
        let t = s.prefix;
        let share_nowait = if s.mariadb {
            "LOCK IN SHARE MODE NOWAIT"
        } else {
            "FOR SHARE NOWAIT"
        };
        Self {
            mariadb: s.mariadb,
            // A duplicate key waits for a shared lock on the row, which a holder's
            // `FOR UPDATE` keeps: at most a second here (an answer of "busy"), whatever the
            // pool's sessions say, so that racers creating a new name's row answer within
            // the 2 s a call may run past its wait.
            insert_row: if s.mariadb {
                format!(
                    "SET STATEMENT innodb_lock_wait_timeout = 1 FOR \
                     INSERT IGNORE INTO {t}_rows (name) VALUES (?)"
                )
            } else {
                format!(
                    "INSERT /*+ SET_VAR(innodb_lock_wait_timeout = 1) */ IGNORE INTO \
                     {t}_rows (name) VALUES (?)"
                )
            },
            row_exists: format!("SELECT 1 FROM {t}_rows WHERE name = ?"),
            lock_row: format!("SELECT CONNECTION_ID() FROM {t}_rows WHERE name = ? FOR UPDATE"),
            lock_row_nowait: format!(
                "SELECT CONNECTION_ID() FROM {t}_rows WHERE name = ? FOR UPDATE NOWAIT"
            ),
            lock_wait_timeout: "SET SESSION innodb_lock_wait_timeout = ?, wait_timeout = ?"
                .to_owned(),
            // The server-side lease of a for-update hold: the server closes a connection idle
            // this long, which rolls back and frees the row (a paused or cut-off holder).
            hold_timeout: "SET SESSION wait_timeout = ?".to_owned(),
            reset_hold_timeout: "SET SESSION wait_timeout = DEFAULT".to_owned(),
            next_fence: format!(
                "INSERT INTO {t}_fence (name, token) VALUES (?, LAST_INSERT_ID(1)) \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)"
            ),
            describe_fence: format!("SELECT token FROM {t}_fence WHERE name = ?"),
            row_locked: format!("SELECT 1 FROM {t}_rows WHERE name = ? {share_nowait}"),
        }
    }

    /// The for-update first try in one round trip: the hold's server-side lease of
    /// `lease_secs` (it stays on the session until `reset_hold_timeout`; the lock pool's
    /// connections open a transaction with every statement), then `lock_row_nowait` (the same
    /// answer). The statements cannot be prepared together, so the name goes in as
    /// hexadecimal digits.
    pub(crate) fn lock_row_first_try(&self, name: &[u8], lease_secs: i64) -> String {
        let lock = self
            .lock_row_nowait
            .replacen('?', &format!("X'{}'", hex(name)), 1);
        format!("SET SESSION wait_timeout = {lease_secs}; {lock}")
    }
}

/// The first key of dlock's PostgreSQL advisory locks (`pg_advisory_lock(space, key)`): the
/// two-integer form, in a space of its own ("dloc"), apart from the single-bigint keys that
/// applications and tools (sqlx's migrations, for one) use.
pub(crate) const ADVISORY_SPACE: i32 = 0x646c_6f63;

/// The idle_session_timeout a pinned PostgreSQL session goes back to when its hold ends: its
/// own (the role's, the database's or the URL's), which the lock pool records when it
/// connects; 0 (none) on a session that did not record one, or whose record a `RESET ALL` or
/// `DISCARD ALL` emptied.
const IDLE_SESSION_DEFAULT: &str =
    "COALESCE(NULLIF(current_setting('dlock.idle_session_timeout', true), ''), '0')";

/// The two modes of a PostgreSQL advisory lock: a mutex and a read-write lock's write side
/// take it exclusive, a read side shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AdvisoryMode {
    Exclusive,
    Shared,
}

impl AdvisoryMode {
    /// The index of the mode's statement in the per-mode arrays of [`AdvisorySql`].
    pub(crate) const fn index(self) -> usize {
        match self {
            Self::Exclusive => 0,
            Self::Shared => 1,
        }
    }

    /// The suffix of the mode's advisory lock functions (`pg_advisory_lock_shared`).
    const fn suffix(self) -> &'static str {
        match self {
            Self::Exclusive => "",
            Self::Shared => "_shared",
        }
    }

    /// A statement for each mode, in [`index`](Self::index) order.
    fn both(statement: impl Fn(&str) -> String) -> [String; 2] {
        [
            statement(Self::Exclusive.suffix()),
            statement(Self::Shared.suffix()),
        ]
    }
}

/// advisory (PostgreSQL): a session's advisory lock on the key a name is given once.
#[derive(Debug, Clone)]
pub(crate) struct AdvisorySql {
    /// The key of a name (`?`: name).
    pub(crate) key: String,
    /// Gives a name its key if it has none, its token counter starting at the name's last
    /// for-update token (`?`: name, twice): tables that served for-update as row locks kept
    /// their tokens in `<t>_fence`, and a token must never go back.
    pub(crate) new_key: String,
    /// Tries the lock without waiting (`$1`: key, `$2`: lease in seconds); if granted, in
    /// the same statement, takes the next fencing token and sets the server-side lease:
    /// (token or NULL, lease set or NULL, the backend's pid). Per [`AdvisoryMode`].
    pub(crate) try_lock: [String; 2],
    /// Sets the wait and the server-side lease before a waiting try (`?`: wait, lease).
    pub(crate) wait: String,
    /// Waits for the lock (`$1`: key) and takes the next fencing token in the same
    /// statement: (token or NULL, the backend's pid). Per [`AdvisoryMode`].
    pub(crate) lock: [String; 2],
    /// Releases the lock (`?`: key) and puts the session back as the pool gave it: whether
    /// this session held the lock. Per [`AdvisoryMode`].
    pub(crate) unlock: [String; 2],
    /// Releases the lock (`?`: key) and leaves the session as it is, for a session that
    /// still holds another lock of the same name (a downgraded read beside its write):
    /// whether this session held the lock. Per [`AdvisoryMode`].
    pub(crate) unlock_one: [String; 2],
    /// Sets how long a statement of a session may wait for a lock (`?`: milliseconds).
    pub(crate) lock_timeout: String,
    /// The server-side lease of a held advisory lock (`?`: seconds).
    pub(crate) hold_timeout: String,
    /// The session back to what the pool gave (no server-side lease, the pool's lock wait).
    pub(crate) reset: String,
    /// How many locks are held on the key (`?`: key), and how many of them are shared.
    pub(crate) holders: String,
    /// The key's last token (`?`: name).
    pub(crate) token: String,
    /// Takes the next fencing token of a key (`?`: key) on its own, for a lock in the
    /// caller's transaction: (token).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) next_token: String,
    /// Waits for the key's lock in the caller's transaction, until its `lock_timeout` (`?`:
    /// key).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) xact_lock: String,
    /// Tries the key's lock in the caller's transaction without waiting (`?`: key): (granted).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) try_xact_lock: String,
}

impl AdvisorySql {
    pub(crate) fn new(s: Tables<'_>) -> Self {
        let t = s.prefix;
        Self {
            key: s.stmt(format!("SELECT id FROM {t}_names WHERE name = ?")),
            new_key: s.stmt(format!(
                "INSERT INTO {t}_names (name, token) \
                 VALUES (?, COALESCE((SELECT token FROM {t}_fence WHERE name = ?), 0)) \
                 ON CONFLICT (name) DO NOTHING"
            )),
            // The token is taken in the granting statement, by the session that holds the
            // lock: a token is never issued to a session that does not hold it (for-update
            // needs a confirmation after its fence for that), and an uncontended acquire is
            // one round trip.
            try_lock: AdvisoryMode::both(|m| {
                format!(
                    "WITH g AS MATERIALIZED \
                 (SELECT pg_try_advisory_lock{m}({ADVISORY_SPACE}, $1::INTEGER) AS got), \
                 f AS (UPDATE {t}_names SET token = token + 1 \
                 WHERE id = $1::INTEGER AND (SELECT got FROM g) RETURNING token) \
                 SELECT (SELECT token FROM f), \
                 CASE WHEN (SELECT got FROM g) THEN set_config('idle_session_timeout', \
                 LEAST($2::BIGINT * 1000, 2147483647)::TEXT, false) END, \
                 pg_backend_pid()::BIGINT"
                )
            }),
            wait: s.stmt(
                "SELECT set_config('lock_timeout', \
                 LEAST(?::BIGINT * 1000, 2147483647)::TEXT, false), \
                 set_config('idle_session_timeout', \
                 LEAST(?::BIGINT * 1000, 2147483647)::TEXT, false)",
            ),
            lock: AdvisoryMode::both(|m| {
                format!(
                    "WITH g AS MATERIALIZED \
                 (SELECT pg_advisory_lock{m}({ADVISORY_SPACE}, $1::INTEGER)::TEXT AS got), \
                 f AS (UPDATE {t}_names SET token = token + 1 \
                 WHERE id = $1::INTEGER AND EXISTS (SELECT 1 FROM g) RETURNING token) \
                 SELECT (SELECT token FROM f), pg_backend_pid()::BIGINT"
                )
            }),
            unlock: AdvisoryMode::both(|m| {
                s.stmt(format!(
                    "SELECT pg_advisory_unlock{m}({ADVISORY_SPACE}, ?::INTEGER)::INTEGER, \
                 pg_advisory_unlock_all()::TEXT, \
                 set_config('idle_session_timeout', {IDLE_SESSION_DEFAULT}, false), \
                 set_config('lock_timeout', '5s', false)"
                ))
            }),
            unlock_one: AdvisoryMode::both(|m| {
                s.stmt(format!(
                    "SELECT pg_advisory_unlock{m}({ADVISORY_SPACE}, ?::INTEGER)::INTEGER"
                ))
            }),
            lock_timeout: s.stmt(
                "SELECT set_config('lock_timeout', \
                 LEAST(?::BIGINT, 2147483647)::TEXT, false)",
            ),
            hold_timeout: s.stmt(
                "SELECT set_config('idle_session_timeout', \
                 LEAST(?::BIGINT * 1000, 2147483647)::TEXT, false)",
            ),
            // unlock_all: a session of the lock pool goes back to it holding nothing, whatever
            // a failed statement may have left.
            reset: format!(
                "SELECT pg_advisory_unlock_all()::TEXT, \
                 set_config('idle_session_timeout', {IDLE_SESSION_DEFAULT}, false), \
                 set_config('lock_timeout', '5s', false)"
            ),
            holders: s.stmt(format!(
                "SELECT COUNT(*), COUNT(*) FILTER (WHERE mode = 'ShareLock') \
                 FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND classid = {ADVISORY_SPACE} AND objid = (?::INTEGER)::OID AND objsubid = 2 \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )),
            token: s.stmt(format!("SELECT token FROM {t}_names WHERE name = ?")),
            next_token: s.stmt(format!(
                "UPDATE {t}_names SET token = token + 1 WHERE id = ?::INTEGER RETURNING token"
            )),
            xact_lock: s.stmt(format!(
                "SELECT pg_advisory_xact_lock({ADVISORY_SPACE}, ?::INTEGER)::TEXT"
            )),
            try_xact_lock: s.stmt(format!(
                "SELECT pg_try_advisory_xact_lock({ADVISORY_SPACE}, ?::INTEGER)::INTEGER"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(dialect: Dialect, mariadb: bool) -> Tables<'static> {
        Tables {
            dialect,
            prefix: "dlock_t",
            mariadb,
            origin: "o",
        }
    }

    /// The for-update first try is not prepared: the name goes in as hexadecimal digits, so
    /// no name (quotes, backslashes, comment marks, any byte) can end its literal.
    #[test]
    fn a_first_try_spells_the_name_in_hex_digits() {
        let name = "a'; DROP TABLE t; -- \\ \" é";
        let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
        let my = RowLockSql::new(tables(Dialect::MySql, true));
        assert_eq!(
            my.lock_row_first_try(name.as_bytes(), 31_536_000),
            format!(
                "SET SESSION wait_timeout = 31536000; SELECT CONNECTION_ID() \
                 FROM dlock_t_rows WHERE name = X'{hex}' FOR UPDATE NOWAIT"
            )
        );
    }
}
