//! The pruning of the row strategies' tables: the rows of names nobody has held for a while
//! (a holder that died, a name used once) are deleted, so that a table keeps a row per name
//! in use rather than per name ever used.
//!
//! A row goes only once its lease has been over for the configured while
//! ([`crate::SqlConfig::prune_after`]), which the `DELETE` checks itself: a name claimed
//! between the look and the delete keeps its row, and a held name's row is never touched. A
//! name used again gets a new row whose tokens lie above the old ones: unique-insert tokens
//! start from the row's id, optimistic versions from a new seed, both counters the database
//! never hands out twice.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::Inner;
use crate::db::query;
use crate::sql::{PRUNE_AT_ONCE, PruneSql};

/// The most statements of one sweep; the rest waits for the next sweep.
const ROUNDS: usize = 100;
/// The longest and the shortest time between two sweeps of a provider.
const MOST_APART: Duration = Duration::from_secs(600);
const LEAST_APART: Duration = Duration::from_millis(100);

/// The pruning of one table of a provider: its statements, and how long a row stays after
/// its lease ended.
#[derive(Debug, Clone)]
pub(crate) struct Pruning {
    sql: PruneSql,
    after: Duration,
}

impl Pruning {
    /// The pruning of the table `sql` names, of rows idle for `after`; `None` keeps them.
    pub(crate) fn new(sql: PruneSql, after: Option<Duration>) -> Option<Self> {
        after.map(|after| Self { sql, after })
    }

    /// Sweeps the table every quarter of the while a row stays (10 minutes at most), from a
    /// task that ends once the provider is gone. Outside a runtime nothing is swept.
    pub(crate) fn start(&self, inner: &Arc<Inner>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let every = (self.after / 4).clamp(LEAST_APART, MOST_APART);
        drop(runtime.spawn(sweeps(self.clone(), Arc::downgrade(inner), every)));
    }
}

/// The sweeps of `pruning` on `inner`'s database, `every` apart, while the provider lives.
async fn sweeps(pruning: Pruning, inner: Weak<Inner>, every: Duration) {
    let after_ms = super::ms(pruning.after);
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        match sweep(&inner, &pruning.sql, after_ms).await {
            Ok(0) => {}
            Ok(rows) => tracing::debug!(rows, "pruned the rows of names nobody held"),
            Err(e) => tracing::warn!(
                error = %e,
                "could not prune the rows of names nobody held (the provider's role needs \
                 DELETE on dlock's tables; `prune_after_ms=0` turns pruning off)"
            ),
        }
    }
}

/// One sweep: the rows idle for `after_ms`, deleted [`PRUNE_AT_ONCE`] at a time. How many
/// went.
async fn sweep(inner: &Inner, sql: &PruneSql, after_ms: i64) -> Result<u64, sqlx::Error> {
    let mut pruned = 0;
    for _ in 0..ROUNDS {
        let rows = query(&sql.select)
            .bind(after_ms)
            .fetch_all(&inner.pool)
            .await?;
        let names = rows
            .iter()
            .map(|row| row.bytes(0))
            .collect::<Result<Vec<_>, _>>()?;
        if names.is_empty() {
            break;
        }
        let delete = sql.delete(names.len());
        let q = names
            .iter()
            .fold(query(&delete).once().bind(after_ms), |q, name| {
                q.bind(name.as_slice())
            });
        pruned += q.execute(&inner.pool).await?.rows_affected;
        if names.len() < PRUNE_AT_ONCE {
            break;
        }
    }
    Ok(pruned)
}
