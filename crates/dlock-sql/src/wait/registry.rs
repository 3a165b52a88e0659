//! Waiters in this process, by store and lock name.
//!
//! `unique-insert` and `optimistic` waiters poll the table with a capped backoff. A release
//! made in this process wakes one waiter of the same store and name at once (through this
//! registry), so a lock passes between tasks of one process without waiting for the next
//! poll. Releases in other processes are found by polling, or announced by PostgreSQL's
//! `NOTIFY`, whose listener wakes waiters through this registry too.
//!
//! A store is named by its provider's store id (database, table prefix and strategy): every
//! provider of the process on the same tables shares its waiters here, however it was made.
//! A store named two ways (say `localhost` and `127.0.0.1`) only loses the early wake-up;
//! its waiters still poll.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, LazyLock, Weak};

use dlock_core::backend::Mutex;

use tokio::sync::Notify;

/// A store's waiters: one [`Notify`] per name, kept alive by the waiters that hold it.
type Names = HashMap<String, Weak<Notify>>;

static WAITERS: LazyLock<Mutex<HashMap<String, Names>>> = LazyLock::new(Mutex::default);

/// A waiter's place in the registry, held while it waits: the wake-up of its name, shared
/// with the other waiters of the name in this process. The last one to leave removes the
/// name (and an empty store), so the registry holds only names somebody waits for.
#[derive(Debug)]
pub(crate) struct Waiting {
    notify: Arc<Notify>,
    store: String,
    name: String,
}

impl Waiting {
    /// Completes at a release of the name (in this process, or announced to it).
    pub(crate) fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Whether other waiters of this process wait for the name too.
    pub(crate) fn has_company(&self) -> bool {
        Arc::strong_count(&self.notify) > 1
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut stores = WAITERS.lock();
        // Counted under the registry's lock, which `register` also takes to share it: no
        // waiter can join between the count and the removal.
        if Arc::strong_count(&self.notify) > 1 {
            return;
        }
        if let Some(names) = stores.get_mut(&self.store) {
            names.remove(&self.name);
            if names.is_empty() {
                stores.remove(&self.store);
            }
        }
    }
}

/// Registers a waiter of `name` in `store`; it keeps the returned place while it waits.
pub(crate) fn register(store: &str, name: &str) -> Waiting {
    let mut stores = WAITERS.lock();
    let names = match stores.get_mut(store) {
        Some(names) => names,
        None => stores.entry(store.to_owned()).or_default(),
    };
    let notify = match names.get(name).and_then(Weak::upgrade) {
        Some(live) => live,
        None => {
            // Two waiters leaving at once may both see the other and leave the name behind:
            // such names are dropped now and then (at each power of two past 1024).
            if names.len() >= 1024 && names.len().is_power_of_two() {
                names.retain(|_, w| w.strong_count() > 0);
            }
            let notify = Arc::new(Notify::new());
            names.insert(name.to_owned(), Arc::downgrade(&notify));
            notify
        }
    };
    Waiting {
        notify,
        store: store.to_owned(),
        name: name.to_owned(),
    }
}

/// Joins the waiters of `name` in `store` if this process has any (a newcomer that must
/// queue behind them); `None` if it has none, without registering anything: an uncontended
/// acquire costs one lookup.
pub(crate) fn join(store: &str, name: &str) -> Option<Waiting> {
    let notify = WAITERS
        .lock()
        .get(store)
        .and_then(|names| names.get(name))
        .and_then(Weak::upgrade)?;
    Some(Waiting {
        notify,
        store: store.to_owned(),
        name: name.to_owned(),
    })
}

/// Wakes one waiter of `name` in `store` (a mutex has one winner; the others keep waiting).
/// With none waiting at this moment, the next one to wait wakes at once.
pub(crate) fn wake(store: &str, name: &str) {
    let notify = WAITERS
        .lock()
        .get(store)
        .and_then(|names| names.get(name))
        .and_then(Weak::upgrade);
    if let Some(notify) = notify {
        notify.notify_one();
    }
}

