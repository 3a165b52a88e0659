//! Every statement dlock runs, per dialect. Lock names and owners are bound parameters; only
//! the validated table prefix is formatted in, with one exception: the for-update first try
//! ([`Statements::lock_row_first_try`]) sends several statements in one round trip, which
//! cannot take parameters, so the name goes in as hexadecimal digits (and the lease as a
//! number), which no name can break out of.

use crate::config::Dialect;

/// The DDL and statements of one provider.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) dialect: Dialect,
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
    /// A new seed: a number never handed out before for these tables (an AUTO_INCREMENT
    /// row, deleted again at once; the counter is kept across deletes and restarts).
    pub(crate) new_seed: String,
    pub(crate) drop_seed: String,
    /// Moves a free row to the versions of a new seed (`?`: the new version).
    pub(crate) reseed_version: String,
    /// Whether the row is at version `?` and free (`?`: name, version).
    pub(crate) version_free: String,
    /// The highest version of the tables (0 if none).
    pub(crate) max_version: String,
    /// MariaDB rather than MySQL (MySQL dialect only).
    pub(crate) mariadb: bool,
    // advisory (PostgreSQL)
    /// The key of a name (`?`: name).
    pub(crate) advisory_key: String,
    /// Gives a name its key if it has none (`?`: name).
    pub(crate) advisory_new_key: String,
    /// Tries the lock without waiting (`$1`: key, `$2`: lease in seconds); if granted, in
    /// the same statement, takes the next fencing token and sets the server-side lease:
    /// (token or NULL, lease set or NULL, the backend's pid). Per [`AdvisoryMode`].
    pub(crate) advisory_try: [String; 2],
    /// Sets the wait and the server-side lease before a waiting try (`?`: wait, lease).
    pub(crate) advisory_wait: String,
    /// Waits for the lock (`$1`: key) and takes the next fencing token in the same
    /// statement: (token or NULL, the backend's pid). Per [`AdvisoryMode`].
    pub(crate) advisory_lock: [String; 2],
    /// Releases the lock (`?`: key) and puts the session back as the pool gave it: whether
    /// this session held the lock. Per [`AdvisoryMode`].
    pub(crate) advisory_unlock: [String; 2],
    /// Releases the lock (`?`: key) and leaves the session as it is, for a session that
    /// still holds another lock of the same name (a downgraded read beside its write):
    /// whether this session held the lock. Per [`AdvisoryMode`].
    pub(crate) advisory_unlock_one: [String; 2],
    /// Sets how long a statement of a session may wait for a lock (`?`: milliseconds).
    pub(crate) advisory_lock_timeout: String,
    /// The server-side lease of a held advisory lock (`?`: seconds).
    pub(crate) advisory_hold_timeout: String,
    /// The session back to what the pool gave (no server-side lease, the pool's lock wait).
    pub(crate) advisory_reset: String,
    /// How many locks are held on the key (`?`: key), and how many of them are shared; and
    /// the key's last token (`?`: name).
    pub(crate) advisory_holders: String,
    pub(crate) advisory_token: String,
    // for-update
    pub(crate) insert_row: String,
    pub(crate) row_exists: String,
    pub(crate) lock_row: String,
    pub(crate) lock_row_nowait: String,
    pub(crate) lock_wait_timeout: String,
    pub(crate) connection_id: String,
    /// The server-side lease of a held for-update row (`?`: seconds). On PostgreSQL it is
    /// local to the hold's transaction, so COMMIT or ROLLBACK takes it back.
    pub(crate) hold_timeout: String,
    /// What gives a for-update connection the server's default idle timeout back before it
    /// returns to the pool; `None` where the lease is local to the transaction (PostgreSQL).
    pub(crate) reset_hold_timeout: Option<String>,
    pub(crate) next_fence: String,
    /// PostgreSQL: the next fencing token of a name (`$1`: name), taken only while the
    /// transaction that holds its row (`$2`: its id, `txid_current()`) is still in progress
    /// on the session that took it (`$3`: `pg_backend_pid()`); no row otherwise. Empty
    /// elsewhere: MySQL confirms the hold on its own connection after `next_fence`.
    pub(crate) next_fence_held: String,
    // inspection
    pub(crate) describe_hold: String,
    pub(crate) describe_version: String,
    pub(crate) describe_fence: String,
    /// For-update: whether the row is locked, learned with a shared lock that does not wait
    /// (it fails at once if a holder has the row), never by taking the lock.
    pub(crate) row_locked: String,
    // the tables' strategy
    /// Records a strategy for the tables if none is recorded yet (`?`: the strategy).
    pub(crate) claim_strategy: String,
    /// The strategy recorded for the tables.
    pub(crate) read_strategy: String,
}

