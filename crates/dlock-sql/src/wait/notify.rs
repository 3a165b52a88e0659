//! PostgreSQL wake-ups: a release `NOTIFY`s the lock's name on the provider's channel, and
//! one listening connection per provider (from its first wait on, until nobody in the process
//! has waited on its tables for [`LISTEN_IDLE`]) wakes the waiters of that name in this
//! process, so a waiter takes a freed lock at once instead of at its next poll.
//!
//! Waiters still poll with their capped backoff: a notification lost with the listening
//! connection, or a holder that died (its row expires, nobody notifies), costs at most one
//! pause. A notification wakes one waiter of the name (a mutex has one winner); the others
//! keep their places until the next one. Releases made in this process wake their waiters
//! directly too ([`registry`](super::registry)), without the round trip through the server.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Backoff, Mutex, later};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::watch;
use tokio::time::Instant;

use super::registry as wake;

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
/// [`registry`](super::registry), under the provider's store id.
#[derive(Debug)]
pub(crate) struct Wakeups {
    store: String,
    /// Where this process's releases on the store come from ([`origin`](super::registry::origin)).
    origin: String,
    /// Notifications received (for tests and diagnostics).
    received: AtomicU64,
    /// Whether the listening session has said `LISTEN` (for tests and diagnostics).
    listening: AtomicBool,
    /// Looks at whether to stop listening that found a waiter, or a recent wait (for tests
    /// and diagnostics).
    kept: AtomicU64,
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
    /// client read and drop, every release of every other client, waited for or not, at a
    /// cost to every lock cycle of every provider on the tables.
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
            kept: AtomicU64::new(0),
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
        let mut state = self.state.lock();
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

    /// Whether a listening task runs (for tests).
    #[cfg(test)]
    fn started(&self) -> bool {
        self.state.lock().idle.is_none()
    }

    /// Stops listening if no waiter of the store waits in this process and none waited for
    /// the idle period: gives back what the next task needs and says `None`; the caller's
    /// task then ends. Otherwise says when to look again: an idle period after the last wait
    /// of this provider's waiters, or, while any waiter of the store waits (another
    /// provider's too, which notes its waits on its own), an eighth of one from now. Under
    /// the lock every [`listen`](Self::listen) takes after its waiter registered: either the
    /// waiter is seen here and the task goes on, or its `listen` comes after this and starts
    /// a new task.
    fn retire(&self, idle: &Idle) -> Option<Instant> {
        let mut state = self.state.lock();
        let now = Instant::now();
        let again = if wake::has_waiters(&self.store) {
            later(now, (self.idle_after / 8).max(Duration::from_millis(10)))
        } else {
            later(state.last_wait, self.idle_after)
        };
        if again > now {
            self.kept.fetch_add(1, Ordering::Relaxed);
            return Some(again);
        }
        state.idle = Some(idle.clone());
        self.listening.store(false, Ordering::Relaxed);
        None
    }

