//! What the row strategies (unique-insert, optimistic) share: an attempt runs its statements
//! on one connection of the provider's pool, with an undo armed while they may have taken
//! the lock, and the hold is an owner-checked row with a lease, released and renewed by
//! statements on the pool.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Batcher, Deadline, Hold, UndoOnDrop, from_now, renewal_window};
use dlock_core::{Error, LockName, LockStatus, Result, async_trait};
use tokio::time::Instant;

use super::prune::Pruning;
use super::{Attempt, CONNECT_GRACE, Grant, LockStrategy, ms, read_row};
use crate::Inner;
use crate::db::{Conn, On, Query, query};
use crate::error::from_sqlx;
use crate::sql::{RenewMany, Tables};

/// A strategy whose lock is a row with an owner and a lease, taken by a few statements on one
/// connection.
#[async_trait]
pub(crate) trait RowStrategy: fmt::Debug + Send + Sync + 'static {
    /// The provider's database and the renewals of this strategy's holds.
    fn base(&self) -> &RowBase;

    /// The statements that may take the lock for `a` on `conn`: the token if they did,
    /// `None` if the lock is held.
    async fn claim(&self, a: &Attempt, conn: &mut Conn) -> Result<Option<u64>>;

    /// Frees `a`'s hold on `conn`: the one of `token`, or (`None`, an undo) whatever `a`'s
    /// owner holds. Whether a hold was freed.
    async fn free_on(&self, a: &Attempt, conn: &mut Conn, token: Option<u64>) -> Result<bool>;

    /// Makes `a`'s hold of `token` last `ttl` from now: whether it is still `a`'s.
    async fn renew(&self, a: &Attempt, token: u64, ttl: Duration) -> Result<bool>;

    /// What the row of `name` says (see [`LockStrategy::describe`]).
    async fn describe(&self, name: &LockName) -> Result<LockStatus>;

    /// See [`LockStrategy::prepare`].
    async fn prepare(&self) -> Result<()> {
        Ok(())
    }
}

/// What every row strategy has: the provider's database, and the batcher that sends its
/// holds' renewals together.
#[derive(Debug)]
pub(crate) struct RowBase {
    pub(crate) inner: Arc<Inner>,
    renewals: Batcher<RowRenewal, bool>,
    /// Whether a renewal names the hold's version (its token) besides its owner: the rows of
    /// the optimistic table are versioned.
    by_version: bool,
    /// The statement that announces a release to other processes' waiters (PostgreSQL; see
    /// [`Tables::announcement`]).
    announcement: Option<String>,
    /// The deletion of rows nobody has held for a while, if the provider prunes.
    pruning: Option<Pruning>,
}

impl RowBase {
    /// The base of a strategy of `inner` on `tables` whose batches of renewals `many` sends,
    /// and whose idle rows `pruning` deletes.
    pub(crate) fn new(
        inner: Arc<Inner>,
        tables: Tables<'_>,
        many: RenewMany,
        by_version: bool,
        pruning: Option<Pruning>,
    ) -> Self {
        Self {
            renewals: row_renewals(Arc::clone(&inner), many),
            inner,
            by_version,
            announcement: tables.announcement(),
            pruning,
        }
    }

    /// Announces the release of `name`, committed, to other processes' waiters (PostgreSQL),
    /// on `conn`. Its failure is not the release's: it is logged, and the waiters find the
    /// lock free at their next poll.
    async fn announce(&self, name: &LockName, conn: &mut Conn) {
        let Some(announcement) = &self.announcement else {
            return;
        };
        let sent = query(announcement)
            .bind(name.as_str().as_bytes())
            .execute(conn)
            .await;
        if let Err(e) = sent {
            tracing::warn!(
                lock = %name,
                error = %e,
                "the release of a lock was not announced to waiters in other processes; they \
                 find it free at their next poll"
            );
        }
    }

    /// Renews `a`'s hold of `token` for `ttl` in the next batch: whether it is still `a`'s.
    async fn renew(&self, a: &Attempt, token: u64, ttl: Duration) -> Result<bool> {
        let row = RowRenewal::new(a, self.by_version.then_some(token), ttl);
        self.renewals.call(row, renewal_window(ttl)).await
    }
}

/// A row strategy tries once per attempt; the wait loop polls.
#[async_trait]
impl<S: RowStrategy> LockStrategy for S {
    async fn try_lock(
        self: Arc<Self>,
        attempt: Attempt,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        acquire(self, attempt, deadline).await
    }

    async fn describe(&self, name: &LockName) -> Result<LockStatus> {
        RowStrategy::describe(self, name).await
    }

