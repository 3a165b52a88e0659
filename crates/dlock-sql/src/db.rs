//! The two drivers behind one small private interface: typed sqlx pools and connections (no
//! `Any`, so no process-wide driver registry to collide with the application's), statements
//! with bound arguments, and rows read by position.
//!
//! The strategies write each statement once (`query(sql).bind(..).execute(on)`); this module
//! turns it into the driver's own typed query. A statement runs on a pool, a pooled connection
//! or a bare connection (the application's transaction).
#![cfg_attr(
    not(any(feature = "mysql", feature = "sqlite")),
    allow(
        dead_code,
        unused_imports,
        unused_variables,
        unreachable_code,
        clippy::needless_pass_by_value
    )
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Encode, Executor, Type};

use crate::config::{Dialect, SqlConfig};

#[cfg(feature = "mysql")]
use sqlx::mysql::{MySql, MySqlConnection, MySqlPool, MySqlRow};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgConnection, PgPool, PgRow, Postgres};
#[cfg(feature = "sqlite")]
use sqlx::sqlite::{Sqlite, SqliteConnection, SqlitePool, SqliteRow};

/// A connection pool of one driver, with the few clean connections dlock keeps warm in
/// front of it (on the pools dlock opened itself).
///
/// sqlx 0.8 pings every connection its pool takes back, a round trip in a task of its own:
/// a lock cycle that gives back two connections costs two round trips more than its
/// statements. A connection whose statements all succeeded is instead kept (at most
/// [`WARM_MAX`], by [`Conn::done`]) for dlock's next statement on the pool. One idle longer
/// than [`WARM_IDLE`], or out of sqlx's pool longer than [`WARM_LIFETIME`], goes back to sqlx
/// after all (which pings it in its own task and applies its idle and lifetime limits), and a
/// pool that was closed serves none. A warm connection is never pinged on the caller's path: a
/// ping cancelled with its caller leaves MySQL's answer unread on the connection, which the
/// next statement would take for its own. Like sqlx's idle connections (dlock does not test
/// them before use), a warm one may have been closed by the server: the statement that finds
/// it dead gives the pool's other warm connections back to sqlx, and the caller retries on a
/// fresh one (an acquisition does so once at its deadline). Nobody waits behind a kept connection:
/// one is kept only while no caller of [`Pool::acquire`] waits in sqlx's queue, and every
/// statement dlock runs on the pool goes through [`Pool::acquire`]. An application's own pool
/// (`from_*_pool`) gets no cache: its other users wait in sqlx's queue, where dlock cannot see
/// them.
#[derive(Clone, Debug)]
pub(crate) struct Pool {
    driver: Driver,
    warm: Option<Arc<Warm>>,
}

/// The sqlx pool of one driver.
#[derive(Clone, Debug)]
pub(crate) enum Driver {
    /// MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    MySql(MySqlPool),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(SqlitePool),
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(PgPool),
}

/// A connection checked out of a [`Pool`]; it goes back to sqlx when dropped, or to the
/// pool's warm connections through [`done`](Conn::done).
#[derive(Debug)]
pub(crate) struct Conn {
    raw: Raw,
    warm: Option<Arc<Warm>>,
    /// When it came out of sqlx's pool.
    out: Instant,
}

