//! The pools behind the statements: sqlx's typed pool of one driver, and the few clean
//! connections dlock keeps warm in front of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::backend::{Mutex, from_now};
use sqlx::Executor;
use sqlx::pool::PoolConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[cfg(feature = "mysql")]
use sqlx::mysql::{MySql, MySqlPool};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgPool, Postgres};
#[cfg(feature = "_sqlite")]
use sqlx::sqlite::{Sqlite, SqlitePool};

use super::row::{Exec, Row};

/// A connection pool of one driver, with the few clean connections dlock keeps warm in
/// front of it (on the pools dlock opened itself).
///
/// sqlx 0.8 pings every connection its pool takes back, a round trip in a task of its own:
/// a lock cycle that gives back two connections costs two round trips more than its
/// statements. A connection whose statements all succeeded is instead kept (by
/// [`Conn::done`]; at most [`WARM_MAX`] while nobody waits) for dlock's next statement on the
/// pool. One idle longer
/// than [`WARM_IDLE`], or out of sqlx's pool longer than [`WARM_LIFETIME`], goes back to sqlx
/// after all (which pings it in its own task and applies its idle and lifetime limits), and a
/// pool that was closed serves none. A warm connection is never pinged on the caller's path: a
/// ping cancelled with its caller leaves MySQL's answer unread on the connection, which the
/// next statement would take for its own. Like sqlx's idle connections (dlock does not test
/// them before use), a warm one may have been closed by the server: the statement that finds
/// it dead gives the pool's other warm connections back to sqlx, and the caller retries on a
/// fresh one (an acquisition does so once at its deadline).
///
/// Nobody waits behind a kept connection: callers of [`Pool::acquire`] take turns, one per
/// connection sqlx may open, in the order they asked (a fair semaphore in front of sqlx's
/// pool), and a caller whose turn comes takes a warm connection before asking sqlx. A
/// connection done while callers wait for a turn is kept for them (as many as wait, past
/// [`WARM_MAX`]) and its turn passes to the next of them, so a pool busier than its size
/// (many tasks on one provider) passes its clean connections from one lock cycle to the next
/// without sqlx's ping between them. A caller with a turn asks sqlx only when no warm
/// connection is left: sqlx then has one idle, room to open one, or one given back that it is
/// still pinging or closing, for which the caller waits in sqlx's queue. The wait for a turn
/// and for sqlx's connection together is at most sqlx's acquire timeout. Every statement
/// dlock runs on the pool goes through [`Pool::acquire`]. An application's own pool
/// (`from_*_pool`) gets neither turns nor a cache: its other users wait in sqlx's queue, where
/// dlock cannot see them.
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
    #[cfg(feature = "_sqlite")]
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
    /// The caller's turn on a pool dlock opened, given up once the connection is kept or
    /// given to sqlx (which may still be pinging or closing it): fields drop in order, so
    /// after `raw`.
    _turn: Option<OwnedSemaphorePermit>,
    /// When it came out of sqlx's pool.
    out: Instant,
}

/// A connection of sqlx's pool.
#[derive(Debug)]
enum Raw {
    #[cfg(feature = "mysql")]
    MySql(PoolConnection<MySql>),
    #[cfg(feature = "_sqlite")]
    Sqlite(PoolConnection<Sqlite>),
    #[cfg(feature = "postgres")]
    Postgres(PoolConnection<Postgres>),
}

/// The most connections a pool keeps warm while no caller waits for a turn: a lock cycle
/// uses one at a time; the second serves a renewal or a fence that comes meanwhile.
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

/// The turns of a [`Pool`]'s callers, and the connections it keeps warm.
#[derive(Debug)]
pub(crate) struct Warm {
    driver: Driver,
    /// One permit per connection sqlx may open, held by each caller from its turn until its
    /// connection is kept or given to sqlx (a warm connection holds none; tokio's semaphore
    /// serves its waiters in order).
    turns: Arc<Semaphore>,
    state: Mutex<WarmState>,
}