    async fn prepare(&self) -> Result<()> {
        RowStrategy::prepare(self).await?;
        let base = self.base();
        if let Some(pruning) = &base.pruning {
            pruning.start(&base.inner);
        }
        Ok(())
    }
}

/// The hold of a row strategy: `attempt`'s owner holds the row with `token`.
#[derive(Debug)]
pub(crate) struct RowHold<S> {
    strategy: Arc<S>,
    attempt: Attempt,
    token: u64,
}

#[async_trait]
impl<S: RowStrategy> Hold for RowHold<S> {
    async fn release(&self) -> Result<()> {
        let freed = retry_once(|| free(&*self.strategy, &self.attempt, Some(self.token))).await?;
        if freed {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.attempt.name))
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        if self.strategy.renew(&self.attempt, self.token, ttl).await? {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.attempt.name))
        }
    }

    async fn renew(&self, ttl: Duration) -> Result<()> {
        let base = self.strategy.base();
        if base.renew(&self.attempt, self.token, ttl).await? {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.attempt.name))
        }
    }

    fn renews_in_batches(&self) -> bool {
        true
    }
}

/// One attempt of a row strategy. While a statement that may grant the lock is in flight, an
/// undo is armed that frees the hold in the background if this future is dropped: holds are
/// owner-checked and each attempt has its own owner, so the undo touches nothing else.
async fn acquire<S: RowStrategy>(
    strategy: Arc<S>,
    attempt: Attempt,
    deadline: Deadline,
) -> Result<Option<Grant>> {
    // The statements that may take the lock, and the undo that frees it if this future is
    // dropped, run on one connection: a dropped statement still runs to its end on the
    // server (or SQLite's worker), and the undo must come after it, never before.
    let conn = connection_by(&strategy.base().inner, &attempt.name, deadline).await?;
    let conn = Arc::new(tokio::sync::Mutex::new(conn));
    // The lease runs from the claim, not from the wait for a pooled connection (which may
    // take seconds under load: a lease counted from before it could end on arrival).
    let sent = Instant::now();
    let attempt = Arc::new(attempt);
    let mut undo = UndoOnDrop::new(undo::<S>);
    undo.arm(Pending {
        strategy: Arc::clone(&strategy),
        attempt: Arc::clone(&attempt),
        conn: Some(Arc::clone(&conn)),
    });
    let got = {
        let mut c = conn.lock().await;
        strategy.claim(&attempt, &mut c).await
    };
    let token = match got {
        Ok(Some(token)) => token,
        Ok(None) => {
            undo.disarm();
            done(conn);
            return Ok(None);
        }
        Err(e) => {
            // The statement may have taken the lock: undo now, before the next attempt, on a
            // fresh connection (the attempt's own may be the reason it failed). Its
            // connection goes back first: on a pool of one, the undo's would otherwise wait
            // for it.
            drop(conn);
            if let Some(pending) = undo.state_mut() {
                pending.conn = None;
            }
            undo.run_now().await;
            return Err(e);
        }
    };
    undo.disarm();
    done(conn);
    let attempt = Arc::try_unwrap(attempt).map_err(|_| shared_attempt(&strategy.base().inner))?;
    Ok(Some(Grant {
        hold: Arc::new(RowHold {
            strategy,
            attempt,
            token,
        }),
        token,
        sent,
        signal: None,
    }))
}

/// What an attempt in flight may have taken, for its undo.
struct Pending<S> {
    strategy: Arc<S>,
    attempt: Arc<Attempt>,
    /// The connection the attempt's statements ran on, shared with the attempt: the undo of
    /// a dropped attempt runs on it, after them. `None`: the statements failed (and ended),
    /// and the undo runs on a fresh connection.
    conn: Option<Shared>,
}

/// The connection of one attempt, shared with its undo.
type Shared = Arc<tokio::sync::Mutex<Conn>>;

/// Frees whatever an attempt may have taken. A failure is logged: the hold's lease ends it.
async fn undo<S: RowStrategy>(p: Pending<S>) {
    let (s, a) = (&*p.strategy, &*p.attempt);
    match p.conn {
        Some(conn) => {
            let mut c = conn.lock().await;
            if let Err(e) = free_on(s, a, &mut c, None).await {
                tracing::warn!(lock = %a.name, error = %e, "undo of an interrupted acquisition failed; its lease ends it");
            }
        }
        None => {
            if let Err(e) = free(s, a, None).await {
                tracing::warn!(lock = %a.name, error = %e, "undo of a failed acquisition failed; its lease ends it");
            }
        }
    }
}