/// A connection of sqlx's pool.
#[derive(Debug)]
enum Raw {
    #[cfg(feature = "mysql")]
    MySql(PoolConnection<MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(PoolConnection<Sqlite>),
    #[cfg(feature = "postgres")]
    Postgres(PoolConnection<Postgres>),
}

/// The most connections a pool keeps warm: a lock cycle uses one at a time; the second
/// serves a renewal or a fence that comes meanwhile.
const WARM_MAX: usize = 2;

/// A warm connection idle longer than this goes back to sqlx (by the next caller, or by the
/// pool's reaper task, which looks every 5 s while it keeps any): a lock renewed at least
/// every 5 s keeps its connection; a quieter application's connections are pinged by sqlx
/// (in the background) and closed after its idle limit.
const WARM_IDLE: Duration = Duration::from_secs(5);

/// A connection out of sqlx's pool longer than this goes back to it when done, so that its
/// `max_lifetime` still applies to a provider busy enough to keep one warm for ever.
const WARM_LIFETIME: Duration = Duration::from_secs(60);

/// A warm connection.
#[derive(Debug)]
struct Kept {
    raw: Raw,
    /// When it came out of sqlx's pool.
    out: Instant,
    /// When it was kept.
    kept: Instant,
}

/// The connections a [`Pool`] keeps warm, and the callers waiting in sqlx's queue.
#[derive(Debug)]
pub(crate) struct Warm {
    driver: Driver,
    state: std::sync::Mutex<WarmState>,
}

#[derive(Debug, Default)]
struct WarmState {
    /// Clean connections, the newest last.
    idle: Vec<Kept>,
    /// Callers of [`Pool::acquire`] waiting in sqlx's queue.
    waiting: usize,
    /// Whether a reaper task is running.
    reaping: bool,
}

impl Warm {
    fn state(&self) -> std::sync::MutexGuard<'_, WarmState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps a clean connection, unless somebody waits in sqlx's queue (it goes there), the
    /// cache is full or the pool was closed.
    fn keep(self: &Arc<Self>, raw: Raw, out: Instant) {
        let (refused, reaper) = {
            let mut state = self.state();
            if state.waiting == 0
                && state.idle.len() < WARM_MAX
                && out.elapsed() < WARM_LIFETIME
                && !self.driver.is_closed()
            {
                state.idle.push(Kept {
                    raw,
                    out,
                    kept: Instant::now(),
                });
                (None, !std::mem::replace(&mut state.reaping, true))
            } else {
                (Some(raw), false)
            }
        };
        drop(refused);
        if reaper {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(reap(Reaping {
                    warm: Arc::downgrade(self),
                    ended: false,
                }))),
                Err(_) => self.state().reaping = false,
            }
        }
    }

    /// Gives every kept connection back to sqlx (which pings it and closes a dead one): one
    /// of them died, and the others may have died with it (a restarted server).
    fn purge(&self) {
        let idle = std::mem::take(&mut self.state().idle);
        drop(idle);
    }
}

/// The reaper of a pool's warm connections: every [`WARM_IDLE`], gives those idle that long
/// back to sqlx; ends when none is kept (the next one kept starts another) or the pool is
/// gone.
async fn reap(mut reaping: Reaping) {
    loop {
        tokio::time::sleep(WARM_IDLE).await;
        let Some(warm) = reaping.warm.upgrade() else {
            return;
        };
        let (stale, done) = {
            let mut state = warm.state();
            let (stale, fresh): (Vec<Kept>, Vec<Kept>) = std::mem::take(&mut state.idle)
                .into_iter()
                .partition(|kept| kept.kept.elapsed() >= WARM_IDLE);
            state.idle = fresh;
            if state.idle.is_empty() {
                state.reaping = false;
            }
            (stale, !state.reaping)
        };
        drop(stale);
        if done {
            reaping.ended = true;
            return;
        }
    }
}

/// A running reaper: dropped before it ended on its own (its runtime shut down), it lets the
/// next connection kept start another.
struct Reaping {
    warm: std::sync::Weak<Warm>,
    /// Ended on its own, having said so under the lock.
    ended: bool,
}

impl Drop for Reaping {
    fn drop(&mut self) {
        if !self.ended
            && let Some(warm) = self.warm.upgrade()
        {
            warm.state().reaping = false;
        }
    }
}

impl Drop for Warm {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut self.state().idle);
        if tokio::runtime::Handle::try_current().is_err() {
            // Outside a runtime sqlx cannot take a connection back (its drop spawns a task,
            // and panics without a runtime): the pool is going away, so the connections are
            // closed with it, without a goodbye.
            for kept in idle {
                kept.raw.detach();
            }
        }
    }
}

/// Counts a caller of [`Pool::acquire`] as waiting in sqlx's queue while it lives.
struct Waiting<'w>(&'w Warm);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.waiting = state.waiting.saturating_sub(1);
    }
}

/// Where a statement runs.
pub(crate) enum On<'c> {
    /// On a connection of the pool, for this statement only.
    Pool(&'c Pool),
    /// On a connection checked out of a [`Pool`].
    Conn(&'c mut Conn),
    /// On a bare connection (the application's transaction).
    Exec(Exec<'c>),
}

/// A bare connection of one driver.
pub(crate) enum Exec<'c> {
    #[cfg(feature = "mysql")]
    MySql(&'c mut MySqlConnection),
    #[cfg(feature = "sqlite")]
    Sqlite(&'c mut SqliteConnection),
    #[cfg(feature = "postgres")]
    Postgres(&'c mut PgConnection),
    /// Without a driver there is no connection.
    #[cfg(not(any(feature = "mysql", feature = "sqlite", feature = "postgres")))]
    Unused(std::marker::PhantomData<&'c ()>, std::convert::Infallible),
}

impl<'c> From<&'c Pool> for On<'c> {
    fn from(pool: &'c Pool) -> Self {
        On::Pool(pool)
    }
}

impl<'c> From<&'c mut Conn> for On<'c> {
    fn from(conn: &'c mut Conn) -> Self {
        On::Conn(conn)
    }
}

#[cfg(feature = "mysql")]
impl<'c> From<&'c mut MySqlConnection> for On<'c> {
    fn from(conn: &'c mut MySqlConnection) -> Self {
        On::Exec(Exec::MySql(conn))
    }
}

#[cfg(feature = "postgres")]
impl<'c> From<&'c mut PgConnection> for On<'c> {
    fn from(conn: &'c mut PgConnection) -> Self {
        On::Exec(Exec::Postgres(conn))
    }
}

#[cfg(feature = "sqlite")]
impl<'c> From<&'c mut SqliteConnection> for On<'c> {
    fn from(conn: &'c mut SqliteConnection) -> Self {
        On::Exec(Exec::Sqlite(conn))
    }
}

