//! optimistic: one row per name that stays; a lock is claimed with
//! `UPDATE … WHERE version = ?`, and the version is the fencing token. Versions are a seed
//! (a number never handed out before for these tables) in the high bits and the claims since
//! the row got it in the low bits, so they never go backwards, even past a row deleted by
//! hand. Waiters poll, woken by releases.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{LockName, LockStatus, Result, async_trait};

use super::prune::Pruning;
use super::rows::{RowBase, RowStrategy, changed, described, own_row};
use super::{Attempt, NameCache, TAKEOVER_BITS, missing_id, ms, status, unusable};
use crate::Inner;
use crate::config::Dialect;
use crate::db::{Conn, query};
use crate::sql::{OptimisticSql, Tables};

/// How many seeds one call of [`Optimistic::seed_above`] may mint before it gives up.
const MAX_MINTS: u32 = 10_000;

/// The optimistic strategy of one provider.
#[derive(Debug)]
pub(crate) struct Optimistic {
    base: RowBase,
    sql: OptimisticSql,
    /// The version last seen per name (saves the read before the claim).
    versions: NameCache<i64>,
}

impl Optimistic {
    /// The strategy on `tables`, deleting the rows of names nobody has held for
    /// `prune_after`.
    pub(crate) fn new(
        inner: Arc<Inner>,
        tables: Tables<'_>,
        prune_after: Option<Duration>,
    ) -> Self {
        let sql = OptimisticSql::new(tables);
        let pruning = Pruning::new(sql.prune_versions.clone(), prune_after);
        let base = RowBase::new(inner, tables, sql.renew_versions.clone(), true, pruning);
        Self {
            base,
            sql,
            versions: NameCache::new(),
        }
    }

    /// Claims `version` of a free row; a row whose seed has no version left is moved to a
    /// new seed first.
    async fn claim_version(
        &self,
        a: &Attempt,
        conn: &mut Conn,
        version: i64,
    ) -> Result<Option<u64>> {
        let s = &self.sql;
        let version = if seed_used_up(version) {
            // Only a free row moves (a seed is not minted for every poll of a held one).
            let free = query(&s.version_free)
                .bind(a.key())
                .bind(version)
                .fetch_optional(&mut *conn)
                .await
                .map_err(self.base.inner.err("read the version"))?;
            if free.is_none() {
                return Ok(None);
            }
            // Above the row's own versions, whatever seed they came from (a row of an older
            // dlock counted from 0 and may be past 2^20).
            let next = self.seed_above(conn, version).await?;
            let moved = query(&s.reseed_version)
                .bind(next)
                .bind(a.key())
                .bind(version)
                .execute(&mut *conn)
                .await
                .map_err(self.base.inner.err("move to a new seed"))?;
            if moved.rows_affected != 1 {
                return Ok(None); // held, or claimed or moved by someone else
            }
            self.versions.remember(&a.name, next);
            next
        } else {
            version
        };
        let q = query(&s.claim_version)
            .bind(&a.owner)
            .bind(ms(a.ttl()))
            .bind(a.key())
            .bind(version);
        let missing = || missing_id(self.base.inner.backend, &a.name);
        let next = match self.base.inner.dialect {
            Dialect::MySql => {
                let done = q
                    .execute(&mut *conn)
                    .await
                    .map_err(self.base.inner.err("acquire"))?;
                if done.rows_affected != 1 {
                    None
                } else {
                    let id = done.last_insert_id.ok_or_else(missing)?;
                    Some(i64::try_from(id).map_err(|_| missing())?)
                }
            }
            Dialect::Sqlite | Dialect::Postgres => {
                let row = q
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(self.base.inner.err("acquire"))?;
                match row {
                    Some(row) => Some(row.int(0).map_err(self.base.inner.err("acquire"))?),
                    None => None,
                }
            }
        };
        Ok(next.map(|v| {
            self.versions.remember(&a.name, v);
            u64::try_from(v).unwrap_or(0)
        }))
    }

    /// Mints a new seed: a number never handed out before for these tables (an
    /// AUTO_INCREMENT row, deleted again at once: the counter, not the row, remembers it).
    async fn mint_seed(&self, conn: &mut Conn) -> Result<i64> {
        let s = &self.sql;
        let err = self.base.inner.err("seed");
        let q = query(&s.new_seed);
        let seed = match self.base.inner.dialect {
            Dialect::MySql => {
                let done = q.execute(&mut *conn).await.map_err(err)?;
                done.last_insert_id
                    .and_then(|id| i64::try_from(id).ok())
                    .ok_or_else(|| {
                        unusable(
                            self.base.inner.backend,
                            "the database returned no id for a new seed",
                        )
                    })?
            }
            Dialect::Sqlite | Dialect::Postgres => {
                let row = q.fetch_one(&mut *conn).await.map_err(err)?;
                row.int(0).map_err(err)?
            }
        };
        if let Err(e) = query(&s.drop_seed).bind(seed).execute(&mut *conn).await {
            tracing::debug!(error = %e, "could not delete a used seed row");
        }
        Ok(seed)
    }