/// Frees `a`'s hold (see [`RowStrategy::free_on`]) on a connection of the pool.
async fn free<S: RowStrategy>(s: &S, a: &Attempt, token: Option<u64>) -> Result<bool> {
    let mut conn = connection(&s.base().inner).await?;
    let freed = free_on(s, a, &mut conn, token).await?;
    conn.done();
    Ok(freed)
}

/// Frees `a`'s hold on `conn`; if that freed the lock, wakes a waiter of this process.
async fn free_on<S: RowStrategy>(
    s: &S,
    a: &Attempt,
    conn: &mut Conn,
    token: Option<u64>,
) -> Result<bool> {
    let freed = s.free_on(a, conn, token).await?;
    if freed {
        s.base().inner.released(&a.name);
        s.base().announce(&a.name, conn).await;
    }
    Ok(freed)
}

/// `sql`, an owner-checked statement about `a`'s row (a release, a renewal), with its
/// arguments: the lease `ttl` first where it sets one, then the name and the owner, then the
/// `version` the owner must hold where the row has versions.
pub(crate) fn own_row<'a>(
    sql: &'a str,
    ttl: Option<Duration>,
    a: &'a Attempt,
    version: Option<u64>,
) -> Query<'a> {
    let mut q = query(sql);
    if let Some(ttl) = ttl {
        q = q.bind(ms(ttl));
    }
    q = q.bind(a.key()).bind(&a.owner);
    if let Some(version) = version {
        q = q.bind(i64::try_from(version).unwrap_or(i64::MAX));
    }
    q
}

/// One hold's renewal in a batch: its row (name, owner and, on the optimistic table, the
/// version) and the lease.
#[derive(Debug)]
pub(crate) struct RowRenewal {
    key: Vec<u8>,
    owner: String,
    version: Option<i64>,
    ttl_ms: i64,
}

impl RowRenewal {
    /// The renewal of `a`'s hold (at `version`, on the optimistic table) for `ttl`.
    pub(crate) fn new(a: &Attempt, version: Option<u64>, ttl: Duration) -> Self {
        Self {
            key: a.key().to_vec(),
            owner: a.owner.clone(),
            version: version.map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
            ttl_ms: ms(ttl),
        }
    }

    /// Binds the row's columns to `q`, in the order of [`RenewMany`] and of the one-hold
    /// renewal.
    fn bind<'a>(&'a self, q: Query<'a>) -> Query<'a> {
        let q = q.bind(self.key.as_slice()).bind(self.owner.as_str());
        match self.version {
            Some(v) => q.bind(v),
            None => q,
        }
    }
}

/// The most holds one statement renews: well within every dialect's limit of placeholders
/// (SQLite's 32,766 is the lowest) at three columns a hold, and within the memory MySQL's
/// range optimizer takes for the list by default (`range_optimizer_max_mem_size`, 8 MiB),
/// past which it would scan, and lock, the whole table.
const RENEW_AT_ONCE: usize = 2_000;

/// The batcher of a row strategy's renewals on `inner`'s pool: a batch renews its holds with
/// one statement `many` per lease length (almost always one: the watchdog's). A hold is its
/// owner's still if the statement changed as many rows as it named; otherwise (a hold lost,
/// or one named twice) one SELECT says which of them are.
fn row_renewals(inner: Arc<Inner>, many: RenewMany) -> Batcher<RowRenewal, bool> {
    let backend = inner.backend;
    let statements = Arc::new((inner, many));
    Batcher::new(backend, move |items| {
        renew_rows(Arc::clone(&statements), items)
    })
}

/// Sends one batch of [`row_renewals`]: whether each hold is still its owner's.
async fn renew_rows(
    statements: Arc<(Arc<Inner>, RenewMany)>,
    items: Vec<RowRenewal>,
) -> Vec<Result<bool>> {
    let (inner, many) = &*statements;
    let mut answers: Vec<Option<Result<bool>>> = items.iter().map(|_| None).collect();
    let mut by_lease: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, r) in items.iter().enumerate() {
        by_lease.entry(r.ttl_ms).or_default().push(i);
    }
    for (ttl_ms, holds) in by_lease {
        for chunk in holds.chunks(RENEW_AT_ONCE) {
            let rows: Vec<&RowRenewal> = chunk.iter().map(|&i| &items[i]).collect();
            let answer: Vec<Result<bool>> = match renew_chunk(inner, many, ttl_ms, &rows).await {
                Ok(ours) => ours.into_iter().map(Ok).collect(),
                Err(e) => {
                    let e = inner.err("renew")(e);
                    rows.iter().map(|_| Err(e.duplicate())).collect()
                }
            };
            for (&i, a) in chunk.iter().zip(answer) {
                answers[i] = Some(a);
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(Error::no_answer(inner.backend, "renew: no answer"))))
        .collect()
}