/// The first key of dlock's PostgreSQL advisory locks (`pg_advisory_lock(space, key)`): the
/// two-integer form, in a space of its own ("dloc"), apart from the single-bigint keys that
/// applications and tools (sqlx's migrations, for one) use.
pub(crate) const ADVISORY_SPACE: i32 = 0x646c_6f63;

/// The two modes of a PostgreSQL advisory lock: a mutex and a read-write lock's write side
/// take it exclusive, a read side shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AdvisoryMode {
    Exclusive,
    Shared,
}

impl AdvisoryMode {
    /// The index of the mode's statement in the `advisory_*` arrays of [`Statements`].
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

/// The database clock, in milliseconds since the epoch.
fn now(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::MySql => "CAST(ROUND(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000) AS SIGNED)",
        Dialect::Sqlite => "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        // clock_timestamp(), not now(): now() is the start of the transaction.
        Dialect::Postgres => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
    }
}

/// A release statement that also announces the release on PostgreSQL: the rows it changed
/// `NOTIFY` the provider's channel with their names in hex (any name, in any database
/// encoding; sent when the statement commits), then `/` and the release's `origin` (hex
/// digits, [`crate::wake::origin`]); its row count is still the number of rows released.
/// Elsewhere the statement as it is.
fn notifying(dialect: Dialect, t: &str, origin: &str, release: String) -> String {
    if dialect != Dialect::Postgres {
        return release;
    }
    format!(
        "WITH released AS ({release} RETURNING name) \
         SELECT pg_notify('{t}_release', encode(name, 'hex') || '/{origin}') FROM released"
    )
}

/// The digits of a name in [`Statements::lock_row_first_try`].
const HEX: &[u8; 16] = b"0123456789abcdef";

/// PostgreSQL numbers its placeholders: `?` becomes `$1`, `$2`, … (no statement here has a
/// `?` inside a string literal).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
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