    /// Looks that kept the listener (for tests).
    #[cfg(test)]
    fn kept(&self) -> u64 {
        self.kept.load(Ordering::Relaxed)
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
            let mut state = w.state.lock();
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

/// Completes once the listening was given up ([`Wakeups::retire`]), looking when
/// `retire` says. Pends once the provider is gone (the task's other branch then ends it).
async fn retire_when_idle(wakeups: &Weak<Wakeups>, idle: &Idle) {
    loop {
        let Some(w) = wakeups.upgrade() else {
            return std::future::pending().await;
        };
        let Some(again) = w.retire(idle) else {
            tracing::debug!(
                channel = idle.channel.as_str(),
                "release notifications: nobody waits; not listening"
            );
            return;
        };
        drop(w);
        tokio::time::sleep_until(again).await;
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
    use std::time::Duration;

    use dlock_conformance::eventually;
    use sqlx::postgres::{PgConnectOptions, PgPool};

    use super::{Wakeups, from_hex, released_elsewhere};
    use crate::wait::registry as wake;

    /// The idle period of the tests' listeners.
    const IDLE: Duration = Duration::from_secs(1);

    /// How long a test waits for what it expects.
    const LIMIT: Duration = Duration::from_secs(10);

    /// What went wrong with a call to the test's own server.
    fn failed(what: &'static str) -> impl Fn(sqlx::Error) -> String {
        move |e| format!("{what}: {e}")
    }

    /// Waits (up to [`LIMIT`]) until the count `look` returns reaches `at_least`; `look` is
    /// called on every check.
    async fn counted(what: &str, at_least: u64, look: impl Fn() -> u64) {
        eventually(LIMIT, what, async || {
            let count = look();
            if count >= at_least {
                Ok(())
            } else {
                Err(count)
            }
        })
        .await;
    }

    /// The test's server, and its connection options with `app` as the application name
    /// (which finds the listener's sessions in `pg_stat_activity`).
    async fn server(url: &str, app: &str) -> Result<(PgPool, PgConnectOptions), String> {
        let options = PgConnectOptions::from_str(url).map_err(failed("read the URL"))?;
        let pool = PgPool::connect_with(options.clone())
            .await
            .map_err(failed("connect"))?;
        Ok((pool, options.application_name(app)))
    }

    /// The sessions of application `app` on the server: (all, those whose last statement
    /// was `LISTEN`), and the pid of one of them.
    async fn sessions(server: &PgPool, app: &str) -> Result<(i64, i64, Option<i32>), String> {
        sqlx::query_as(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE query LIKE 'LISTEN %'), MIN(pid) \
             FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(app)
        .fetch_one(server)
        .await
        .map_err(failed("count the listening sessions"))
    }

    /// A provider listens while a waiter of its tables waits, also two idle periods long,
    /// and while short waits keep coming (each over before the task looks); stops listening
    /// (its session gone from the server) once nobody has waited for its idle period; and
    /// listens again at the next wait, reading what another client announces.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_listener_stops_without_waiters_and_starts_again_with_one() -> Result<(), String> {
        let Some(url) = dlock_conformance::service_url("DLOCK_POSTGRES_URL") else {
            return Ok(());
        };
        let app = format!("dlock-idle-test-{}", std::process::id());
        let (server, options) = server(&url, &app).await?;
        let channel = format!("dlock_idle_test_{}_release", std::process::id());
        let store = format!("notify-idle-test/{}", std::process::id());
        let w = Wakeups::new(options, channel.clone(), store.clone(), IDLE);
        let listening = async || match sessions(&server, &app).await {
            Ok((1, 1, Some(pid))) if w.listening() => Ok(pid),
            other => Err(other),
        };
        for round in 0..2 {
            let waiting = wake::register(&store, "n");
            w.listen();
            let session = eventually(LIMIT, &format!("round {round}: listening"), listening).await;
            // (The waiter itself is woken by the listener's start too: count what it read.)
            let before = w.received();
            let payload = format!("{}/another-process", hex("n"));
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(&channel)
                .bind(payload)
                .execute(&server)
                .await
                .map_err(failed("notify"))?;
            let announced = format!("round {round}: the release announced");
            counted(&announced, before + 1, || w.received()).await;
            if round == 0 {
                // A wait two idle periods long keeps it listening, on the same session: the
                // task looks an idle period after the wait began, then every eighth of one.
                let looked = w.kept();
                counted(
                    "two idle periods of looks during a wait",
                    looked + 9,
                    || w.kept(),
                )
                .await;
                let kept = eventually(LIMIT, "listening during a long wait", listening).await;
                assert_eq!(kept, session, "listening again during a long wait");
                drop(waiting);
                // So do short waits, each over at once, a poll of `eventually` apart (at
                // most 200 ms, a fifth of the idle period): the task looks an idle period
                // after the last one, finds a newer one, and goes on.
                let looked = w.kept();
                counted("two looks between short waits", looked + 2, || {
                    drop(wake::register(&store, "n"));
                    w.listen();
                    w.kept()
                })
                .await;
                let kept = eventually(LIMIT, "listening between short waits", listening).await;
                assert_eq!(kept, session, "listening again between short waits");
            } else {
                drop(waiting);
            }
            eventually(
                LIMIT,
                &format!("round {round}: stopped without waiters"),
                async || match sessions(&server, &app).await {
                    Ok((0, 0, _)) if !w.started() && !w.listening() => Ok(()),
                    other => Err(other),
                },
            )
            .await;
        }
        server.close().await;
        Ok(())
    }

    /// A listening task that ends with its runtime gives its state back: the next wait, on
    /// another runtime, listens again (without the claim the provider never listened again).
    #[test]
    fn a_listener_whose_runtime_ended_starts_again_at_the_next_wait() -> Result<(), String> {
        let Some(url) = dlock_conformance::service_url("DLOCK_POSTGRES_URL") else {
            return Ok(());
        };
        let app = format!("dlock-runtime-test-{}", std::process::id());
        let store = format!("notify-runtime-test/{}", std::process::id());
        let runtime = || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .map_err(|e| format!("a runtime: {e}"))
        };
        // The listener's sessions on the server whose last statement was LISTEN, on a pool of
        // the runtime that asks.
        let listening = async |w: &Wakeups| {
            let (server, _) = server(&url, &app).await?;
            let seen = sessions(&server, &app).await;
            server.close().await;
            match seen? {
                (_, 1, _) if w.listening() => Ok(()),
                other => Err(format!("sessions {other:?}, listening {}", w.listening())),
            }
        };
        let (options, wakeups) = runtime()?.block_on(async {
            let (server, options) = server(&url, &app).await?;
            server.close().await;
            let w = Wakeups::new(
                options.clone(),
                format!("dlock_runtime_test_{}_release", std::process::id()),
                store.clone(),
                IDLE * 60,
            );
            Ok::<_, String>((options, w))
        })?;
        drop(options);
        let first = runtime()?;
        first.block_on(async {
            let waiting = wake::register(&store, "n");
            wakeups.listen();
            eventually(LIMIT, "listening on the first runtime", async || {
                listening(&wakeups).await
            })
            .await;
            drop(waiting);
        });
        drop(first);
        assert!(
            !wakeups.started() && !wakeups.listening(),
            "the task that ended with its runtime gave its claim back"
        );
        runtime()?.block_on(async {
            let _waiting = wake::register(&store, "n");
            wakeups.listen();
            eventually(LIMIT, "listening again on the second runtime", async || {
                if wakeups.started() {
                    listening(&wakeups).await
                } else {
                    Err("no listening task".to_owned())
                }
            })
            .await;
        });
        Ok(())
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