impl Driver {
    async fn acquire(&self) -> Result<Raw, sqlx::Error> {
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref p) => p.acquire().await.map(Raw::MySql),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(ref p) => p.acquire().await.map(Raw::Sqlite),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref p) => p.acquire().await.map(Raw::Postgres),
        }
    }

    fn is_closed(&self) -> bool {
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref p) => p.is_closed(),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(ref p) => p.is_closed(),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref p) => p.is_closed(),
        }
    }
}

impl Pool {
    /// A pool dlock opened: it keeps its clean connections warm.
    pub(crate) fn ours(driver: Driver) -> Self {
        Self {
            warm: Some(Arc::new(Warm {
                driver: driver.clone(),
                state: std::sync::Mutex::default(),
            })),
            driver,
        }
    }

    /// The application's pool: every connection goes back to it.
    pub(crate) fn theirs(driver: Driver) -> Self {
        Self { driver, warm: None }
    }

    /// The sqlx pool.
    #[cfg(feature = "postgres")]
    pub(crate) fn driver(&self) -> &Driver {
        &self.driver
    }

    /// A connection for a few statements in a row: a warm one if the pool keeps one, else
    /// one of sqlx's.
    pub(crate) async fn acquire(&self) -> Result<Conn, sqlx::Error> {
        let from_sqlx = |raw, warm: Option<Arc<Warm>>| Conn {
            raw,
            warm,
            out: Instant::now(),
        };
        let Some(warm) = &self.warm else {
            return Ok(from_sqlx(self.driver.acquire().await?, None));
        };
        let (kept, stale) = {
            let mut state = warm.state();
            match state.idle.pop() {
                Some(kept) if kept.kept.elapsed() < WARM_IDLE && !self.driver.is_closed() => {
                    (Some(kept), Vec::new())
                }
                newest => {
                    // Nothing to serve (the newest is idle too long, so are the others, or
                    // the pool was closed): every kept connection goes back to sqlx. Counted
                    // as waiting under the same lock that keeps connections: a connection
                    // done from now on goes to sqlx's queue, where this caller waits.
                    let mut stale = std::mem::take(&mut state.idle);
                    stale.extend(newest);
                    state.waiting = state.waiting.saturating_add(1);
                    (None, stale)
                }
            }
        };
        drop(stale);
        match kept {
            Some(kept) => Ok(Conn {
                raw: kept.raw,
                warm: Some(Arc::clone(warm)),
                out: kept.out,
            }),
            None => {
                let _waiting = Waiting(warm);
                let raw = self.driver.acquire().await?;
                Ok(from_sqlx(raw, Some(Arc::clone(warm))))
            }
        }
    }

    /// The most connections the pool opens.
    pub(crate) fn max_connections(&self) -> u32 {
        match self.driver {
            #[cfg(feature = "mysql")]
            Driver::MySql(ref p) => p.options().get_max_connections(),
            #[cfg(feature = "sqlite")]
            Driver::Sqlite(ref p) => p.options().get_max_connections(),
            #[cfg(feature = "postgres")]
            Driver::Postgres(ref p) => p.options().get_max_connections(),
        }
    }

    /// Whether every connection the pool may open is open and checked out: the pool is
    /// exhausted, not merely slow to open a connection. A warm connection is not in use.
    pub(crate) fn all_in_use(&self) -> bool {
        let (size, idle): (u32, usize) = match self.driver {
            #[cfg(feature = "mysql")]
            Driver::MySql(ref p) => (p.size(), p.num_idle()),
            #[cfg(feature = "sqlite")]
            Driver::Sqlite(ref p) => (p.size(), p.num_idle()),
            #[cfg(feature = "postgres")]
            Driver::Postgres(ref p) => (p.size(), p.num_idle()),
        };
        let warm = self.warm.as_ref().map_or(0, |w| w.state().idle.len());
        size >= self.max_connections() && idle == 0 && warm == 0
    }

