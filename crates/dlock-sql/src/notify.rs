//! PostgreSQL wake-ups: a release `NOTIFY`s the lock's name on the provider's channel, and
//! one listening connection per provider (from its first wait on) wakes the waiters of that
//! name in this process, so a waiter takes a freed lock at once instead of at its next poll.
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
use tokio::sync::oneshot;

use crate::wake;

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
    /// What the listening task needs, until the first wait starts it.
    idle: Mutex<Option<Idle>>,
    /// Whether the listening task was started.
    started: AtomicBool,
    /// Dropped with the provider: ends the listening task.
    _stop: oneshot::Sender<()>,
}

/// What a listening task not started yet needs.
#[derive(Debug)]
struct Idle {
    options: PgConnectOptions,
    channel: String,
    stopped: oneshot::Receiver<()>,
}

impl Wakeups {
    /// Wake-ups for `store`, listening on `channel` on a connection of its own (opened with
    /// `options`, and again after it breaks) from the first wait of one of its waiters
    /// ([`listen`](Self::listen)) for as long as the returned value lives.
    ///
    /// Not before: every release on the channel is sent to every session listening on it,
    /// so a provider that listened from the start would make the server deliver, and its
    /// client read and drop, every release of every other client, waited for or not (eight
    /// providers cycling on their own names made half the cycles of the same statements
    /// without listeners).
    pub(crate) fn new(options: PgConnectOptions, channel: String, store: String) -> Arc<Self> {
        let (stop, stopped) = oneshot::channel();
        Arc::new(Self {
            origin: wake::origin(&store),
            store,
            received: AtomicU64::new(0),
            listening: AtomicBool::new(false),
            idle: Mutex::new(Some(Idle {
                options,
                channel,
                stopped,
            })),
            started: AtomicBool::new(false),
            _stop: stop,
        })
    }

    /// Starts listening, once, when a waiter of this provider waits: a release announced
    /// before the `LISTEN` took effect is not lost, since the listening task wakes every
    /// waiter of the store to look again once it listens. Outside a tokio runtime nothing
    /// starts (the next wait in one starts it).
    pub(crate) fn listen(self: &Arc<Self>) {
        if self.started.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(idle) = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        self.started.store(true, Ordering::Release);
        drop(runtime.spawn(listen(
            Arc::downgrade(self),
            idle.options,
            idle.channel,
            idle.stopped,
        )));
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

/// The listening task: `LISTEN`s on `channel` and wakes the waiters of each name notified,
/// connecting again (with a growing pause) whenever the connection breaks, until the
/// provider is dropped.
async fn listen(
    wakeups: Weak<Wakeups>,
    options: PgConnectOptions,
    channel: String,
    mut stopped: oneshot::Receiver<()>,
) {
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
        .connect_lazy_with(options);
    let mut pause = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let mut listened = false;
        let session = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
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
        tokio::select! {
            _ = &mut stopped => return,
            ended = session => match ended {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(channel, error = %e, "release notifications: listening again");
                    if let Some(w) = wakeups.upgrade() {
                        w.listening.store(false, Ordering::Relaxed);
                        w.wake_all();
                    }
                }
            },
        }
        if listened {
            // It worked for a while: the next break starts with a short pause again.
            pause.reset();
        }
        tokio::select! {
            _ = &mut stopped => return,
            () = pause.wait() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{from_hex, released_elsewhere};

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
