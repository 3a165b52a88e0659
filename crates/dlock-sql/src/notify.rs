//! PostgreSQL wake-ups: a release `NOTIFY`s the lock's name on the provider's channel, and
//! one listening connection per provider (from its first wait on, until nobody in the process
//! has waited on its tables for [`LISTEN_IDLE`]) wakes the waiters of that name in this
//! process, so a waiter takes a freed lock at once instead of at its next poll.
//!
//! Waiters still poll with their capped backoff: a notification lost with the listening
//! connection, or a holder that died (its row expires, nobody notifies), costs at most one
//! pause. A notification wakes one waiter of the name (a mutex has one winner); the others
//! keep their places until the next one. Releases made in this process wake their waiters
//! directly too ([`crate::wake`]), without the round trip through the server.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_core::backend::Backoff;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::wake;

/// How long a provider goes on listening after the last waiter of its tables in this process
/// stopped waiting. A listening session is sent every release on the tables, waited for or
/// not, so a provider that listened for ever after one wait would read and drop every other
/// client's releases for the rest of its life; one that stopped at once would open a session
/// and say `LISTEN` again at each spell of contention.
pub(crate) const LISTEN_IDLE: Duration = Duration::from_secs(60);

/// The channel a provider's releases are announced on: one per set of tables.
pub(crate) fn channel(table: &str) -> String {
    format!("{table}_release")
}

/// The listening task of one provider, and what it received; the waiters it wakes are in
/// [`crate::wake`], under the provider's store id.
#[derive(Debug)]
pub(crate) struct Wakeups {
    store: String,
    /// Where this process's releases on the store come from ([`wake::origin`]).
    origin: String,
    /// Notifications received (for tests and diagnostics).
    received: AtomicU64,
    /// Whether the listening session has said `LISTEN` (for tests and diagnostics).
    listening: AtomicBool,
    /// Whether a listening task runs, what the next one needs, and when a waiter last began
    /// to wait: every wait ([`listen`](Self::listen)) and every stop
    /// ([`retire`](Self::retire)) goes through this lock.
    state: Mutex<State>,
    /// How long a task goes on listening without waiters ([`LISTEN_IDLE`]).
    idle_after: Duration,
    /// Dropped with the provider: ends the listening task.
    stop: watch::Sender<()>,
}

/// What a listening task needs.
#[derive(Debug, Clone)]
struct Idle {
    options: PgConnectOptions,
    channel: String,
}

/// [`Wakeups`]' state under its lock.
#[derive(Debug)]
struct State {
    /// What the next listening task needs; `None` while one runs.
    idle: Option<Idle>,
    /// When a waiter last began to wait ([`Wakeups::listen`]).
    last_wait: Instant,
}

impl Wakeups {
    /// Wake-ups for `store`, listening on `channel` on a connection of its own (opened with
    /// `options`, and again after it breaks) from the first wait of one of its waiters
    /// ([`listen`](Self::listen)) until no waiter of `store` has waited in this process for
    /// about `idle_after`, and again from the next wait; never after the returned value is
    /// dropped.
    ///
    /// Not before: every release on the channel is sent to every session listening on it,
    /// so a provider that listened from the start would make the server deliver, and its
    /// client read and drop, every release of every other client, waited for or not (eight
    /// providers cycling on their own names made half the cycles of the same statements
    /// without listeners).
    pub(crate) fn new(
        options: PgConnectOptions,
        channel: String,
        store: String,
        idle_after: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            origin: wake::origin(&store),
            store,
            received: AtomicU64::new(0),
            listening: AtomicBool::new(false),
            state: Mutex::new(State {
                idle: Some(Idle { options, channel }),
                last_wait: Instant::now(),
            }),
            idle_after,
            stop: watch::channel(()).0,
        })
    }

    /// Notes a wait of a waiter of this provider (called after the waiter registered in
    /// [`wake`]) and starts listening unless a listening task runs: a release announced
    /// before the `LISTEN` took effect is not lost, since the listening task wakes every
    /// waiter of the store to look again once it listens. Outside a tokio runtime nothing
    /// starts (the next wait in one starts it).
    pub(crate) fn listen(self: &Arc<Self>) {
        let mut state = self.state();
        state.last_wait = Instant::now();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(idle) = state.idle.take() else {
            return;
        };
        drop(state);
        let running = Running {
            wakeups: Arc::downgrade(self),
            idle: Some(idle.clone()),
        };
        drop(runtime.spawn(run(running, idle, self.stop.subscribe())));
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a listening task runs (for tests).
    #[cfg(test)]
    fn started(&self) -> bool {
        self.state().idle.is_none()
    }

    /// Stops listening if no waiter of the store waits in this process and none began to
    /// wait for the idle period: gives back what the next task needs and says `true`; the
    /// caller's task then ends. Under the lock every [`listen`](Self::listen) takes after its
    /// waiter registered: either the waiter is seen here and the task goes on, or its
    /// `listen` comes after this and starts a new task.
    fn retire(&self, idle: &Idle) -> bool {
        let mut state = self.state();
        if wake::has_waiters(&self.store) || state.last_wait.elapsed() < self.idle_after {
            return false;
        }
        state.idle = Some(idle.clone());
        self.listening.store(false, Ordering::Relaxed);
        true
    }

    /// Whether the listening session has said `LISTEN` (and not lost its connection since).
    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// Notifications received so far.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Wakes a waiter of the name a release announced (in hex, then `/` and its origin),
    /// unless the release was made in this process on this store (it woke a waiter already).
    fn wake(&self, payload: &str) {
        self.received.fetch_add(1, Ordering::Relaxed);
        if let Some(name) = released_elsewhere(payload, &self.origin) {
            wake::wake(&self.store, &name);
        }
    }

    /// After the listening connection broke: notifications may have been missed, so every
    /// waiter looks again.
    fn wake_all(&self) {
        wake::wake_all(&self.store);
    }
}