    /// Runs statements without arguments or preparation (DDL).
    pub(crate) async fn raw(&self, sql: &str) -> Result<(), sqlx::Error> {
        let mut conn = self.acquire().await?;
        let r = match conn.exec() {
            #[cfg(not(any(feature = "mysql", feature = "sqlite", feature = "postgres")))]
            Exec::Unused(_, never) => match never {},
            #[cfg(feature = "mysql")]
            Exec::MySql(c) => c.execute(sql).await.map(drop),
            #[cfg(feature = "sqlite")]
            Exec::Sqlite(c) => c.execute(sql).await.map(drop),
            #[cfg(feature = "postgres")]
            Exec::Postgres(c) => c.execute(sql).await.map(drop),
        };
        conn.after(r)
    }
}

impl Raw {
    async fn ping(&mut self) -> Result<(), sqlx::Error> {
        use sqlx::Connection;
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref mut c) => c.ping().await,
            #[cfg(feature = "sqlite")]
            Self::Sqlite(ref mut c) => c.ping().await,
            #[cfg(feature = "postgres")]
            Self::Postgres(ref mut c) => c.ping().await,
        }
    }

    fn close_on_drop(&mut self) {
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref mut c) => c.close_on_drop(),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(ref mut c) => c.close_on_drop(),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref mut c) => c.close_on_drop(),
        }
    }

    /// Takes the connection out of sqlx's pool and drops it (no runtime needed).
    fn detach(self) {
        match self {
            #[cfg(feature = "mysql")]
            Self::MySql(c) => drop(c.detach()),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(c) => drop(c.detach()),
            #[cfg(feature = "postgres")]
            Self::Postgres(c) => drop(c.detach()),
        }
    }
}

impl Conn {
    /// Whether the connection answers.
    pub(crate) async fn ping(&mut self) -> Result<(), sqlx::Error> {
        self.raw.ping().await
    }

    /// Runs statements without arguments or preparation, several in one round trip, and
    /// returns the rows of all of them (the server stops at the first that fails).
    pub(crate) async fn batch(&mut self, sql: &str) -> Result<Vec<Row>, sqlx::Error> {
        let rows = match self.exec() {
            #[cfg(not(any(feature = "mysql", feature = "sqlite", feature = "postgres")))]
            Exec::Unused(_, never) => match never {},
            #[cfg(feature = "mysql")]
            Exec::MySql(c) => c
                .fetch_all(sql)
                .await
                .map(|rows| rows.into_iter().map(Row::MySql).collect()),
            #[cfg(feature = "sqlite")]
            Exec::Sqlite(c) => c
                .fetch_all(sql)
                .await
                .map(|rows| rows.into_iter().map(Row::Sqlite).collect()),
            #[cfg(feature = "postgres")]
            Exec::Postgres(c) => c
                .fetch_all(sql)
                .await
                .map(|rows| rows.into_iter().map(Row::Postgres).collect()),
        };
        self.check(rows)
    }

    /// The bare connection, for a statement.
    fn exec(&mut self) -> Exec<'_> {
        match self.raw {
            #[cfg(feature = "mysql")]
            Raw::MySql(ref mut c) => Exec::MySql(c),
            #[cfg(feature = "sqlite")]
            Raw::Sqlite(ref mut c) => Exec::Sqlite(c),
            #[cfg(feature = "postgres")]
            Raw::Postgres(ref mut c) => Exec::Postgres(c),
        }
    }

    /// Closes the connection when it is dropped, instead of returning it to the pool.
    pub(crate) fn close_on_drop(&mut self) {
        self.warm = None;
        self.raw.close_on_drop();
    }

    /// The connection is clean (its statements all succeeded, no transaction is open): it may
    /// serve dlock's next statement on its pool without going back to sqlx. Dropping it
    /// instead gives it back to sqlx.
    pub(crate) fn done(mut self) {
        if let Some(warm) = self.warm.take() {
            warm.keep(self.raw, self.out);
        }
    }

    /// After the one statement of this connection: kept warm if it succeeded (see
    /// [`check`](Self::check) for a failure). Passes the result on.
    fn after<T>(mut self, r: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        let r = self.check(r);
        if r.is_ok() {
            self.done();
        }
        r
    }

    /// After a statement on this connection: if it failed because the connection is gone,
    /// the pool's warm connections are given back to sqlx (they may have gone with it, as
    /// when the server restarted), and this one is not kept. Passes the result on.
    fn check<T>(&mut self, r: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if let Err(e) = &r
            && crate::error::connection_lost(e)
            && let Some(warm) = self.warm.take()
        {
            warm.purge();
        }
        r
    }
}