/// Wakes one waiter of every name in `store` (after releases may have been missed).
#[cfg(feature = "postgres")]
pub(crate) fn wake_all(store: &str) {
    let live: Vec<Arc<Notify>> = WAITERS
        .lock()
        .get(store)
        .map(|names| names.values().filter_map(Weak::upgrade).collect())
        .unwrap_or_default();
    for notify in live {
        notify.notify_one();
    }
}

/// Whether any waiter of `store` waits in this process (a PostgreSQL provider listens for
/// releases while one does).
#[cfg(feature = "postgres")]
pub(crate) fn has_waiters(store: &str) -> bool {
    WAITERS
        .lock()
        .get(store)
        .is_some_and(|names| names.values().any(|w| w.strong_count() > 0))
}

/// Where a release announced by PostgreSQL's `NOTIFY` comes from: this process and `store`,
/// in hex digits. A listener of this process on the same store skips such an announcement:
/// the release already woke a waiter here, and a second wake-up would only send another
/// waiter to try (and fail) while the first one holds the lock.
pub(crate) fn origin(store: &str) -> String {
    static PROCESS: LazyLock<String> = LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string());
    let mut hasher = DefaultHasher::new();
    store.hash(&mut hasher);
    format!("{}{:016x}", *PROCESS, hasher.finish())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Waiting, register, wake};

    #[tokio::test]
    async fn a_release_wakes_a_waiter_of_the_same_store_and_name_only() {
        let waiter = register("store-a", "n");
        let same = register("store-a", "n");
        assert!(waiter.has_company() && same.has_company());
        let other_store = register("store-b", "n");
        let other_name = register("store-a", "m");
        assert!(!other_store.has_company() && !other_name.has_company());
        wake("store-a", "n");
        tokio::time::timeout(Duration::from_secs(5), waiter.released())
            .await
            .expect("the waiter of the released name wakes");
        let quiet = |w: Waiting| async move {
            tokio::time::timeout(Duration::from_millis(20), w.released())
                .await
                .is_err()
        };
        assert!(
            quiet(other_store).await,
            "another store's waiter stays asleep"
        );
        assert!(
            quiet(other_name).await,
            "another name's waiter stays asleep"
        );
    }

    #[test]
    fn a_newcomer_joins_only_where_others_wait() {
        assert!(
            super::join("store-d", "n").is_none(),
            "nobody waits: nothing to join"
        );
        assert!(
            !super::WAITERS.lock().contains_key("store-d"),
            "and nothing registered"
        );
        let first = register("store-d", "n");
        let newcomer = super::join("store-d", "n").expect("a waiter to queue behind");
        assert!(first.has_company() && newcomer.has_company());
    }

    #[test]
    fn the_last_waiter_to_leave_removes_its_name_and_store() {
        let (a, b) = (register("store-c", "gone"), register("store-c", "gone"));
        drop(a);
        assert!(
            super::WAITERS.lock().contains_key("store-c"),
            "one waiter is left"
        );
        drop(b);
        assert!(!super::WAITERS.lock().contains_key("store-c"));
        // Nobody to wake: nothing is kept for a later waiter either.
        wake("store-c", "gone");
        assert!(!register("store-c", "gone").has_company());
    }

    /// A release wakes the waiters of its name in this process at once, not at their next
    /// poll.
    #[cfg(feature = "_sqlite")]
    #[tokio::test]
    async fn a_release_wakes_the_waiters_of_its_name() {
        use dlock_core::{LockOptions, LockProvider};

        let dir = std::env::temp_dir().join(format!("dlock-wake-{}", std::process::id()));
        for strategy in ["unique-insert", "optimistic"] {
            let url = format!(
                "sqlite://{}/{strategy}.db?strategy={strategy}",
                dir.display()
            );
            let provider = crate::SqlProvider::connect(&url).await.expect("provider");
            let lock = provider
                .lock("wake/me", LockOptions::default())
                .expect("lock");
            let guard = lock.acquire().await.expect("acquire");
            let waiter = register(provider.store_id(), "wake/me");
            guard.release().await.expect("release");
            tokio::time::timeout(Duration::from_secs(5), waiter.released())
                .await
                .unwrap_or_else(|_| panic!("{strategy}: the release woke nobody"));
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