#[derive(Debug, Default)]
struct WarmState {
    /// Clean connections, the newest last.
    idle: Vec<Kept>,
    /// Callers of [`Pool::acquire`] waiting for a turn (one whose turn came counts until its
    /// task runs again).
    waiting: usize,
    /// Whether a reaper task is running.
    reaping: bool,
}

impl Warm {
    /// Keeps a clean connection, unless the cache holds [`WARM_MAX`] or as many as callers
    /// wait for a turn, whichever is more; one out of sqlx's pool too long, or of a closed
    /// pool, goes back to sqlx. (The caller's turn passes on after this.)
    fn keep(self: &Arc<Self>, raw: Raw, out: Instant) {
        let (refused, reaper) = {
            let mut state = self.state.lock();
            if state.idle.len() < WARM_MAX.max(state.waiting)
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
                Err(_) => self.state.lock().reaping = false,
            }
        }
    }

    /// Gives every kept connection back to sqlx (which pings it and closes a dead one): one
    /// of them died, and the others may have died with it (a restarted server).
    fn purge(&self) {
        let idle = std::mem::take(&mut self.state.lock().idle);
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
            let mut state = warm.state.lock();
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
            warm.state.lock().reaping = false;
        }
    }
}

impl Drop for Warm {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut self.state.lock().idle);
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

/// Counts a caller of [`Pool::acquire`] as waiting for a turn while it lives.
struct Waiting<'w>(&'w Warm);

impl<'w> Waiting<'w> {
    fn new(warm: &'w Warm) -> Self {
        let mut state = warm.state.lock();
        state.waiting = state.waiting.saturating_add(1);
        Self(warm)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.waiting = state.waiting.saturating_sub(1);
    }
}

/// `$body` on the sqlx pool `$pool` of the [`Driver`] `$driver`, whichever its database
/// (the pools' methods are the same, their types are not).
macro_rules! on_pool {
    ($driver:expr, $pool:ident => $body:expr) => {
        match $driver {
            #[cfg(feature = "mysql")]
            Driver::MySql(ref $pool) => $body,
            #[cfg(feature = "_sqlite")]
            Driver::Sqlite(ref $pool) => $body,
            #[cfg(feature = "postgres")]
            Driver::Postgres(ref $pool) => $body,
        }
    };
}

impl Driver {
    /// The dialect of the driver's statements.
    pub(crate) fn dialect(&self) -> crate::config::Dialect {
        use crate::config::Dialect;
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(_) => Dialect::MySql,
            #[cfg(feature = "_sqlite")]
            Self::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Dialect::Postgres,
        }
    }

    async fn acquire(&self) -> Result<Raw, sqlx::Error> {
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref p) => p.acquire().await.map(Raw::MySql),
            #[cfg(feature = "_sqlite")]
            Self::Sqlite(ref p) => p.acquire().await.map(Raw::Sqlite),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref p) => p.acquire().await.map(Raw::Postgres),
        }
    }

    /// How long a caller waits for a connection of sqlx's pool.
    fn acquire_timeout(&self) -> Duration {
        on_pool!(*self, p => p.options().get_acquire_timeout())
    }

    /// The most connections sqlx's pool opens.
    fn max_connections(&self) -> u32 {
        on_pool!(*self, p => p.options().get_max_connections())
    }

    fn is_closed(&self) -> bool {
        on_pool!(*self, p => p.is_closed())
    }
}