/// Whether `v` is a value that decodes as `Other` and not as `i64` (NULL is neither).
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn only<DB, Other>(v: &<DB as sqlx::Database>::ValueRef<'_>) -> bool
where
    DB: sqlx::Database,
    i64: sqlx::Type<DB>,
    Other: sqlx::Type<DB>,
{
    use sqlx::ValueRef as _;
    if v.is_null() {
        return false;
    }
    let ty = v.type_info();
    !<i64 as sqlx::Type<DB>>::compatible(&ty) && Other::compatible(&ty)
}

/// A bound argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg<'a> {
    Bytes(&'a [u8]),
    Text(&'a str),
    Int(i64),
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(v: &'a [u8]) -> Self {
        Arg::Bytes(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(v)
    }
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

/// What a statement that returns no rows did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Done {
    /// Rows changed.
    pub(crate) rows_affected: u64,
    /// MySQL's `LAST_INSERT_ID()` after the statement (`None` on SQLite, which answers with
    /// `RETURNING` instead).
    pub(crate) last_insert_id: Option<u64>,
}

/// A row of a result, read by column position.
pub(crate) enum Row {
    #[cfg(feature = "mysql")]
    MySql(MySqlRow),
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteRow),
    #[cfg(feature = "postgres")]
    Postgres(PgRow),
}

impl Row {
    /// An integer column (MySQL's unsigned ones too, such as `CONNECTION_ID()`, if they fit).
    ///
    /// The width is chosen from the column's type, not by trying one and falling back: a
    /// failed `try_get` builds an error with a formatted message, which on the hot path (the
    /// answer of PostgreSQL's advisory unlock, an `int4`, every cycle) cost more client CPU
    /// than the rest of the row's decoding.
    pub(crate) fn int(&self, i: usize) -> Result<i64, sqlx::Error> {
        use sqlx::Row as _;
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref r) => {
                if r.try_get_raw(i).is_ok_and(|v| only::<sqlx::MySql, u64>(&v)) {
                    let v = r.try_get::<u64, _>(i)?;
                    i64::try_from(v).map_err(|e| sqlx::Error::Decode(Box::new(e)))
                } else {
                    r.try_get::<i64, _>(i)
                }
            }
            #[cfg(feature = "sqlite")]
            Self::Sqlite(ref r) => r.try_get::<i64, _>(i),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref r) => {
                if r.try_get_raw(i)
                    .is_ok_and(|v| only::<sqlx::Postgres, i32>(&v))
                {
                    r.try_get::<i32, _>(i).map(i64::from)
                } else {
                    r.try_get::<i64, _>(i)
                }
            }
        }
    }

    /// Whether column `i` is NULL.
    pub(crate) fn is_null(&self, i: usize) -> Result<bool, sqlx::Error> {
        use sqlx::{Row as _, ValueRef as _};
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref r) => r.try_get_raw(i).map(|v| v.is_null()),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(ref r) => r.try_get_raw(i).map(|v| v.is_null()),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref r) => r.try_get_raw(i).map(|v| v.is_null()),
        }
    }

    /// A text column.
    pub(crate) fn text(&self, i: usize) -> Result<String, sqlx::Error> {
        use sqlx::Row as _;
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref r) => r.try_get::<String, _>(i),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(ref r) => r.try_get::<String, _>(i),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref r) => r.try_get::<String, _>(i),
        }
    }
}

/// A statement and its arguments.
#[must_use]
pub(crate) struct Query<'a> {
    sql: &'a str,
    args: Vec<Arg<'a>>,
}

/// A statement with `?` placeholders, to [`bind`](Query::bind) and run.
pub(crate) fn query(sql: &str) -> Query<'_> {
    Query {
        sql,
        args: Vec::new(),
    }
}

/// The driver's typed query for `sql` with `args` bound.
fn typed<'q, DB>(
    sql: &'q str,
    args: &[Arg<'q>],
) -> sqlx::query::Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    &'q [u8]: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
{
    let mut q = sqlx::query::<DB>(sql);
    for arg in args {
        q = match *arg {
            Arg::Bytes(v) => q.bind(v),
            Arg::Text(v) => q.bind(v),
            Arg::Int(v) => q.bind(v),
        };
    }
    q
}

