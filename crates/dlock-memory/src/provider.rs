//! The provider: handles over one store, and the hooks that make the bad days happen.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Mutex, ProviderMeta, RawProvider};
use dlock_core::{Capabilities, LockName, LockOptions, LockStatus, Result};

use crate::config;
use crate::election::MemoryElection;
use crate::handles::{Client, MemoryMutex, MemoryReadWrite, MemorySemaphore};
use crate::link::Link;
use crate::store::Store;
use crate::{BACKEND, MIN_LEASE};

/// A provider over an in-process store: the reference implementation of the dlock contract.
///
/// Cloning is cheap; the clone reaches the same store over the same link (see
/// [`set_partitioned`](Self::set_partitioned)). See the crate docs for the hooks.
#[derive(Debug, Clone)]
pub struct MemoryProvider {
    store: Arc<Store>,
    link: Arc<Link>,
    meta: ProviderMeta,
}

impl Default for MemoryProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryProvider {
    /// A provider over a fresh private store.
    pub fn new() -> Self {
        let store = Arc::new(Store::default());
        let id = format!("memory://#{:p}", Arc::as_ptr(&store));
        Self::over(store, id)
    }

    /// A provider over the process-wide store called `name`: every provider with the same name
    /// shares holds, waiters and fencing counters, like clients of one server.
    pub fn named(name: &str) -> Self {
        Self::over(config::named(name), format!("memory://{name}"))
    }

    fn over(store: Arc<Store>, store_id: String) -> Self {
        let mut caps = Capabilities::all(BACKEND);
        caps.min_lease = MIN_LEASE;
        Self {
            link: Link::new(&store),
            store,
            meta: ProviderMeta::new(caps, store_id),
        }
    }

    /// A provider for a `memory://` (private store) or `memory://NAME` (shared store) URL.
    ///
    /// # Errors
    ///
    /// [`Error::Config`](dlock_core::Error::Config) for any other URL.
    pub fn connect(url: &str) -> Result<Self> {
        Ok(match config::parse(url)? {
            None => Self::new(),
            Some(name) => Self::named(&name),
        })
    }

    fn client(&self) -> Client {
        Client {
            store: Arc::clone(&self.store),
            link: Arc::clone(&self.link),
        }
    }

    // ---- hooks for tests ----

    /// Expires every hold on `name` now (all primitives): their guards report the loss
    /// ([`LossReason::Forced`](dlock_core::LossReason::Forced)) and the waiters may proceed.
    /// Returns how many holds ended.
    pub fn force_expire(&self, name: &str) -> usize {
        self.store.force_expire(name)
    }

    /// Removes every hold on `name` (all primitives) without telling the holders, like an
    /// operator deleting keys behind their backs: each finds out when it next talks to the
    /// store (its next renewal, `extend` or `release`), and others may take the lock at once.
    /// Returns how many holds went.
    pub fn drop_holds(&self, name: &str) -> usize {
        self.store.drop_holds(name)
    }

    /// How many holds the store has on `name` (all primitives).
    pub fn holders(&self, name: &str) -> usize {
        self.store.count(name).0
    }

    /// How many acquisitions are waiting on `name` (all primitives).
    pub fn waiters(&self, name: &str) -> usize {
        self.store.count(name).1
    }

    /// Makes every store call (acquire, release, renew) take `latency` first, like a slow
    /// server. `Duration::ZERO` turns it off.
    pub fn set_latency(&self, latency: Duration) {
        self.store.set_latency(latency);
    }

    /// Makes renewals fail with a retryable connection error, so watchdog holds are lost when
    /// their lease runs out.
    pub fn set_fail_renewals(&self, fail: bool) {
        self.store.set_fail_renewals(fail);
    }

    /// Makes every store call fail with a connection error, like a server that went away.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.store.set_unavailable(unavailable);
    }

    /// Cuts this provider (and its clones) off the store, like a client partitioned from its
    /// server: its calls fail with a connection error, its waiters give up with one, and its
    /// holds can no longer be renewed, while every other provider of the store goes on.
    pub fn set_partitioned(&self, partitioned: bool) {
        self.link.set_cut(partitioned);
    }

    /// Breaks one promise of the contract on purpose, for good: for showing that a test (the
    /// conformance suite, a user's own) catches the breakage. Never use it otherwise.
    #[cfg(feature = "sabotage")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sabotage")))]
    pub fn sabotage(&self, sabotage: crate::Sabotage) {
        self.store.sabotage(sabotage);
    }
}

impl RawProvider for MemoryProvider {
    type Mutex = MemoryMutex;
    type ReadWrite = MemoryReadWrite;
    type Semaphore = MemorySemaphore;
    type Election = MemoryElection;

    fn meta(&self) -> &ProviderMeta {
        &self.meta
    }

    fn raw_lock(&self, _name: &LockName, _options: &LockOptions) -> Result<MemoryMutex> {
        Ok(MemoryMutex {
            client: self.client(),
        })
    }

    fn raw_read_write(&self, _name: &LockName, _options: &LockOptions) -> Result<MemoryReadWrite> {
        Ok(MemoryReadWrite {
            client: self.client(),
            write_owner: Mutex::new(None),
        })
    }

    fn raw_semaphore(
        &self,
        _name: &LockName,
        _permits: u32,
        _options: &LockOptions,
    ) -> Result<MemorySemaphore> {
        Ok(MemorySemaphore {
            client: self.client(),
        })
    }

    fn raw_election(&self, name: &LockName, _options: &LockOptions) -> Result<MemoryElection> {
        Ok(MemoryElection {
            client: self.client(),
            name: name.clone(),
        })
    }

    async fn raw_describe(&self, name: &LockName) -> Result<LockStatus> {
        self.store.reachable(&self.link)?;
        Ok(self.store.describe(name.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use dlock_core::{LockOptions, LockProvider};

    use super::MemoryProvider;

    /// A store keeps nothing for a name once its holds are gone, however many names it saw,
    /// and one counter still gives every name rising tokens: per-entity names (one per order,
    /// one per user) cost no memory after use.
    #[tokio::test]
    async fn a_store_keeps_nothing_for_names_no_longer_held() {
        let p = MemoryProvider::new();
        let mut last = 0;
        for i in 0..500 {
            let lock = p
                .lock(&format!("order/{i}"), LockOptions::default())
                .unwrap();
            for _ in 0..2 {
                let g = lock.acquire().await.unwrap();
                let token = g.fencing_token().get();
                assert!(token > last, "token {token} after {last}");
                last = token;
                g.release().await.unwrap();
            }
        }
        assert_eq!(
            p.store.names_kept(),
            0,
            "names kept after their holds ended"
        );
    }
}