/// A listening task's claim on its provider's [`State`]: a task that ends without
/// [`Wakeups::retire`] (cancelled with its runtime) gives back what the next task needs, so
/// that the provider's next wait starts one.
struct Running {
    wakeups: Weak<Wakeups>,
    /// `None` once retired.
    idle: Option<Idle>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let (Some(idle), Some(w)) = (self.idle.take(), self.wakeups.upgrade()) {
            let mut state = w.state();
            if state.idle.is_none() {
                state.idle = Some(idle);
            }
            w.listening.store(false, Ordering::Relaxed);
        }
    }
}

/// The name a release announced in `payload`, unless it comes from `origin`. An older dlock
/// announced the name alone.
fn released_elsewhere(payload: &str, origin: &str) -> Option<String> {
    let (hex, from) = payload.split_once('/').unwrap_or((payload, ""));
    if from == origin {
        return None;
    }
    from_hex(hex)
}

/// The name a release announced: UTF-8 in hex (`encode(name, 'hex')`); `None` if it is not.
fn from_hex(hex: &str) -> Option<String> {
    let digits = hex.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let bytes = digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(text, 16).ok()
        })
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// A listening task: [`listen`] until the provider is dropped, or until no waiter of its
/// store has waited in this process for its `idle_after` ([`Wakeups::retire`]).
async fn run(mut running: Running, idle: Idle, mut stopped: watch::Receiver<()>) {
    let Idle { options, channel } = &idle;
    let wakeups = Weak::clone(&running.wakeups);
    // A pool of one connection, with no idle or lifetime limit: the listener's own, never one
    // of the application's. A listening session sends nothing while nothing is released: a
    // role's `idle_session_timeout` (PostgreSQL 14+, which managed services set) would end it
    // every few minutes and lose what was announced meanwhile, so the session turns it off
    // (older servers do not know the setting: the error is ignored).
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .after_connect(|conn, _| {
            Box::pin(async move {
                use sqlx::Executor as _;
                if let Err(e) = conn.execute("SET idle_session_timeout = 0").await {
                    tracing::debug!(error = %e, "the listening session keeps the server's idle timeout");
                }
                Ok(())
            })
        })
        .connect_lazy_with(options.clone());
    // Ends when the provider is dropped (the sender with it).
    let dropped = async move { while stopped.changed().await.is_ok() {} };
    tokio::select! {
        () = dropped => {}
        () = retire_when_idle(&wakeups, &idle) => running.idle = None,
        () = listen(&wakeups, &pool, channel) => {}
    }
    drop(running);
    // The session ends with the task (sqlx gives the listener's connection back to the pool
    // after an `UNLISTEN *`, in a task of its own): close it rather than leave it idle.
    if tokio::time::timeout(Duration::from_secs(5), pool.close())
        .await
        .is_err()
    {
        tracing::debug!(
            channel,
            "release notifications: the listening session did not close within 5 s"
        );
    }
}