impl Statements {
    /// `mariadb` picks MariaDB's spelling where MySQL's differs.
    pub(crate) fn new(dialect: Dialect, t: &str, mariadb: bool, origin: &str) -> Self {
        let now = now(dialect);
        let ddl = match dialect {
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
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_seeds (id INTEGER PRIMARY KEY AUTOINCREMENT)"
                ),
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
        };
        let (insert_ignore, ignore_suffix) = match dialect {
            Dialect::MySql => ("INSERT IGNORE INTO", ""),
            Dialect::Sqlite => ("INSERT OR IGNORE INTO", ""),
            Dialect::Postgres => ("INSERT INTO", " ON CONFLICT DO NOTHING"),
        };
        let (transaction_id, next_fence_held) = match dialect {
            // The proof that the holder held the row when its token was taken (review M5),
            // in the statement that takes the token, without another round trip on the
            // holder's connection:
            // - txid_status says whether the transaction that holds the row lock still runs:
            //   "in progress" until its end is recorded, which comes before its row lock is
            //   given to anyone else. It is asked again in DO UPDATE, after the wait for the
            //   fence row (another fence being taken), when the holder may have ended.
            // - The holder's session still has that transaction: a transaction id can be
            //   handed out again after a crash of the server (one whose first use was never
            //   written to disk), and then names another transaction. (A crash during this
            //   statement ends it too, so the check at its start is enough for that.)
            Dialect::Postgres => (
                "txid_current()",
                format!(
                    "INSERT INTO {t}_fence (name, token) SELECT $1, 1 \
                     WHERE txid_status($2::BIGINT) = 'in progress' \
                     AND EXISTS (SELECT 1 FROM pg_stat_get_activity($3::INTEGER) a \
                     WHERE a.backend_xid::TEXT = ($2::BIGINT % 4294967296)::TEXT) \
                     ON CONFLICT(name) DO UPDATE SET token = {t}_fence.token + 1 \
                     WHERE txid_status($2::BIGINT) = 'in progress' RETURNING token"
                ),
            ),
            _ => ("0", String::new()),
        };
        let (claim_version, next_fence) = match dialect {
            Dialect::MySql => (
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
            Dialect::Sqlite | Dialect::Postgres => (
                format!(
                    "UPDATE {t}_versions SET owner = ?, holds = 1, version = version + 1, \
                     expires_at = {now} + ? \
                     WHERE name = ? AND version = ? AND (owner = '' OR expires_at <= {now}) \
                     RETURNING version"
                ),
                format!(
                    "INSERT INTO {t}_fence (name, token) VALUES (?, 1) \
                     ON CONFLICT(name) DO UPDATE SET token = {t}_fence.token + 1 RETURNING token"
                ),
            ),
        };
        let (connection_id, lock_wait_timeout, hold_timeout, reset_hold_timeout, share_nowait) =
            match dialect {
                Dialect::Postgres => (
                    "pg_backend_pid()::BIGINT",
                    // lock_timeout bounds the wait; idle_in_transaction_session_timeout is
                    // the server-side lease (a session idle in its transaction that long is
                    // ended, which frees the row). Both are local to the row lock's
                    // transaction (run after its BEGIN), so its end takes them back, and the
                    // session returns to the pool as it came.
                    // Both take milliseconds up to 2^31 - 1 (24.8 days). The session's id
                    // comes with them, for the killer of the wait that follows.
                    "SELECT set_config('lock_timeout', \
                     LEAST(?::BIGINT * 1000, 2147483647)::TEXT, true), \
                     set_config('idle_in_transaction_session_timeout', \
                     LEAST(?::BIGINT * 1000, 2147483647)::TEXT, true), \
                     pg_backend_pid()::BIGINT",
                    "SELECT set_config('idle_in_transaction_session_timeout', \
                     LEAST(?::BIGINT * 1000, 2147483647)::TEXT, true)",
                    None,
                    "FOR SHARE NOWAIT",
                ),
                _ => (
                    "CONNECTION_ID()",
                    "SET SESSION innodb_lock_wait_timeout = ?, wait_timeout = ?",
                    // The server-side lease of a for-update hold: the server closes a
                    // connection idle this long, which rolls back and frees the row (a paused
                    // or cut-off holder).
                    "SET SESSION wait_timeout = ?",
                    Some("SET SESSION wait_timeout = DEFAULT"),
                    if mariadb {
                        "LOCK IN SHARE MODE NOWAIT"
                    } else {
                        "FOR SHARE NOWAIT"
                    },
                ),
            };
        let statements = Self {
            dialect,
            ddl,
            insert_hold: format!(
                "INSERT INTO {t}_holds (name, owner, holds, takeovers, expires_at) \
                 VALUES (?, ?, 1, 0, {now} + ?){}",
                match dialect {
                    Dialect::MySql => "",
                    Dialect::Sqlite | Dialect::Postgres => " RETURNING id",
                }
            ),
            take_over_hold: format!(
                "UPDATE {t}_holds SET owner = ?, holds = 1, takeovers = takeovers + 1, \
                 expires_at = {now} + ? WHERE name = ? AND expires_at <= {now}"
            ),
            select_hold_token: format!(
                "SELECT id, takeovers FROM {t}_holds WHERE name = ? AND owner = ?"
            ),
            delete_hold: notifying(
                dialect,
                t,
                origin,
                format!("DELETE FROM {t}_holds WHERE name = ? AND owner = ?"),
            ),
            renew_hold: format!(
                "UPDATE {t}_holds SET expires_at = {now} + ? WHERE name = ? AND owner = ?"
            ),
            claim_version,
            select_version: format!("SELECT version FROM {t}_versions WHERE name = ?"),
            insert_version: format!(
                "{insert_ignore} {t}_versions (name, version) VALUES (?, ?){ignore_suffix}"
            ),
            release_version: notifying(
                dialect,
                t,
                origin,
                format!(
                    "UPDATE {t}_versions SET owner = '', holds = 0, expires_at = 0 \
                     WHERE name = ? AND owner = ? AND version = ?"
                ),
            ),
            release_version_by_owner: notifying(
                dialect,
                t,
                origin,
                format!(
                    "UPDATE {t}_versions SET owner = '', holds = 0, expires_at = 0 \
                     WHERE name = ? AND owner = ?"
                ),
            ),
            renew_version: format!(
                "UPDATE {t}_versions SET expires_at = {now} + ? \
                 WHERE name = ? AND owner = ? AND version = ?"
            ),
            new_seed: match dialect {
                Dialect::MySql => format!("INSERT INTO {t}_seeds () VALUES ()"),
                Dialect::Sqlite | Dialect::Postgres => {
                    format!("INSERT INTO {t}_seeds DEFAULT VALUES RETURNING id")
                }
            },
            drop_seed: format!("DELETE FROM {t}_seeds WHERE id = ?"),
            reseed_version: format!(
                "UPDATE {t}_versions SET version = ? \
                 WHERE name = ? AND version = ? AND (owner = '' OR expires_at <= {now})"
            ),
            version_free: format!(
                "SELECT 1 FROM {t}_versions \
                 WHERE name = ? AND version = ? AND (owner = '' OR expires_at <= {now})"
            ),
            max_version: format!("SELECT COALESCE(MAX(version), 0) FROM {t}_versions"),
            mariadb,
            advisory_key: format!("SELECT id FROM {t}_names WHERE name = ?"),
            advisory_new_key: format!(
                "INSERT INTO {t}_names (name) VALUES (?) ON CONFLICT (name) DO NOTHING"
            ),
            // The token is taken in the granting statement, by the session that holds the
            // lock: a token is never issued to a session that does not hold it (for-update
            // needs a confirmation after its fence for that), and an uncontended acquire is
            // one round trip.
            advisory_try: AdvisoryMode::both(|m| {
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
            advisory_wait: "SELECT set_config('lock_timeout', \
                 LEAST(?::BIGINT * 1000, 2147483647)::TEXT, false), \
                 set_config('idle_session_timeout', \
                 LEAST(?::BIGINT * 1000, 2147483647)::TEXT, false)"
                .to_owned(),
            advisory_lock: AdvisoryMode::both(|m| {
                format!(
                    "WITH g AS MATERIALIZED \
                 (SELECT pg_advisory_lock{m}({ADVISORY_SPACE}, $1::INTEGER)::TEXT AS got), \
                 f AS (UPDATE {t}_names SET token = token + 1 \
                 WHERE id = $1::INTEGER AND EXISTS (SELECT 1 FROM g) RETURNING token) \
                 SELECT (SELECT token FROM f), pg_backend_pid()::BIGINT"
                )
            }),
            advisory_unlock: AdvisoryMode::both(|m| {
                format!(
                    "SELECT pg_advisory_unlock{m}({ADVISORY_SPACE}, ?::INTEGER)::INTEGER, \
                 pg_advisory_unlock_all()::TEXT, \
                 set_config('idle_session_timeout', '0', false), \
                 set_config('lock_timeout', '5s', false)"
                )
            }),
            advisory_unlock_one: AdvisoryMode::both(|m| {
                format!("SELECT pg_advisory_unlock{m}({ADVISORY_SPACE}, ?::INTEGER)::INTEGER")
            }),
            advisory_lock_timeout: "SELECT set_config('lock_timeout', \
                 LEAST(?::BIGINT, 2147483647)::TEXT, false)"
                .to_owned(),
            advisory_hold_timeout: "SELECT set_config('idle_session_timeout', \
                 LEAST(?::BIGINT * 1000, 2147483647)::TEXT, false)"
                .to_owned(),
            // unlock_all: a session of the lock pool goes back to it holding nothing, whatever
            // a failed statement may have left.
            advisory_reset: "SELECT pg_advisory_unlock_all()::TEXT, \
                 set_config('idle_session_timeout', '0', false), \
                 set_config('lock_timeout', '5s', false)"
                .to_owned(),
            advisory_holders: format!(
                "SELECT COUNT(*), COUNT(*) FILTER (WHERE mode = 'ShareLock') \
                 FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND classid = {ADVISORY_SPACE} AND objid = (?::INTEGER)::OID AND objsubid = 2 \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ),
            advisory_token: format!("SELECT token FROM {t}_names WHERE name = ?"),
            insert_row: format!("{insert_ignore} {t}_rows (name) VALUES (?){ignore_suffix}"),
            row_exists: format!("SELECT 1 FROM {t}_rows WHERE name = ?"),
            // The session's id, and on PostgreSQL the id of the transaction that holds the
            // row (for `next_fence_held`).
            lock_row: format!(
                "SELECT {connection_id}, {transaction_id} FROM {t}_rows WHERE name = ? FOR UPDATE"
            ),
            lock_row_nowait: format!(
                "SELECT {connection_id}, {transaction_id} FROM {t}_rows \
                 WHERE name = ? FOR UPDATE NOWAIT"
            ),
            lock_wait_timeout: lock_wait_timeout.to_owned(),
            connection_id: format!("SELECT {connection_id}"),
            hold_timeout: hold_timeout.to_owned(),
            reset_hold_timeout: reset_hold_timeout.map(str::to_owned),
            next_fence_held,
            next_fence,

            describe_hold: format!(
                "SELECT owner, id, takeovers, expires_at - {now} FROM {t}_holds WHERE name = ?"
            ),
            describe_version: format!(
                "SELECT owner, version, expires_at - {now} FROM {t}_versions WHERE name = ?"
            ),
            describe_fence: format!("SELECT token FROM {t}_fence WHERE name = ?"),
            row_locked: format!("SELECT 1 FROM {t}_rows WHERE name = ? {share_nowait}"),
            claim_strategy: format!(
                "{insert_ignore} {t}_meta (name, value) VALUES ('strategy', ?){ignore_suffix}"
            ),
            read_strategy: format!("SELECT value FROM {t}_meta WHERE name = 'strategy'"),
        };
        if dialect == Dialect::Postgres {
            statements.numbered()
        } else {
            statements
        }
    }

    /// Every statement with PostgreSQL's numbered placeholders.
    fn numbered(self) -> Self {
        let n = |s: String| numbered(&s);
        Self {
            dialect: self.dialect,
            ddl: self.ddl,
            insert_hold: n(self.insert_hold),
            take_over_hold: n(self.take_over_hold),
            select_hold_token: n(self.select_hold_token),
            delete_hold: n(self.delete_hold),
            renew_hold: n(self.renew_hold),
            claim_version: n(self.claim_version),
            select_version: n(self.select_version),
            insert_version: n(self.insert_version),
            release_version: n(self.release_version),
            release_version_by_owner: n(self.release_version_by_owner),
            renew_version: n(self.renew_version),
            new_seed: self.new_seed,
            drop_seed: n(self.drop_seed),
            reseed_version: n(self.reseed_version),
            version_free: n(self.version_free),
            max_version: self.max_version,
            mariadb: self.mariadb,
            advisory_key: n(self.advisory_key),
            advisory_new_key: n(self.advisory_new_key),
            advisory_try: self.advisory_try.map(n),
            advisory_wait: n(self.advisory_wait),
            advisory_lock: self.advisory_lock.map(n),
            advisory_unlock: self.advisory_unlock.map(n),
            advisory_unlock_one: self.advisory_unlock_one.map(n),
            advisory_lock_timeout: n(self.advisory_lock_timeout),
            advisory_hold_timeout: n(self.advisory_hold_timeout),
            advisory_reset: self.advisory_reset,
            advisory_holders: n(self.advisory_holders),
            advisory_token: n(self.advisory_token),
            insert_row: n(self.insert_row),
            row_exists: n(self.row_exists),
            lock_row: n(self.lock_row),
            lock_row_nowait: n(self.lock_row_nowait),
            lock_wait_timeout: n(self.lock_wait_timeout),
            connection_id: self.connection_id,
            hold_timeout: n(self.hold_timeout),
            reset_hold_timeout: self.reset_hold_timeout,
            next_fence: n(self.next_fence),
            next_fence_held: n(self.next_fence_held),

            describe_hold: n(self.describe_hold),
            describe_version: n(self.describe_version),
            describe_fence: n(self.describe_fence),
            row_locked: n(self.row_locked),
            claim_strategy: n(self.claim_strategy),
            read_strategy: self.read_strategy,
        }
    }

    /// The for-update first try in one round trip: the hold's server-side lease of
    /// `lease_secs`, then `lock_row_nowait` (the same answer). On PostgreSQL it opens the
    /// row lock's transaction too, and the lease is local to it; MySQL's lock connections
    /// open a transaction with every statement, and the lease stays on the session until
    /// `reset_hold_timeout`. The statements cannot be prepared together, so the name goes in
    /// as hexadecimal digits.
    pub(crate) fn lock_row_first_try(&self, name: &[u8], lease_secs: i64) -> String {
        let mut hex = String::with_capacity(2 * name.len());
        for b in name {
            hex.push(char::from(HEX[usize::from(b >> 4)]));
            hex.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        match self.dialect {
            Dialect::Postgres => {
                let ms = lease_secs.saturating_mul(1000).clamp(1, 2_147_483_647);
                let lock =
                    self.lock_row_nowait
                        .replacen("$1", &format!("decode('{hex}', 'hex')"), 1);
                format!("BEGIN; SET LOCAL idle_in_transaction_session_timeout = {ms}; {lock}")
            }
            _ => {
                let lock = self.lock_row_nowait.replacen('?', &format!("X'{hex}'"), 1);
                format!("SET SESSION wait_timeout = {lease_secs}; {lock}")
            }
        }
    }

    /// Ends server connection `id`, whatever it is doing (a cancelled lock wait's session,
    /// which its client closes anyway). Not only its statement: a statement's cancel that
    /// reaches the server before the statement itself (the client sent it, then dropped the
    /// wait) finds the session idle and is lost, and the statement then waits its whole lock
    /// timeout on a session nobody reads. Connection ids are not reused that soon (MySQL
    /// counts up; a PostgreSQL pid comes back only after the kernel's pid range wraps).
    pub(crate) fn kill_connection(&self, id: u64) -> String {
        match self.dialect {
            Dialect::Postgres => format!("SELECT pg_terminate_backend({id})"),
            _ => format!("KILL CONNECTION {id}"),
        }
    }
}
