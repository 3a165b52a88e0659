//! The pools behind the statements: sqlx's typed pool of one driver, and the few clean
//! connections dlock keeps warm in front of it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::backend::Mutex;
use sqlx::Executor;
use sqlx::pool::PoolConnection;
use tokio::sync::oneshot;

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
/// a clean connection done while callers of [`Pool::acquire`] wait goes straight to the one
/// that has waited longest (it stops waiting in sqlx's queue), one is kept only while none
/// waits, and every statement dlock runs on the pool goes through [`Pool::acquire`]. So a pool
/// busier than its size (many tasks on one provider) passes its connections from one lock
/// cycle to the next without sqlx's ping between them. An application's own pool
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
    state: Mutex<WarmState>,
}

#[derive(Debug, Default)]
struct WarmState {
    /// Clean connections, the newest last.
    idle: Vec<Kept>,
    /// Callers of [`Pool::acquire`] waiting in sqlx's queue.
    waiting: usize,
    /// Where to hand a clean connection to each of those callers, the longest waiting first
    /// (a caller that stopped waiting, served by sqlx or dropped, has closed its end).
    handoffs: VecDeque<oneshot::Sender<Kept>>,
    /// Whether a reaper task is running.
    reaping: bool,
}

impl Warm {
    /// Keeps a clean connection: hands it to the caller that has waited longest, or, when
    /// none waits, keeps it warm unless the cache is full. One out of sqlx's pool too long,
    /// or of a closed pool, goes back to sqlx.
    fn keep(self: &Arc<Self>, raw: Raw, out: Instant) {
        let (refused, reaper) = {
            let mut state = self.state.lock();
            let mut kept = Kept {
                raw,
                out,
                kept: Instant::now(),
            };
            if out.elapsed() >= WARM_LIFETIME || self.driver.is_closed() {
                (Some(kept.raw), false)
            } else {
                loop {
                    let Some(handoff) = state.handoffs.pop_front() else {
                        break;
                    };
                    match handoff.send(kept) {
                        Ok(()) => return,
                        // That caller stopped waiting: the next one.
                        Err(back) => kept = back,
                    }
                }
                if state.waiting == 0 && state.idle.len() < WARM_MAX {
                    state.idle.push(kept);
                    (None, !std::mem::replace(&mut state.reaping, true))
                } else {
                    // Every waiting caller was handed one already and has yet to wake
                    // (it stops counting then): sqlx keeps this one for the next.
                    (Some(kept.raw), false)
                }
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

/// A caller of [`Pool::acquire`] waiting in sqlx's queue, counted while it lives, with the
/// end a clean connection may be handed to it on.
struct Waiting<'w> {
    warm: &'w Arc<Warm>,
    handoff: Option<oneshot::Receiver<Kept>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // A connection handed to a caller that was served by sqlx meanwhile (or dropped)
        // goes on to the next one waiting.
        let handed = self.handoff.as_mut().and_then(|handoff| {
            handoff.close();
            handoff.try_recv().ok()
        });
        {
            let mut state = self.warm.state.lock();
            state.waiting = state.waiting.saturating_sub(1);
            state.handoffs.retain(|handoff| !handoff.is_closed());
        }
        if let Some(kept) = handed {
            if tokio::runtime::Handle::try_current().is_ok() {
                self.warm.keep(kept.raw, kept.out);
            } else {
                // sqlx needs a runtime to take a connection back (see `Warm`'s drop).
                kept.raw.detach();
            }
        }
    }
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

    /// Whether every connection the pool may open is open or opening.
    fn is_full(&self) -> bool {
        let size = match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref p) => p.size(),
            #[cfg(feature = "_sqlite")]
            Self::Sqlite(ref p) => p.size(),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref p) => p.size(),
        };
        size >= self.max_connections()
    }

    fn max_connections(&self) -> u32 {
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref p) => p.options().get_max_connections(),
            #[cfg(feature = "_sqlite")]
            Self::Sqlite(ref p) => p.options().get_max_connections(),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref p) => p.options().get_max_connections(),
        }
    }

    fn is_closed(&self) -> bool {
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref p) => p.is_closed(),
            #[cfg(feature = "_sqlite")]
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
            let mut state = warm.state.lock();
            match state.idle.pop() {
                Some(kept) if kept.kept.elapsed() < WARM_IDLE && !self.driver.is_closed() => {
                    (Ok(kept), Vec::new())
                }
                newest => {
                    // Nothing to serve (the newest is idle too long, so are the others, or
                    // the pool was closed): every kept connection goes back to sqlx. Counted
                    // as waiting under the same lock that keeps connections: a connection
                    // done from now on is handed to a waiting caller or goes to sqlx's
                    // queue, where this caller waits too.
                    let mut stale = std::mem::take(&mut state.idle);
                    stale.extend(newest);
                    state.waiting = state.waiting.saturating_add(1);
                    // A caller is handed a connection only if sqlx has no room to open one
                    // for it: one that sqlx lets open a connection would drop it half-open
                    // when handed another (and the next would open one again).
                    let handed = self.driver.is_full().then(|| {
                        let (handoff, handed) = oneshot::channel();
                        state.handoffs.push_back(handoff);
                        handed
                    });
                    (Err(handed), stale)
                }
            }
        };
        drop(stale);
        let kept = match kept {
            Ok(kept) => kept,
            Err(handoff) => {
                let mut waiting = Waiting { warm, handoff };
                let handed = async {
                    match waiting.handoff.as_mut() {
                        Some(handoff) => match handoff.await {
                            Ok(kept) => kept,
                            Err(_) => std::future::pending().await,
                        },
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    kept = handed => kept,
                    raw = self.driver.acquire() => {
                        return Ok(from_sqlx(raw?, Some(Arc::clone(warm))));
                    }
                }
            }
        };
        Ok(Conn {
            raw: kept.raw,
            warm: Some(Arc::clone(warm)),
            out: kept.out,
        })
    }

    /// The most connections the pool opens.
    pub(crate) fn max_connections(&self) -> u32 {
        self.driver.max_connections()
    }

    /// Whether every connection the pool may open is open and checked out: the pool is
    /// exhausted, not merely slow to open a connection. A warm connection is not in use.
    pub(crate) fn all_in_use(&self) -> bool {
        let (size, idle): (u32, usize) = match self.driver {
            #[cfg(feature = "mysql")]
            Driver::MySql(ref p) => (p.size(), p.num_idle()),
            #[cfg(feature = "_sqlite")]
            Driver::Sqlite(ref p) => (p.size(), p.num_idle()),
            #[cfg(feature = "postgres")]
            Driver::Postgres(ref p) => (p.size(), p.num_idle()),
        };
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

    /// A SQLite pool of one connection that counts the connections sqlx takes back, its
    /// file, and dlock's pool on it.
    async fn one_connection() -> Result<
        (sqlx::SqlitePool, Pool, Arc<AtomicUsize>, std::path::PathBuf),
        Box<dyn std::error::Error>,
    > {
        let path =
            std::env::temp_dir().join(format!("dlock-warm-{}.db", uuid::Uuid::new_v4().simple()));
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let returned = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&returned);
        let sqlite = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .after_release(move |_, _| {
                counter.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok(true) })
            })
            .connect_with(options)
            .await?;
        let pool = Pool::ours(Driver::Sqlite(sqlite.clone()));
        Ok((sqlite, pool, returned, path))
    }

    /// Waits until `n` callers of `pool`'s [`Pool::acquire`] wait in sqlx's queue.
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

    async fn remove(sqlite: sqlx::SqlitePool, path: &std::path::Path) {
        sqlite.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }

    /// A clean connection done while a caller waits for one goes straight to that caller:
    /// sqlx never takes it back (so never pings it). Fails if it goes through sqlx's queue.
    #[tokio::test]
    async fn a_clean_connection_goes_to_the_caller_waiting()
    -> Result<(), Box<dyn std::error::Error>> {
        let (sqlite, pool, returned, path) = one_connection().await?;
        let first = pool.acquire().await?;
        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire().await.map(Conn::done) }
        });
        until_waiting(&pool, 1).await;
        first.done();
        tokio::time::timeout(Duration::from_secs(10), waiter).await???;
        assert_eq!(returned.load(Ordering::SeqCst), 0, "sqlx took it back");
        until_waiting(&pool, 0).await;
        remove(sqlite, &path).await;
        Ok(())
    }

    /// A caller that stops waiting (dropped) is skipped: the connection done after it goes
    /// straight to the next caller. Fails if the handoff of a dropped caller takes it (it
    /// would go back through sqlx).
    #[tokio::test]
    async fn a_caller_that_stopped_waiting_is_skipped() -> Result<(), Box<dyn std::error::Error>> {
        let (sqlite, pool, returned, path) = one_connection().await?;
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
        tokio::time::timeout(Duration::from_secs(10), waiter).await???;
        assert_eq!(returned.load(Ordering::SeqCst), 0, "sqlx took it back");
        let again = tokio::time::timeout(Duration::from_secs(10), pool.acquire()).await??;
        again.done();
        remove(sqlite, &path).await;
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
        drop(pool);
        remove(sqlite, &path).await;
        Ok(())
    }
}
