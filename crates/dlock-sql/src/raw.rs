//! The statements of dlock's uncontended lock cycles, as it sends them, for measuring them
//! without dlock: `dlock bench` takes its floor of each SQL strategy from here, so the floor
//! is the same server work as the cycle it is set against, never a copy that drifts from it.
//!
//! Nothing here takes a lock that a [`SqlProvider`](crate::SqlProvider) respects: the
//! statements are dlock's, but a cycle made with them skips what makes a lock safe (leases,
//! renewals, the checks after a connection broke, waiting). They are for benchmarks.
//!
//! ```
//! use dlock_sql::{Dialect, raw::Cycle};
//!
//! let cycle = Cycle::new(Dialect::Postgres, "dlock")?;
//! // unique-insert takes a lock with one INSERT and frees it with one DELETE.
//! assert!(cycle.insert_hold().starts_with("INSERT INTO dlock_holds"));
//! assert!(cycle.delete_hold().contains("DELETE FROM dlock_holds"));
//! // A prefix goes into the statements as it is: only what a provider accepts.
//! assert!(Cycle::new(Dialect::Postgres, "x; DROP TABLE y").is_err());
//! # Ok::<(), dlock_core::Error>(())
//! ```

use crate::Dialect;
use crate::sql::{AdvisoryMode, AdvisorySql, OptimisticSql, RowLockSql, Tables, UniqueInsertSql};
use crate::strategy::get_lock::GetLockSql;

/// The origin a raw release names in its notification (no provider's: no waiter of a
/// provider takes it for its own).
const ORIGIN: &str = "00";

/// The statements of one uncontended acquire and release, per strategy, for one dialect and
/// table prefix, with PostgreSQL's numbered placeholders where it needs them.
#[derive(Debug, Clone)]
pub struct Cycle {
    dialect: Dialect,
    unique: UniqueInsertSql,
    optimistic: OptimisticSql,
    advisory: AdvisorySql,
    rows: RowLockSql,
    named: GetLockSql,
    announcement: Option<String>,
}

impl Cycle {
    /// The statements of a provider of `dialect` on tables named `<table>_…` (MySQL's
    /// spelling; MariaDB's differs only in statements no uncontended cycle sends).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](dlock_core::Error::InvalidArgument) for a table prefix a
    /// provider would refuse (1 to 40 of `[A-Za-z0-9_]`, not starting with a digit): it goes
    /// into the statements as it is.
    pub fn new(dialect: Dialect, table: &str) -> dlock_core::Result<Self> {
        crate::config::check_table(table)?;
        let tables = Tables {
            dialect,
            prefix: table,
            mariadb: false,
            origin: ORIGIN,
        };
        Ok(Self {
            dialect,
            unique: UniqueInsertSql::new(tables),
            optimistic: OptimisticSql::new(tables),
            advisory: AdvisorySql::new(tables),
            rows: RowLockSql::new(tables),
            named: GetLockSql::new(tables),
            announcement: tables.announcement(),
        })
    }