impl<'a> Query<'a> {
    /// Binds the next `?`.
    pub(crate) fn bind(mut self, arg: impl Into<Arg<'a>>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Runs a statement that returns no rows.
    pub(crate) async fn execute(self, on: impl Into<On<'_>>) -> Result<Done, sqlx::Error> {
        match on.into() {
            On::Pool(pool) => {
                let mut conn = pool.acquire().await?;
                let r = self.execute_on(conn.exec()).await;
                match conn.after(r) {
                    Err(e) if crate::error::connection_lost(&e) => {
                        // See `fetch_optional`.
                        let mut conn = pool.acquire().await?;
                        let r = self.execute_on(conn.exec()).await;
                        conn.after(r)
                    }
                    r => r,
                }
            }
            On::Conn(conn) => {
                let r = self.execute_on(conn.exec()).await;
                conn.check(r)
            }
            On::Exec(exec) => self.execute_on(exec).await,
        }
    }

    async fn execute_on(&self, on: Exec<'_>) -> Result<Done, sqlx::Error> {
        match on {
            #[cfg(not(any(feature = "mysql", feature = "sqlite", feature = "postgres")))]
            Exec::Unused(_, never) => match never {},
            #[cfg(feature = "mysql")]
            Exec::MySql(c) => typed::<MySql>(self.sql, &self.args)
                .execute(c)
                .await
                .map(mysql_done),
            #[cfg(feature = "sqlite")]
            Exec::Sqlite(c) => typed::<Sqlite>(self.sql, &self.args)
                .execute(c)
                .await
                .map(sqlite_done),
            #[cfg(feature = "postgres")]
            Exec::Postgres(c) => typed::<Postgres>(self.sql, &self.args)
                .execute(c)
                .await
                .map(pg_done),
        }
    }

    /// Runs a query that returns at most one row.
    pub(crate) async fn fetch_optional(
        self,
        on: impl Into<On<'_>>,
    ) -> Result<Option<Row>, sqlx::Error> {
        match on.into() {
            On::Pool(pool) => {
                let mut conn = pool.acquire().await?;
                let r = self.fetch_optional_on(conn.exec()).await;
                match conn.after(r) {
                    // The connection was gone (closed by the server or a proxy while it sat
                    // idle, say): once more, on another. The statements dlock runs on its
                    // pool may run twice (renewals, row creation and reads are idempotent; a
                    // fence taken twice skips a token, and tokens only rise).
                    Err(e) if crate::error::connection_lost(&e) => {
                        let mut conn = pool.acquire().await?;
                        let r = self.fetch_optional_on(conn.exec()).await;
                        conn.after(r)
                    }
                    r => r,
                }
            }
            On::Conn(conn) => {
                let r = self.fetch_optional_on(conn.exec()).await;
                conn.check(r)
            }
            On::Exec(exec) => self.fetch_optional_on(exec).await,
        }
    }

    async fn fetch_optional_on(&self, on: Exec<'_>) -> Result<Option<Row>, sqlx::Error> {
        match on {
            #[cfg(not(any(feature = "mysql", feature = "sqlite", feature = "postgres")))]
            Exec::Unused(_, never) => match never {},
            #[cfg(feature = "mysql")]
            Exec::MySql(c) => typed::<MySql>(self.sql, &self.args)
                .fetch_optional(c)
                .await
                .map(|r| r.map(Row::MySql)),
            #[cfg(feature = "sqlite")]
            Exec::Sqlite(c) => typed::<Sqlite>(self.sql, &self.args)
                .fetch_optional(c)
                .await
                .map(|r| r.map(Row::Sqlite)),
            #[cfg(feature = "postgres")]
            Exec::Postgres(c) => typed::<Postgres>(self.sql, &self.args)
                .fetch_optional(c)
                .await
                .map(|r| r.map(Row::Postgres)),
        }
    }

    /// Runs a query that returns exactly one row.
    pub(crate) async fn fetch_one(self, on: impl Into<On<'_>>) -> Result<Row, sqlx::Error> {
        self.fetch_optional(on)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }
}

#[cfg(feature = "mysql")]
fn mysql_done(r: sqlx::mysql::MySqlQueryResult) -> Done {
    Done {
        rows_affected: r.rows_affected(),
        // 0: the statement produced no id (every id dlock asks for is at least 1).
        last_insert_id: Some(r.last_insert_id()).filter(|id| *id != 0),
    }
}

#[cfg(feature = "postgres")]
fn pg_done(r: sqlx::postgres::PgQueryResult) -> Done {
    Done {
        rows_affected: r.rows_affected(),
        last_insert_id: None,
    }
}

#[cfg(feature = "sqlite")]
fn sqlite_done(r: sqlx::sqlite::SqliteQueryResult) -> Done {
    Done {
        rows_affected: r.rows_affected(),
        last_insert_id: None,
    }
}

/// Opens the provider's pools for `config`: the statements' pool and, for `for-update`, the
/// pool of connections that hold row locks (autocommit off).
pub(crate) async fn connect(config: &SqlConfig) -> Result<(Pool, Option<Pool>), sqlx::Error> {
    match config.dialect {
        #[cfg(feature = "mysql")]
        Dialect::MySql => {
            let options = mysql_options(config)?;
            let pool = mysql_pool(config.pool, options.clone(), MYSQL_STATEMENTS).await?;
            let lock_pool = if config.strategy.pins_connections() {
                Some(mysql_pool(config.pool, options, MYSQL_LOCKS).await?)
            } else {
                None
            };
            Ok((pool, lock_pool))
        }
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => {
            let options = sqlite_options(config)?;
            crate::mounts::warn_if_shared(options.get_filename());
            // Several processes opening one new file at once race to switch it to WAL (the
            // first connection does): SQLite answers the loser BUSY at once, without its busy
            // timeout. Opening again finds the file in WAL mode.
            let give_up = dlock_core::backend::from_now(SETUP_PATIENCE);
            let mut pause = setup_pauses();
            loop {
                let opened = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(config.pool)
                    .test_before_acquire(false)
                    .acquire_timeout(POOL_WAIT)
                    .connect_with(options.clone())
                    .await;
                match opened {
                    Ok(pool) => return Ok((Pool::ours(Driver::Sqlite(pool)), None)),
                    Err(sqlx::Error::Database(db))
                        if crate::error::sqlite_busy(db.as_ref())
                            && tokio::time::Instant::now() < give_up =>
                    {
                        tracing::debug!(error = %db, "opening the SQLite file: trying again");
                        tokio::time::sleep(pause.next_pause()).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        #[cfg(feature = "postgres")]
        Dialect::Postgres => {
            use sqlx::ConnectOptions;
            let options = sqlx::postgres::PgConnectOptions::from_url(config.url.expose())?;
            let pool = pg_pool(config.pool, options.clone(), "2s").await?;
            let lock_pool = if config.strategy.pins_connections() {
                Some(pg_pool(config.pool, options, "5s").await?)
            } else {
                None
            };
            Ok((pool, lock_pool))
        }
        #[allow(unreachable_patterns)]
        _ => Err(sqlx::Error::Configuration(
            format!(
                "dlock-sql was built without the driver for {:?}",
                config.dialect
            )
            .into(),
        )),
    }
}

/// How long opening a database and setting up dlock's tables may retry a busy database.
pub(crate) const SETUP_PATIENCE: Duration = Duration::from_secs(10);

/// The pauses between two tries of a setup step on a busy database.
pub(crate) fn setup_pauses() -> dlock_core::backend::Backoff {
    dlock_core::backend::Backoff::new(Duration::from_millis(5), Duration::from_millis(200))
}

/// How long a statement waits for a pooled connection before the pool reports itself busy.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// The driver's options for a `mysql://` (or `mariadb://`) URL: the URL's own, with the
/// session time zone pinned to UTC (the lease arithmetic reads the server's clock through
/// `UNIX_TIMESTAMP`, which a local zone would shift around a daylight-saving change).
#[cfg(feature = "mysql")]
fn mysql_options(config: &SqlConfig) -> Result<sqlx::mysql::MySqlConnectOptions, sqlx::Error> {
    use sqlx::ConnectOptions;
    Ok(
        sqlx::mysql::MySqlConnectOptions::from_url(config.url.expose())?
            .timezone(Some("+00:00".to_owned())),
    )
}

/// The statements' pool: short statements only; one that waits on a row lock longer than
/// 2 s is answered as busy and retried by the caller.
#[cfg(feature = "mysql")]
const MYSQL_STATEMENTS: &[&str] = &["SET SESSION innodb_lock_wait_timeout = 2"];

/// The for-update pool: connections with autocommit off, one per held or waiting lock. Every
/// `SELECT … FOR UPDATE` opens a transaction that the release ends (ROLLBACK); a blocked one
/// gives up after 5 s and is tried again.
///
/// READ COMMITTED, so that a transaction locks its row and nothing else: under the default
/// REPEATABLE READ, a try on a name without a row yet locked the gap where the row goes, and
/// an acquirer that stopped right after that try (paused, cut off) kept every new name
/// sorting next to it from being created until the server dropped it (hours).
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_LOCKS: &[&str] = &[
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET autocommit = 0",
    "SET SESSION innodb_lock_wait_timeout = 5",
];

/// A MySQL pool whose connections run `session` when they open. No ping before a checkout: a
/// dead connection shows as a statement error, which is retried (and for a hold, reported as
/// a loss). sqlx 0.8 still pings every connection on its way back to the pool (review L8),
/// off the statement's path; an attempt runs all its statements on one checkout, so that is
/// one ping per attempt.
#[cfg(feature = "mysql")]
pub(crate) async fn mysql_pool(
    size: u32,
    options: sqlx::mysql::MySqlConnectOptions,
    session: &'static [&'static str],
) -> Result<Pool, sqlx::Error> {
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(size)
        .test_before_acquire(false)
        .acquire_timeout(POOL_WAIT)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                for statement in session {
                    conn.execute(*statement).await?;
                }
                Ok(())
            })
        })
        .connect_with(options)
        .await?;
    Ok(Pool::ours(Driver::MySql(pool)))
}