impl Pool {
    /// A pool dlock opened: its callers take turns, and it keeps their clean connections
    /// warm.
    pub(crate) fn ours(driver: Driver) -> Self {
        Self {
            warm: Some(Arc::new(Warm {
                turns: Arc::new(Semaphore::new(
                    usize::try_from(driver.max_connections())
                        .map_or(Semaphore::MAX_PERMITS, |n| n.min(Semaphore::MAX_PERMITS)),
                )),
                driver: driver.clone(),
                state: Mutex::default(),
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

    /// A connection for a few statements in a row, once the caller's turn comes (on a pool
    /// dlock opened): a warm one if the pool keeps one, else one of sqlx's. A wait for both
    /// longer than sqlx's acquire timeout is sqlx's `PoolTimedOut`.
    pub(crate) async fn acquire(&self) -> Result<Conn, sqlx::Error> {
        let Some(warm) = &self.warm else {
            return Ok(Conn {
                raw: self.driver.acquire().await?,
                warm: None,
                _turn: None,
                out: Instant::now(),
            });
        };
        let deadline = from_now(self.driver.acquire_timeout());
        let turn = match Arc::clone(&warm.turns).try_acquire_owned() {
            Ok(turn) => turn,
            Err(_) => {
                let _waiting = Waiting::new(warm);
                let turn = Arc::clone(&warm.turns).acquire_owned();
                match tokio::time::timeout_at(deadline, turn).await {
                    Ok(Ok(turn)) => turn,
                    // The turns are never closed; a closed pool is sqlx's to say.
                    Ok(Err(_)) => return Err(sqlx::Error::PoolClosed),
                    Err(_) => return Err(sqlx::Error::PoolTimedOut),
                }
            }
        };
        let (kept, stale) = {
            let mut state = warm.state.lock();
            match state.idle.pop() {
                Some(kept) if kept.kept.elapsed() < WARM_IDLE && !self.driver.is_closed() => {
                    (Some(kept), Vec::new())
                }
                newest => {
                    // Nothing to serve (the newest is idle too long, so are the others, or
                    // the pool was closed): every kept connection goes back to sqlx.
                    let mut stale = std::mem::take(&mut state.idle);
                    stale.extend(newest);
                    (None, stale)
                }
            }
        };
        drop(stale);
        let (raw, out) = match kept {
            Some(kept) => (kept.raw, kept.out),
            // With a turn, sqlx has a connection idle or room to open one, or one given back
            // that it is still pinging or closing.
            None => match tokio::time::timeout_at(deadline, self.driver.acquire()).await {
                Ok(raw) => (raw?, Instant::now()),
                Err(_) => return Err(sqlx::Error::PoolTimedOut),
            },
        };
        Ok(Conn {
            raw,
            warm: Some(Arc::clone(warm)),
            _turn: Some(turn),
            out,
        })
    }

    /// The most connections the pool opens.
    pub(crate) fn max_connections(&self) -> u32 {
        self.driver.max_connections()
    }

    /// Whether every connection the pool may open is open and checked out: the pool is
    /// exhausted, not merely slow to open a connection. A warm connection is not in use.
    pub(crate) fn all_in_use(&self) -> bool {
        let (size, idle): (u32, usize) = on_pool!(self.driver, p => (p.size(), p.num_idle()));
        let warm = self.warm.as_ref().map_or(0, |w| w.state.lock().idle.len());
        size >= self.max_connections() && idle == 0 && warm == 0
    }

    /// Runs statements without arguments or preparation (DDL).
    pub(crate) async fn raw(&self, sql: &str) -> Result<(), sqlx::Error> {
        let mut conn = self.acquire().await?;
        let r = match conn.exec() {
            #[cfg(not(any(feature = "mysql", feature = "_sqlite", feature = "postgres")))]
            Exec::Unused(_, never) => match never {},
            #[cfg(feature = "mysql")]
            Exec::MySql(c) => c.execute(sql).await.map(drop),
            #[cfg(feature = "_sqlite")]
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
            #[cfg(feature = "_sqlite")]
            Self::Sqlite(ref mut c) => c.ping().await,
            #[cfg(feature = "postgres")]
            Self::Postgres(ref mut c) => c.ping().await,
        }
    }

    fn close_on_drop(&mut self) {
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref mut c) => c.close_on_drop(),
            #[cfg(feature = "_sqlite")]
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
            #[cfg(feature = "_sqlite")]
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
            #[cfg(not(any(feature = "mysql", feature = "_sqlite", feature = "postgres")))]
            Exec::Unused(_, never) => match never {},
            #[cfg(feature = "mysql")]
            Exec::MySql(c) => c
                .fetch_all(sql)
                .await
                .map(|rows| rows.into_iter().map(Row::MySql).collect()),
            #[cfg(feature = "_sqlite")]
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
    pub(super) fn exec(&mut self) -> Exec<'_> {
        match self.raw {
            #[cfg(feature = "mysql")]
            Raw::MySql(ref mut c) => Exec::MySql(c),
            #[cfg(feature = "_sqlite")]
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

    /// Takes the connection out of sqlx's pool and closes it, with no tokio runtime needed
    /// (sqlx needs one to take a connection back): the pool's slot is free for a new one, and
    /// the server ends whatever the connection held when it sees the socket close.
    pub(crate) fn detach(self) {
        self.raw.detach();
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
    pub(super) fn after<T>(mut self, r: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        let r = self.check(r);
        if r.is_ok() {
            self.done();
        }
        r
    }

    /// After a statement on this connection: if it failed because the connection is gone,
    /// the pool's warm connections are given back to sqlx (they may have gone with it, as
    /// when the server restarted), and this one is not kept. Passes the result on.
    pub(super) fn check<T>(&mut self, r: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if let Err(e) = &r
            && crate::error::connection_lost(e)
            && let Some(warm) = self.warm.take()
        {
            warm.purge();
        }
        r
    }
}

#[cfg(all(test, feature = "_sqlite"))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Longer than any wait of these tests should last.
    const WAIT: Duration = Duration::from_secs(10);

    /// A SQLite pool of `size` connections that waits `wait` for one and counts the
    /// connections sqlx takes back and those it opens, its file, and dlock's pool on it.
    async fn sqlite_pool(
        size: u32,
        wait: Duration,
    ) -> Result<
        (
            sqlx::SqlitePool,
            Pool,
            Arc<AtomicUsize>,
            Arc<AtomicUsize>,
            std::path::PathBuf,
        ),
        Box<dyn std::error::Error>,
    > {
        let path =
            std::env::temp_dir().join(format!("dlock-warm-{}.db", uuid::Uuid::new_v4().simple()));
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let (returned, opened) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (returns, opens) = (Arc::clone(&returned), Arc::clone(&opened));
        let sqlite = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(size)
            .acquire_timeout(wait)
            .after_release(move |_, _| {
                returns.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok(true) })
            })
            .after_connect(move |_, _| {
                opens.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok(()) })
            })
            .connect_with(options)
            .await?;
        let pool = Pool::ours(Driver::Sqlite(sqlite.clone()));
        Ok((sqlite, pool, returned, opened, path))
    }

    /// Waits until `n` callers of `pool`'s [`Pool::acquire`] wait for a turn.
    async fn until_waiting(pool: &Pool, n: usize) {
        let Some(warm) = pool.warm.clone() else {
            panic!("our pool keeps no connections");
        };
        dlock_conformance::eventually(Duration::from_secs(10), "callers wait", || {
            let warm = Arc::clone(&warm);
            async move {
                match warm.state.lock().waiting {
                    w if w == n => Ok(()),
                    w => Err(w),
                }
            }
        })
        .await;
    }

    /// Closes `pool` and its SQLite pool, and removes its file.
    async fn remove(pool: Pool, sqlite: sqlx::SqlitePool, path: &std::path::Path) {
        drop(pool);
        sqlite.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }

    /// Clean connections done while callers wait for a turn stay warm for them, more than
    /// [`WARM_MAX`] if more wait: sqlx never takes one back (so never pings it). Fails if
    /// they go back through sqlx's queue, or if the cache stops at `WARM_MAX` while callers
    /// wait (sqlx takes the third back).
    #[tokio::test]
    async fn clean_connections_go_to_the_callers_waiting() -> Result<(), Box<dyn std::error::Error>>
    {
        let (sqlite, pool, returned, _, path) = sqlite_pool(3, WAIT).await?;
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(pool.acquire().await?);
        }
        let mut waiters = Vec::new();
        for _ in 0..3 {
            let pool = pool.clone();
            waiters.push(tokio::spawn(async move { pool.acquire().await }));
        }
        until_waiting(&pool, 3).await;
        // All three given back before any waiter runs again.
        for conn in held {
            conn.done();
        }
        let mut served = Vec::new();
        for waiter in waiters {
            served.push(tokio::time::timeout(WAIT, waiter).await???);
        }
        assert_eq!(returned.load(Ordering::SeqCst), 0, "sqlx took one back");
        served.into_iter().for_each(Conn::done);
        until_waiting(&pool, 0).await;
        remove(pool, sqlite, &path).await;
        Ok(())
    }

    /// A caller that stops waiting for its turn (dropped) holds up nobody: the connection
    /// done after it goes straight to the next caller. Fails if the dropped caller's turn is
    /// lost (the next one would wait out its timeout).
    #[tokio::test]
    async fn a_caller_that_stopped_waiting_holds_up_nobody()
    -> Result<(), Box<dyn std::error::Error>> {
        let (sqlite, pool, returned, _, path) = sqlite_pool(1, Duration::from_secs(30)).await?;
        let first = pool.acquire().await?;
        let gone = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire().await.map(Conn::done) }
        });
        until_waiting(&pool, 1).await;
        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire().await.map(Conn::done) }
        });
        until_waiting(&pool, 2).await;
        gone.abort();
        assert!(
            gone.await.is_err_and(|e| e.is_cancelled()),
            "the first caller was served"
        );
        until_waiting(&pool, 1).await;
        first.done();
        tokio::time::timeout(WAIT, waiter).await???;
        assert_eq!(returned.load(Ordering::SeqCst), 0, "sqlx took it back");
        let again = tokio::time::timeout(WAIT, pool.acquire()).await??;
        again.done();
        remove(pool, sqlite, &path).await;
        Ok(())
    }

    /// A connection closed while a caller waits for a turn: the turn passes on, and the
    /// caller waits in sqlx's queue until sqlx has closed the old connection, then opens one
    /// in its place. Fails if a close loses the turn, or if more than one is opened.
    #[tokio::test]
    async fn a_closed_connection_makes_room_for_the_next() -> Result<(), Box<dyn std::error::Error>>
    {
        let (sqlite, pool, _, opened, path) = sqlite_pool(1, WAIT).await?;
        let mut first = pool.acquire().await?;
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire().await.map(Conn::done) }
        });
        until_waiting(&pool, 1).await;
        first.close_on_drop();
        drop(first);
        tokio::time::timeout(WAIT, waiter).await???;
        assert_eq!(
            opened.load(Ordering::SeqCst),
            2,
            "one connection in the closed one's place"
        );
        remove(pool, sqlite, &path).await;
        Ok(())
    }

    /// A caller whose turn does not come within the pool's wait for a connection is told the
    /// pool timed out, as sqlx tells it, and no longer counts as waiting. Fails if the turn's
    /// wait has no bound (the test's own timeout ends it) or says something else.
    #[tokio::test]
    async fn a_turn_that_does_not_come_is_a_timeout() -> Result<(), Box<dyn std::error::Error>> {
        let (sqlite, pool, _, _, path) = sqlite_pool(1, Duration::from_millis(200)).await?;
        let first = pool.acquire().await?;
        let waited = tokio::time::timeout(WAIT, pool.acquire()).await?;
        assert!(
            matches!(waited, Err(sqlx::Error::PoolTimedOut)),
            "not a pool timeout: {waited:?}"
        );
        until_waiting(&pool, 0).await;
        first.done();
        remove(pool, sqlite, &path).await;
        Ok(())
    }

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
        pool.raw("SELECT 1").await?;
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
            let state = warm.state.lock();
            if state.reaping || !state.idle.is_empty() {
                Err((state.reaping, state.idle.len()))
            } else {
                Ok(())
            }
        })
        .await;
        remove(pool, sqlite, &path).await;
        Ok(())
    }
}