/// Renews `rows` for `ttl_ms` with one statement: whether each is still its owner's.
async fn renew_chunk(
    inner: &Inner,
    many: &RenewMany,
    ttl_ms: i64,
    rows: &[&RowRenewal],
) -> std::result::Result<Vec<bool>, sqlx::Error> {
    let renew = many.renew(rows.len());
    let q = rows
        .iter()
        .fold(query(&renew).once().bind(ttl_ms), |q, r| r.bind(q));
    if q.execute(&inner.pool).await?.rows_affected == rows.len() as u64 {
        return Ok(vec![true; rows.len()]);
    }
    // Every row still its owner's was changed by the UPDATE; the others are not there.
    let check = many.check(rows.len());
    let q = rows.iter().fold(query(&check).once(), |q, r| r.bind(q));
    let mut found = HashSet::new();
    for row in q.fetch_all(&inner.pool).await? {
        let version = match rows.first().and_then(|r| r.version) {
            Some(_) => Some(row.int(2)?),
            None => None,
        };
        found.insert((row.bytes(0)?, row.text(1)?, version));
    }
    Ok(rows
        .iter()
        .map(|r| found.contains(&(r.key.clone(), r.owner.clone(), r.version)))
        .collect())
}

/// Runs `q`, a statement from [`own_row`], on `on`: whether it changed the row (it was still
/// the owner's). A failure is an error about `what`.
pub(crate) async fn changed(
    inner: &Inner,
    q: Query<'_>,
    on: impl Into<On<'_>>,
    what: &'static str,
) -> Result<bool> {
    let done = q.execute(on).await.map_err(inner.err(what))?;
    Ok(done.rows_affected == 1)
}

/// What `statement` (see [`RowStrategy::describe`]) reads about `name` on the pool: the
/// owner in its first column and the `N` integers after it; `None` without a row.
pub(crate) async fn described<const N: usize>(
    inner: &Inner,
    statement: &str,
    name: &LockName,
) -> Result<Option<(String, [i64; N])>> {
    let Some(row) = read_row(inner, statement, name, "describe").await? else {
        return Ok(None);
    };
    let err = inner.err("describe");
    let owner = row.text(0).map_err(err)?;
    let mut ints = [0; N];
    for (i, v) in ints.iter_mut().enumerate() {
        *v = row.int(i + 1).map_err(err)?;
    }
    Ok(Some((owner, ints)))
}

/// A connection of the provider's pool for a few statements in a row.
pub(crate) async fn connection(inner: &Inner) -> Result<Conn> {
    inner
        .pool
        .acquire()
        .await
        .map_err(|e| from_sqlx(inner.backend, "connect", e))
}

/// A connection of the provider's pool for an attempt's statements on `name`, waiting for
/// one until `deadline`, with a grace to open one (so that even a zero wait makes its
/// attempt). A pool that gives none by then (a database that does not answer its connects,
/// or a pool busy with other statements) is a retryable [`Error::Connection`], never a lock
/// held by someone else.
async fn connection_by(inner: &Inner, name: &LockName, deadline: Deadline) -> Result<Conn> {
    let Some(d) = deadline.instant() else {
        return connection(inner).await;
    };
    match tokio::time::timeout_at(d.max(from_now(CONNECT_GRACE)), inner.pool.acquire()).await {
        Ok(conn) => conn.map_err(|e| from_sqlx(inner.backend, "connect", e)),
        Err(_) => Err(Error::no_answer(
            inner.backend,
            format!(
                "no connection to the database for {:?} within the wait and a \
                 {CONNECT_GRACE:?} grace to open one",
                name.as_str()
            ),
        )),
    }
}

/// Hands the connection of an attempt whose statements all succeeded back for the next
/// statement (see [`Conn::done`]); still shared (it cannot be, once the undo is gone), it
/// goes back to sqlx when the last owner drops it.
fn done(conn: Shared) {
    if let Ok(conn) = Arc::try_unwrap(conn) {
        conn.into_inner().done();
    }
}

fn shared_attempt(inner: &Inner) -> Error {
    Error::backend_failed(
        inner.backend,
        "an attempt was still shared when it became a hold",
        true,
    )
}

/// Runs an owner-checked call, once more after a retryable failure (a dropped connection
/// fails the first call on it). "Not ours" on the second try may mean the first one did it.
async fn retry_once<F, Fut>(call: F) -> Result<bool>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    match call().await {
        Err(e) if e.is_retryable() => call().await.map(|_| true),
        other => other,
    }
}