/// Completes once the listening was given up ([`Wakeups::retire`]): no waiter of the store
/// waits in this process, none began to wait for the provider's `idle_after`, and none was
/// seen waiting for as long (looked at eight times per period: a wait that began earlier
/// and ended between two looks may let it end up to an eighth early). Pends once the
/// provider is gone (the task's other branch then ends it).
async fn retire_when_idle(wakeups: &Weak<Wakeups>, idle: &Idle) {
    let mut busy_at = Instant::now();
    loop {
        let Some(w) = wakeups.upgrade() else {
            return std::future::pending().await;
        };
        let idle_after = w.idle_after;
        if wake::has_waiters(&w.store) {
            busy_at = Instant::now();
        } else if busy_at.elapsed() >= idle_after && w.retire(idle) {
            tracing::debug!(
                channel = idle.channel,
                "release notifications: nobody waits; not listening"
            );
            return;
        }
        drop(w);
        tokio::time::sleep((idle_after / 8).max(Duration::from_millis(10))).await;
    }
}

/// `LISTEN`s on `channel` with a connection of `pool` and wakes the waiters of each name
/// notified, connecting again (with a growing pause) whenever the connection breaks; ends
/// only if the provider is gone. Cancel safe: dropped, the listener gives its connection back
/// to `pool`.
async fn listen(wakeups: &Weak<Wakeups>, pool: &sqlx::PgPool, channel: &str) {
    let mut pause = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let mut listened = false;
        let session = async {
            let mut listener = PgListener::connect_with(pool).await?;
            listener.listen(channel).await?;
            listened = true;
            // Listening (again, after a break, or for the first time, after waiters began to
            // wait): whatever was released meanwhile is looked at.
            if let Some(w) = wakeups.upgrade() {
                w.listening.store(true, Ordering::Relaxed);
                w.wake_all();
            }
            loop {
                match listener.try_recv().await? {
                    Some(n) => match wakeups.upgrade() {
                        Some(w) => w.wake(n.payload()),
                        None => return Ok::<(), sqlx::Error>(()),
                    },
                    // The connection broke (and was opened again, listening again): anything
                    // sent meanwhile is lost.
                    None => match wakeups.upgrade() {
                        Some(w) => w.wake_all(),
                        None => return Ok(()),
                    },
                }
            }
        };
        match session.await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(channel, error = %e, "release notifications: listening again");
                if let Some(w) = wakeups.upgrade() {
                    w.listening.store(false, Ordering::Relaxed);
                    w.wake_all();
                }
            }
        }
        if listened {
            // It worked for a while: the next break starts with a short pause again.
            pause.reset();
        }
        pause.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;
    use std::sync::Arc;
    use std::time::Duration;

    use sqlx::postgres::PgConnectOptions;

    use super::{Wakeups, from_hex, released_elsewhere};
    use crate::wake;

    /// The idle period of the test's listener.
    const IDLE: Duration = Duration::from_secs(1);

    /// Polls `check` every 10 ms until it holds; panics with `what` after 10 s.
    async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
        let deadline = dlock_core::backend::Deadline::after(Duration::from_secs(10));
        while !check().await {
            assert!(!deadline.has_passed(), "not within 10 s: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A provider listens while a waiter of its tables waits, also longer than its idle
    /// period, and while short waits keep coming (each over before the task looks); stops
    /// listening (its session gone from the server) once nobody has waited for its idle
    /// period; and listens again at the next wait, reading what another client announces.
    /// The old listener never stopped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_listener_stops_without_waiters_and_starts_again_with_one() {
        let Some(url) = dlock_conformance::service_url("DLOCK_POSTGRES_URL") else {
            return;
        };
        let app = format!("dlock-idle-test-{}", std::process::id());
        let options = PgConnectOptions::from_str(&url).expect("the URL is a PostgreSQL one");
        let server = sqlx::PgPool::connect_with(options.clone())
            .await
            .expect("connect");
        let options = options.application_name(&app);
        let channel = format!("dlock_idle_test_{}_release", std::process::id());
        let store = format!("notify-idle-test/{}", std::process::id());
        let wakeups = Wakeups::new(options, channel.clone(), store.clone(), IDLE);
        let pid = || {
            let server = server.clone();
            let app = app.clone();
            async move {
                sqlx::query_scalar::<_, i32>(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(app)
                .fetch_one(&server)
                .await
                .expect("the listening session's pid")
            }
        };
        // The listener's sessions on the server: (all, those whose last statement was LISTEN).
        let sessions = || {
            let server = server.clone();
            let app = app.clone();
            async move {
                sqlx::query_as::<_, (i64, i64)>(
                    "SELECT COUNT(*), COUNT(*) FILTER (WHERE query LIKE 'LISTEN %') \
                     FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(app)
                .fetch_one(&server)
                .await
                .expect("count the listening sessions")
            }
        };
        let announce = |name: &'static str| {
            let server = server.clone();
            let channel = channel.clone();
            async move {
                let payload = format!("{}/another-process", hex(name));
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(channel)
                    .bind(payload)
                    .execute(&server)
                    .await
                    .expect("notify");
            }
        };
        for round in 0..2 {
            let waiting = wake::register(&store, "n");
            wakeups.listen();
            let w = Arc::clone(&wakeups);
            eventually(&format!("round {round}: listening"), async || {
                w.listening() && sessions().await == (1, 1)
            })
            .await;
            // (The waiter itself is woken by the listener's start too: count what it read.)
            let before = w.received();
            announce("n").await;
            eventually(
                &format!("round {round}: the release announced"),
                async || w.received() > before,
            )
            .await;
            if round == 0 {
                let session = pid().await;
                // A wait two idle periods long keeps it listening, on the same session.
                tokio::time::sleep(IDLE * 2).await;
                assert!(w.started() && w.listening(), "stopped during a long wait");
                assert_eq!(pid().await, session, "listening again during a long wait");
                drop(waiting);
                // So do short waits, one every quarter period, each over at once (the margin
                // is for a loaded machine's late timers).
                for _ in 0..8 {
                    drop(wake::register(&store, "n"));
                    wakeups.listen();
                    tokio::time::sleep(IDLE / 4).await;
                }
                assert!(w.started() && w.listening(), "stopped between short waits");
                assert_eq!(pid().await, session, "listening again between short waits");
            } else {
                drop(waiting);
            }
            eventually(
                &format!("round {round}: stopped without waiters"),
                async || !w.started() && !w.listening() && sessions().await == (0, 0),
            )
            .await;
        }
        server.close().await;
    }

    /// A listening task that ends with its runtime gives its state back: the next wait, on
    /// another runtime, listens again (without the claim the provider never listened again).
    #[test]
    fn a_listener_whose_runtime_ended_starts_again_at_the_next_wait() {
        let Some(url) = dlock_conformance::service_url("DLOCK_POSTGRES_URL") else {
            return;
        };
        let app = format!("dlock-runtime-test-{}", std::process::id());
        let options = PgConnectOptions::from_str(&url).expect("the URL is a PostgreSQL one");
        let store = format!("notify-runtime-test/{}", std::process::id());
        let wakeups = Wakeups::new(
            options.clone().application_name(&app),
            format!("dlock_runtime_test_{}_release", std::process::id()),
            store.clone(),
            Duration::from_secs(60),
        );
        let runtime = || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime")
        };
        // The listener's sessions on the server whose last statement was LISTEN.
        let listening = async || {
            let server = sqlx::PgPool::connect_with(options.clone())
                .await
                .expect("connect");
            let n = sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND query LIKE 'LISTEN %'",
            )
            .bind(&app)
            .fetch_one(&server)
            .await
            .expect("count the listening sessions");
            server.close().await;
            n
        };
        let first = runtime();
        first.block_on(async {
            let waiting = wake::register(&store, "n");
            wakeups.listen();
            eventually("listening on the first runtime", async || {
                wakeups.listening() && listening().await == 1
            })
            .await;
            drop(waiting);
        });
        drop(first);
        assert!(
            !wakeups.started() && !wakeups.listening(),
            "the task that ended with its runtime gave its claim back"
        );
        runtime().block_on(async {
            let _waiting = wake::register(&store, "n");
            wakeups.listen();
            eventually("listening again on the second runtime", async || {
                wakeups.started() && wakeups.listening() && listening().await == 1
            })
            .await;
        });
    }

    fn hex(name: &str) -> String {
        name.bytes().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn a_release_of_this_process_is_not_announced_twice() {
        assert_eq!(released_elsewhere("6e/abc", "abc"), None);
        assert_eq!(released_elsewhere("6e/abd", "abc").as_deref(), Some("n"));
        assert_eq!(released_elsewhere("6e", "abc").as_deref(), Some("n"));
        assert_eq!(released_elsewhere("zz/abd", "abc"), None);
    }

    #[test]
    fn announced_names_are_read_from_hex() {
        assert_eq!(from_hex("6f72646572732f3432").as_deref(), Some("orders/42"));
        assert_eq!(from_hex("c3a9").as_deref(), Some("\u{e9}"));
        assert_eq!(from_hex(""), Some(String::new()));
        assert_eq!(from_hex("6"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("ff"), None);
    }
}
