//! PostgreSQL wake-ups: a release `NOTIFY`s the lock's name on the provider's channel, and
//! one listening connection per provider wakes the waiters of that name in this process, so a
//! waiter takes a freed lock at once instead of at its next poll.
//!
//! Waiters still poll with their capped backoff: a notification lost with the listening
//! connection, or a holder that died (its row expires, nobody notifies), costs at most one
//! pause. A notification wakes one waiter of the name (a mutex has one winner); the others
//! keep their places until the next one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use dlock_core::LockName;
use dlock_core::backend::Backoff;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{Notify, oneshot};

/// The channel a provider's releases are announced on: one per set of tables.
pub(crate) fn channel(table: &str) -> String {
    format!("{table}_release")
}

/// The waiters of one provider, by lock name, and the task that listens for releases.
#[derive(Debug)]
pub(crate) struct Wakeups {
    names: Mutex<HashMap<String, Weak<Notify>>>,
    /// Notifications received (for tests and diagnostics).
    received: AtomicU64,
    /// Dropped with the provider: ends the listening task.
    _stop: oneshot::Sender<()>,
}

impl Wakeups {
    /// Starts listening on `channel` on a connection of its own (opened with `options`, and
    /// again after it breaks), for as long as the returned value lives.
    pub(crate) fn start(options: PgConnectOptions, channel: String) -> Arc<Self> {
        let (stop, stopped) = oneshot::channel();
        let this = Arc::new(Self {
            names: Mutex::new(HashMap::new()),
            received: AtomicU64::new(0),
            _stop: stop,
        });
        tokio::spawn(listen(Arc::downgrade(&this), options, channel, stopped));
        this
    }

    fn names(&self) -> MutexGuard<'_, HashMap<String, Weak<Notify>>> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The wake-up of `name`'s waiters in this process; keep it while waiting.
    pub(crate) fn register(&self, name: &LockName) -> Arc<Notify> {
        let mut names = self.names();
        if let Some(live) = names.get(name.as_str()).and_then(Weak::upgrade) {
            return live;
        }
        if names.len() >= 1024 {
            names.retain(|_, w| w.strong_count() > 0);
        }
        let notify = Arc::new(Notify::new());
        names.insert(name.as_str().to_owned(), Arc::downgrade(&notify));
        notify
    }

    /// Notifications received so far.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Wakes a waiter of the name a release announced (in hex).
    fn wake(&self, payload: &str) {
        self.received.fetch_add(1, Ordering::Relaxed);
        let Some(name) = from_hex(payload) else {
            return;
        };
        if let Some(notify) = self.names().get(&name).and_then(Weak::upgrade) {
            notify.notify_one();
        }
    }

    /// After the listening connection broke: notifications may have been missed, so every
    /// waiter looks again.
    fn wake_all(&self) {
        for notify in self.names().values().filter_map(Weak::upgrade) {
            notify.notify_one();
        }
    }
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
    // of the application's.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options);
    let mut pause = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let mut listened = false;
        let session = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            listened = true;
            // Listening again after a break: whatever was released meanwhile is looked at.
            if let Some(w) = wakeups.upgrade() {
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
    use super::from_hex;

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