/// A PostgreSQL pool whose statements give up on a row lock after `lock_timeout` (they are
/// retried; the for-update pool sets its own bound per wait).
#[cfg(feature = "postgres")]
pub(crate) async fn pg_pool(
    size: u32,
    options: sqlx::postgres::PgConnectOptions,
    lock_timeout: &'static str,
) -> Result<Pool, sqlx::Error> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(size)
        .test_before_acquire(false)
        .acquire_timeout(POOL_WAIT)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                conn.execute(format!("SET lock_timeout = '{lock_timeout}'").as_str())
                    .await?;
                // A database or role that defaults to repeatable read would answer a waiter
                // granted behind another with a serialization error.
                conn.execute(
                    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
                )
                .await?;
                Ok(())
            })
        })
        .connect_with(options)
        .await?;
    Ok(Pool::ours(Driver::Postgres(pool)))
}

/// The driver's options for a `sqlite://` URL: the file by its path (never re-parsed as a
/// URL, so any directory name works), WAL, the busy timeout, and the driver parameters the
/// URL names.
#[cfg(feature = "sqlite")]
fn sqlite_options(config: &SqlConfig) -> Result<sqlx::sqlite::SqliteConnectOptions, sqlx::Error> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    let bad = |key: &str, value: &str, expected: &str| {
        sqlx::Error::Configuration(format!("{key}={value:?}: expected {expected}").into())
    };
    let path = config
        .sqlite_path()
        .map_err(|e| sqlx::Error::Configuration(e.to_string().into()))?;
    let mut options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(config.busy_timeout)
        .synchronous(if config.durable {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        });
    for (key, value) in config.url.expose().query_pairs() {
        options = match (&*key, &*value) {
            ("mode", "rwc") => options.create_if_missing(true),
            ("mode", "rw") => options.create_if_missing(false),
            ("mode", "ro") => options.create_if_missing(false).read_only(true),
            ("mode", v) => return Err(bad("mode", v, "rwc, rw or ro")),
            ("cache", "shared") => options.shared_cache(true),
            ("cache", "private") => options.shared_cache(false),
            ("cache", v) => return Err(bad("cache", v, "shared or private")),
            ("immutable", "true" | "1") => options.immutable(true),
            ("immutable", "false" | "0") => options.immutable(false),
            ("immutable", v) => return Err(bad("immutable", v, "true or false")),
            ("vfs", v) => options.vfs(v.to_owned()),
            (k, v) => return Err(bad(k, v, "no such SQLite parameter")),
        };
    }
    Ok(options)
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    /// A pool left alone gives its warm connection back to sqlx (whose idle limit then
    /// applies), and its reaper ends. Fails without the reaper: the connection stays out.
    #[tokio::test]
    async fn a_quiet_pool_gives_its_warm_connections_back() -> Result<(), Box<dyn std::error::Error>>
    {
        let path =
            std::env::temp_dir().join(format!("dlock-warm-{}.db", uuid::Uuid::new_v4().simple()));
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let sqlite = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await?;
        let pool = Pool::ours(Driver::Sqlite(sqlite.clone()));
        query("SELECT 1").execute(&pool).await?;
        assert_eq!((sqlite.size(), sqlite.num_idle()), (1, 0), "kept warm");
        dlock_conformance::eventually(
            Duration::from_secs(20),
            "the reaper gives the warm connection back to sqlx",
            || async {
                match sqlite.num_idle() {
                    1 => Ok(()),
                    n => Err(n),
                }
            },
        )
        .await;
        let warm = pool.warm.as_ref().ok_or("our pool keeps no connections")?;
        dlock_conformance::eventually(Duration::from_secs(10), "the reaper ends", || async {
            let state = warm.state();
            if state.reaping || !state.idle.is_empty() {
                Err((state.reaping, state.idle.len()))
            } else {
                Ok(())
            }
        })
        .await;
        drop(pool);
        sqlite.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        Ok(())
    }
}