    /// The settings of the session a MySQL for-update or get-lock hold lives in, to run once
    /// on a connection before its cycles: autocommit off (the row lock's transaction lasts
    /// until [`unlock_row`](Self::unlock_row)) and READ COMMITTED; none elsewhere.
    pub fn lock_session(&self) -> &'static [&'static str] {
        match self.dialect {
            #[cfg(feature = "mysql")]
            Dialect::MySql => crate::db::MYSQL_LOCKS,
            _ => &[],
        }
    }

    /// unique-insert's acquire: inserts the hold. Binds the name, the owner and the lease in
    /// milliseconds; on PostgreSQL and SQLite it returns the row's id (MySQL gives it as the
    /// last insert id).
    pub fn insert_hold(&self) -> &str {
        &self.unique.insert_hold
    }

    /// unique-insert's release: deletes the hold. Binds the name and the owner.
    pub fn delete_hold(&self) -> &str {
        &self.unique.delete_hold
    }

    /// optimistic: creates the row of a name's versions at `version` (nothing if it exists).
    /// Binds the name and the version.
    pub fn insert_version(&self) -> &str {
        &self.optimistic.insert_version
    }

    /// optimistic: the version of a name. Binds the name.
    pub fn select_version(&self) -> &str {
        &self.optimistic.select_version
    }

    /// optimistic's acquire: claims the version after the one last seen. Binds the owner, the
    /// lease in milliseconds, the name and the version last seen; on PostgreSQL and SQLite it
    /// returns the new version (MySQL gives it as the last insert id).
    pub fn claim_version(&self) -> &str {
        &self.optimistic.claim_version
    }

    /// optimistic's release. Binds the name, the owner and the version claimed.
    pub fn release_version(&self) -> &str {
        &self.optimistic.release_version
    }

    /// What follows a release of unique-insert or optimistic on PostgreSQL (`None`
    /// elsewhere): it announces the release to the waiters of the name, in a statement of its
    /// own. Binds the name.
    pub fn announce_release(&self) -> Option<&str> {
        self.announcement.as_deref()
    }

    /// advisory and for-update (PostgreSQL): gives a name its advisory key (nothing if it
    /// has one). Binds the name twice.
    pub fn advisory_new_key(&self) -> &str {
        &self.advisory.new_key
    }

    /// advisory and for-update (PostgreSQL): the advisory key of a name (an `INTEGER`). Binds the name.
    pub fn advisory_key(&self) -> &str {
        &self.advisory.key
    }

    /// advisory's and for-update's acquire (PostgreSQL), without waiting: the exclusive lock of a key, its
    /// fencing token and the session's server-side lease in one statement. Binds the key and
    /// the lease in seconds (both `BIGINT`); returns the token (NULL while the lock is busy),
    /// the lease set (NULL while busy) and the session's backend pid.
    pub fn advisory_lock(&self) -> &str {
        &self.advisory.try_lock[AdvisoryMode::Exclusive.index()]
    }

    /// advisory's and for-update's release (PostgreSQL): unlocks the key and resets the session for the pool.
    /// Binds the key (`BIGINT`).
    pub fn advisory_unlock(&self) -> &str {
        &self.advisory.unlock[AdvisoryMode::Exclusive.index()]
    }

    /// for-update on MySQL: creates the row a name's holders lock (nothing if it exists).
    /// Binds the name.
    pub fn insert_row(&self) -> &str {
        &self.rows.insert_row
    }

    /// for-update's acquire on MySQL, in one round trip of several statements (send it
    /// unprepared): the hold's server-side lease of `lease_secs` seconds, then the row of
    /// `name` locked without waiting, answering the session's id.
    pub fn lock_row(&self, name: &[u8], lease_secs: i64) -> String {
        self.rows.lock_row_first_try(name, lease_secs)
    }

    /// for-update's fencing token on MySQL, taken on another connection and committed
    /// there. Binds the name; answers the token as the last insert id.
    pub fn next_fence(&self) -> &str {
        &self.rows.next_fence
    }

    /// for-update on MySQL: the statement that sets the hold's server-side lease again on the
    /// holding connection after the fence (binds the seconds), which proves the connection
    /// and its row lock alive.
    pub fn confirm_lease(&self) -> &str {
        &self.rows.hold_timeout
    }

    /// get-lock's acquire (MySQL), without waiting, in one round trip of several statements
    /// (send it unprepared, on a session of [`lock_session`](Self::lock_session)): the
    /// session's idle timeout set to `lease_secs`, the named lock of `name`, and if granted
    /// its fencing token, committed. Answers (1 if granted, 0 if busy; the token; the session's
    /// id) in the last row.
    pub fn named_lock(&self, name: &[u8], lease_secs: i64) -> String {
        self.named.lock(name, lease_secs, 0)
    }

    /// get-lock's release (MySQL), one round trip (send it unprepared): the session's default
    /// idle timeout back, then `RELEASE_LOCK` (1 if the session held it).
    pub fn named_unlock(&self, name: &[u8]) -> String {
        self.named.release(name)
    }

    /// for-update's release on MySQL, one round trip (send it unprepared): ends the
    /// transaction, which frees the row, and puts the session's default idle timeout back.
    pub fn unlock_row(&self) -> String {
        format!("{}; ROLLBACK", self.rows.reset_hold_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cycle_is_the_providers_statements() -> dlock_core::Result<()> {
        let pg = Cycle::new(Dialect::Postgres, "t")?;
        let tables = Tables {
            dialect: Dialect::Postgres,
            prefix: "t",
            mariadb: false,
            origin: ORIGIN,
        };
        assert_eq!(pg.insert_hold(), UniqueInsertSql::new(tables).insert_hold);
        assert!(pg.advisory_lock().contains("pg_try_advisory_lock("));
        assert!(pg.advisory_unlock().contains("pg_advisory_unlock("));
        let my = Cycle::new(Dialect::MySql, "t")?;
        assert!(my.next_fence().contains("LAST_INSERT_ID"));
        assert_eq!(my.confirm_lease(), "SET SESSION wait_timeout = ?");
        assert_eq!(
            my.unlock_row(),
            "SET SESSION wait_timeout = DEFAULT; ROLLBACK"
        );
        assert!(
            my.lock_row(b"n", 30)
                .starts_with("SET SESSION wait_timeout = 30;")
        );
        assert!(pg.lock_session().is_empty());
        #[cfg(feature = "mysql")]
        assert!(my.lock_session().contains(&"SET autocommit = 0"));
        assert!(Cycle::new(Dialect::MySql, "t`").is_err());
        Ok(())
    }
}