    /// The first version (`seed << 20`) of a new seed whose versions lie above `floor` (-1:
    /// any): seeds are minted until one is. Each seed is a number never handed out before
    /// for these tables, so its versions lie above those of every earlier seed as long as no
    /// row uses more than 2^20 - 1 versions of one seed ([`claim_version`] moves a row on
    /// before that); rows of an older dlock, which counted from 0, are what `floor` is for.
    ///
    /// [`claim_version`]: Self::claim_version
    async fn seed_above(&self, conn: &mut Conn, floor: i64) -> Result<i64> {
        for _ in 0..MAX_MINTS {
            let seed = self.mint_seed(conn).await?;
            let first = seeded(seed).ok_or_else(|| {
                unusable(
                    self.base.inner.backend,
                    format!("the seed {seed} no longer fits a fencing token"),
                )
            })?;
            if first > floor {
                return Ok(first);
            }
        }
        Err(unusable(
            self.base.inner.backend,
            format!(
                "{MAX_MINTS} seeds minted without passing version {floor}: the version was set \
                 by hand far above what dlock hands out"
            ),
        ))
    }
}

#[async_trait]
impl RowStrategy for Optimistic {
    fn base(&self) -> &RowBase {
        &self.base
    }

    /// `UPDATE … WHERE version = ?` with the version last seen for this name; on a miss, read
    /// the current version (creating the row on first use) and try once more.
    async fn claim(&self, a: &Attempt, conn: &mut Conn) -> Result<Option<u64>> {
        let cached = self.versions.get(&a.name);
        if let Some(version) = cached
            && let Some(token) = self.claim_version(a, conn, version).await?
        {
            return Ok(Some(token));
        }
        let s = &self.sql;
        let mut row = query(&s.select_version)
            .bind(a.key())
            .fetch_optional(&mut *conn)
            .await
            .map_err(self.base.inner.err("read the version"))?;
        if row.is_none() {
            // A new row starts at the versions of a new seed, above every token an earlier
            // row of this name gave (one deleted by hand, say): tokens never go backwards.
            let first = self.seed_above(conn, -1).await?;
            query(&s.insert_version)
                .bind(a.key())
                .bind(first)
                .execute(&mut *conn)
                .await
                .map_err(self.base.inner.err("create the row"))?;
            row = query(&s.select_version)
                .bind(a.key())
                .fetch_optional(&mut *conn)
                .await
                .map_err(self.base.inner.err("read the version"))?;
        }
        let Some(row) = row else { return Ok(None) };
        let version = row
            .int(0)
            .map_err(self.base.inner.err("read the version"))?;
        self.versions.remember(&a.name, version);
        if cached == Some(version) {
            return Ok(None); // the claim above already failed on this very version
        }
        self.claim_version(a, conn, version).await
    }

    async fn free_on(&self, a: &Attempt, conn: &mut Conn, token: Option<u64>) -> Result<bool> {
        let s = &self.sql;
        let statement = match token {
            Some(_) => &s.release_version,
            None => &s.release_version_by_owner,
        };
        let release = own_row(statement, None, a, token);
        changed(&self.base.inner, release, conn, "release").await
    }

    async fn describe(&self, name: &LockName) -> Result<LockStatus> {
        let row = described(&self.base.inner, &self.sql.describe_version, name).await?;
        let Some((owner, [version, left])) = row else {
            return Ok(LockStatus::free(None));
        };
        let held = !owner.is_empty() && left > 0;
        Ok(status(
            held,
            held.then_some(owner),
            left,
            u64::try_from(version).ok().filter(|v| *v > 0),
        ))
    }

    /// Keeps the seed counter above every row's versions, so a row created later (after one
    /// was deleted) starts above them. Tables of an older dlock counted versions from 0, past
    /// 2^20 for a busy name, with no seed behind them.
    async fn prepare(&self) -> Result<()> {
        let err = self.base.inner.err("read the highest version");
        let mut conn = self.base.inner.pool.acquire().await.map_err(err)?;
        let max = query(&self.sql.max_version)
            .fetch_one(&mut conn)
            .await
            .and_then(|row| row.int(0))
            .map_err(err)?;
        if max >= 1 << TAKEOVER_BITS {
            self.seed_above(&mut conn, max).await?;
        }
        conn.done();
        Ok(())
    }

    async fn renew(&self, a: &Attempt, version: u64, ttl: Duration) -> Result<bool> {
        let renew = own_row(&self.sql.renew_version, Some(ttl), a, Some(version));
        changed(&self.base.inner, renew, &self.base.inner.pool, "renew").await
    }
}

/// The first version of seed `seed` (`seed << 20`), `None` if it does not fit a token.
fn seeded(seed: i64) -> Option<i64> {
    if !(0..1 << (63 - TAKEOVER_BITS)).contains(&seed) {
        return None;
    }
    Some(seed << TAKEOVER_BITS)
}

/// Whether claiming `version + 1` would leave `version`'s seed (its low 20 bits would wrap).
fn seed_used_up(version: i64) -> bool {
    version
        .checked_add(1)
        .is_none_or(|next| next & ((1 << TAKEOVER_BITS) - 1) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optimistic_seeds_leave_room_and_never_overflow() {
        assert_eq!(seeded(0), Some(0));
        assert_eq!(seeded(3), Some(3 << 20));
        assert_eq!(seeded((1 << 43) - 1), Some(((1 << 43) - 1) << 20));
        assert_eq!(seeded(1 << 43), None);
        assert_eq!(seeded(-1), None);
        assert!(!seed_used_up(0));
        assert!(!seed_used_up((3 << 20) + 5));
        assert!(seed_used_up((1 << 20) - 1));
        assert!(seed_used_up((4 << 20) - 1));
        assert!(seed_used_up(i64::MAX));
    }
}
