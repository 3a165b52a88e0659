#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

mod config;
mod mutex;
mod rwlock;
mod semaphore;
mod store;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    Capabilities, DynLock, DynReadWriteLock, DynSemaphore, LockName, LockOptions, LockProvider,
    Reentrancy, Result,
};

use crate::mutex::MemoryLock;
use crate::rwlock::MemoryReadWriteLock;
use crate::semaphore::MemorySemaphore;
use crate::store::Store;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["memory"];

pub(crate) const BACKEND: &str = "memory";

/// The shortest lease the memory backend accepts.
pub const MIN_LEASE: Duration = Duration::from_millis(10);

/// A provider over an in-process store: the reference implementation of the dlock contract.
///
/// Cloning is cheap and the clone reaches the same store. See the crate docs for the hooks.
#[derive(Debug, Clone)]
pub struct MemoryProvider {
    store: Arc<Store>,
    store_id: Arc<str>,
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
        Self {
            store,
            store_id: id.into(),
        }
    }

    /// A provider over the process-wide store called `name`: every provider with the same name
    /// shares holds, waiters and fencing counters, like clients of one server.
    pub fn named(name: &str) -> Self {
        Self {
            store: config::named(name),
            store_id: format!("memory://{name}").into(),
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

    // ---- hooks for tests ----

    /// Expires every hold on `name` now (all primitives): their guards report the loss and the
    /// waiters may proceed. Returns how many holds ended.
    pub fn force_expire(&self, name: &str) -> usize {
        self.store.force_expire(name)
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
}

impl LockProvider for MemoryProvider {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::all(BACKEND);
        caps.min_lease = MIN_LEASE;
        caps
    }

    fn store_id(&self) -> &str {
        &self.store_id
    }

    fn lock(&self, name: &str, options: LockOptions) -> Result<DynLock> {
        let name = LockName::new(name)?;
        self.capabilities().check(&options)?;
        Ok(Arc::new(MemoryLock {
            store: Arc::clone(&self.store),
            store_id: self.store_id.to_string(),
            name,
            options,
            owner: self.store.next_id(),
            reentrancy: Reentrancy::new(),
        }))
    }

    fn read_write_lock(&self, name: &str, options: LockOptions) -> Result<DynReadWriteLock> {
        let name = LockName::new(name)?;
        self.capabilities().check(&options)?;
        Ok(Arc::new(MemoryReadWriteLock {
            store: Arc::clone(&self.store),
            store_id: self.store_id.to_string(),
            name,
            options,
            owner: self.store.next_id(),
            read: Reentrancy::new(),
            write: Reentrancy::new(),
        }))
    }

    fn semaphore(&self, name: &str, permits: u32, options: LockOptions) -> Result<DynSemaphore> {
        let name = LockName::new(name)?;
        let caps = self.capabilities();
        caps.check_permits(permits)?;
        caps.check(&options)?;
        Ok(Arc::new(MemorySemaphore {
            store: Arc::clone(&self.store),
            store_id: self.store_id.to_string(),
            name,
            permits,
            options,
        }))
    }
}
