//! unique-insert: one row per held lock. The INSERT that wins holds it; an expired row is
//! taken over by a conditional UPDATE. Waiters poll, woken by releases.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, LockName, LockStatus, Result, async_trait};

use super::prune::Pruning;
use super::rows::{RowBase, RowStrategy, changed, described, own_row};
use super::{Attempt, TAKEOVER_BITS, missing_id, ms, status, unusable};
use crate::Inner;
use crate::config::Dialect;
use crate::db::{Conn, query};
use crate::error::{Meaning, meaning};
use crate::sql::{Tables, UniqueInsertSql};

/// The unique-insert strategy of one provider.
#[derive(Debug)]
pub(crate) struct UniqueInsert {
    base: RowBase,
    sql: UniqueInsertSql,
}

impl UniqueInsert {
    /// The strategy on `tables`, deleting the rows of holders gone for `prune_after`.
    pub(crate) fn new(
        inner: Arc<Inner>,
        tables: Tables<'_>,
        prune_after: Option<Duration>,
    ) -> Self {
        let sql = UniqueInsertSql::new(tables);
        let pruning = Pruning::new(sql.prune_holds.clone(), prune_after);
        let base = RowBase::new(inner, tables, sql.renew_holds.clone(), false, pruning);
        Self { base, sql }
    }

    /// A token from row `id` and its `takeovers`; an id too large to shift is an error,
    /// never a silently truncated token.
    fn token(&self, a: &Attempt, id: i64, takeovers: i64) -> Result<u64> {
        unique_insert_token(id, takeovers).ok_or_else(|| {
            unusable(
                self.base.inner.backend,
                format!(
                    "the row id {id} of lock {:?} no longer fits a fencing token",
                    a.name
                ),
            )
        })
    }
}

#[async_trait]
impl RowStrategy for UniqueInsert {
    fn base(&self) -> &RowBase {
        &self.base
    }

    /// INSERT the hold; on a duplicate, take an expired row over with a conditional UPDATE.
    async fn claim(&self, a: &Attempt, conn: &mut Conn) -> Result<Option<u64>> {
        let s = &self.sql;
        let insert = query(&s.insert_hold)
            .bind(a.key())
            .bind(&a.owner)
            .bind(ms(a.ttl()));
        // MySQL hands the AUTO_INCREMENT id back with the INSERT and answers a held name
        // with a duplicate-key error; SQLite and PostgreSQL answer the id through RETURNING,
        // and no row for a held name.
        let inserted = match self.base.inner.dialect {
            Dialect::MySql => match insert.execute(&mut *conn).await {
                Ok(done) => match done.last_insert_id.and_then(|id| i64::try_from(id).ok()) {
                    Some(id) => Ok(Some(id)),
                    None => return Err(missing_id(self.base.inner.backend, &a.name)),
                },
                Err(e) if meaning(&e) == Meaning::Duplicate => Ok(None),
                Err(e) => Err(e),
            },
            Dialect::Sqlite | Dialect::Postgres => match insert.fetch_optional(&mut *conn).await {
                Ok(Some(row)) => row.int(0).map(Some),
                Ok(None) => Ok(None),
                // A race the conflict check does not cover (another unique index) still
                // counts as held.
                Err(e) if meaning(&e) == Meaning::Duplicate => Ok(None),
                Err(e) => Err(e),
            },
        };
        match inserted {
            Ok(Some(id)) => return self.token(a, id, 0).map(Some),
            Ok(None) => {}
            Err(e) => return Err(self.base.inner.err("acquire")(e)),
        }
        let taken = query(&s.take_over_hold)
            .bind(&a.owner)
            .bind(ms(a.ttl()))
            .bind(a.key())
            .execute(&mut *conn)
            .await
            .map_err(self.base.inner.err("take over"))?;
        if taken.rows_affected != 1 {
            return Ok(None);
        }
        let row = query(&s.select_hold_token)
            .bind(a.key())
            .bind(&a.owner)
            .fetch_optional(&mut *conn)
            .await
            .map_err(self.base.inner.err("read the token"))?;
        let Some(row) = row else {
            // Taken over from us already (our lease was shorter than the round trip).
            return Ok(None);
        };
        let id = row.int(0).map_err(self.base.inner.err("read the token"))?;
        let takeovers = row.int(1).map_err(self.base.inner.err("read the token"))?;
        if takeovers >= 1 << TAKEOVER_BITS {
            // The row's token space is used up. The attempt's undo deletes the row (it is
            // ours now) and the retry inserts a new one, whose larger id gives larger tokens.
            return Err(Error::backend_failed(
                self.base.inner.backend,
                format!(
                    "lock {:?} was taken over 2^20 times without a release; starting a new row",
                    a.name
                ),
                true,
            ));
        }
        self.token(a, id, takeovers).map(Some)
    }

    async fn free_on(&self, a: &Attempt, conn: &mut Conn, _token: Option<u64>) -> Result<bool> {
        let release = own_row(&self.sql.delete_hold, None, a, None);
        changed(&self.base.inner, release, conn, "release").await
    }

    async fn describe(&self, name: &LockName) -> Result<LockStatus> {
        let row = described(&self.base.inner, &self.sql.describe_hold, name).await?;
        let Some((owner, [id, takeovers, left])) = row else {
            return Ok(LockStatus::free(None));
        };
        // A row out of tokens has none to show (its next holder starts a new row), never a
        // truncated one.
        let token = unique_insert_token(id, takeovers);
        Ok(status(left > 0, Some(owner), left, token))
    }

    async fn renew(&self, a: &Attempt, _token: u64, ttl: Duration) -> Result<bool> {
        let renew = own_row(&self.sql.renew_hold, Some(ttl), a, None);
        changed(&self.base.inner, renew, &self.base.inner.pool, "renew").await
    }
}

/// A unique-insert token from a row's id and takeovers, `None` if they do not fit (an id of
/// 2^44 or more, takeovers of 2^20 or more, or a negative value).
pub(crate) fn unique_insert_token(id: i64, takeovers: i64) -> Option<u64> {
    let id = u64::try_from(id).ok()?;
    let takeovers = u64::try_from(takeovers).ok()?;
    if id >= 1 << (64 - TAKEOVER_BITS) || takeovers >= 1 << TAKEOVER_BITS {
        return None;
    }
    Some((id << TAKEOVER_BITS) | takeovers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_insert_tokens_never_truncate() {
        assert_eq!(unique_insert_token(1, 0), Some(1 << 20));
        assert_eq!(unique_insert_token(3, 5), Some((3 << 20) | 5));
        assert_eq!(
            unique_insert_token((1 << 44) - 1, (1 << 20) - 1),
            Some(u64::MAX)
        );
        assert_eq!(unique_insert_token(1 << 44, 0), None);
        assert_eq!(unique_insert_token(1, 1 << 20), None);
        assert_eq!(unique_insert_token(-1, 0), None);
        assert_eq!(unique_insert_token(1, -1), None);
    }
}
