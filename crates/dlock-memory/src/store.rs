//! The in-process store: holds, waiters, fencing counters, and the fault hooks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dlock_core::{
    Error, FencingToken, Hold, HoldSignal, Lease, LockGuard, LockName, NewHold, Result, async_trait,
};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use crate::BACKEND;

/// Which primitive a name belongs to; the three live in separate namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Mutex,
    ReadWrite,
    Semaphore,
}

/// What a request or a hold is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A mutex hold or a write hold.
    Exclusive,
    /// A read hold.
    Shared,
    /// A semaphore permit, out of this many.
    Permit(u32),
}

/// One acquisition request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub(crate) owner: u64,
    pub(crate) mode: Mode,
    pub(crate) fair: bool,
    pub(crate) lease: Lease,
}

#[derive(Debug)]
struct HoldRecord {
    id: u64,
    owner: u64,
    mode: Mode,
    expires: Instant,
    signal: HoldSignal,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    request: Request,
    wake: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Entry {
    holds: Vec<HoldRecord>,
    waiters: VecDeque<Waiter>,
}

impl Entry {
    /// Whether `request` is compatible with the holds plus `extra` holds granted in simulation.
    fn compatible(&self, request: &Request, extra: &[(u64, Mode)]) -> bool {
        let holds = self
            .holds
            .iter()
            .map(|h| (h.owner, h.mode))
            .chain(extra.iter().copied());
        let mut count = 0u32;
        for (owner, mode) in holds {
            match (request.mode, mode) {
                // A reader may share with readers and with its own write hold (downgrade).
                (Mode::Shared, Mode::Shared) => {}
                (Mode::Shared, Mode::Exclusive) if owner == request.owner => {}
                (Mode::Permit(_), Mode::Permit(_)) => count += 1,
                _ => return false,
            }
        }
        match request.mode {
            Mode::Permit(permits) => count < permits,
            _ => true,
        }
    }

    /// Whether a fair request must let someone waiting before it go first.
    fn someone_ahead(&self, me: Option<u64>) -> bool {
        match (self.waiters.front(), me) {
            (None, _) => false,
            (Some(first), Some(me)) => first.id != me,
            (Some(_), None) => true,
        }
    }

    /// Drops expired holds, marking them lost. Returns whether any went.
    fn prune(&mut self, now: Instant, name: &LockName) -> bool {
        let before = self.holds.len();
        self.holds.retain(|h| {
            let live = h.expires > now;
            if !live {
                h.signal.mark_lost(name, "the lease expired in the store");
            }
            live
        });
        self.holds.len() != before
    }

    /// Wakes the waiters that could proceed now, in arrival order, without granting anything:
    /// a woken waiter takes its hold itself. One release wakes one exclusive waiter, or every
    /// reader that can share, or as many permit waiters as permits came free.
    fn wake(&self) {
        let mut granted: Vec<(u64, Mode)> = Vec::new();
        let mut blocked = false;
        for w in &self.waiters {
            let can = self.compatible(&w.request, &granted) && !(w.request.fair && blocked);
            if can {
                w.wake.notify_one();
                granted.push((w.request.owner, w.request.mode));
            } else {
                blocked = true;
            }
        }
    }

    fn next_expiry(&self) -> Option<Instant> {
        self.holds.iter().map(|h| h.expires).min()
    }

    fn is_empty(&self) -> bool {
        self.holds.is_empty() && self.waiters.is_empty()
    }
}

/// Fault hooks; see the `MemoryProvider` methods that set them.
#[derive(Debug, Default, Clone, Copy)]
struct Faults {
    latency: Duration,
    fail_renewals: bool,
    unavailable: bool,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<(Kind, LockName), Entry>,
    /// Fencing counters, never reset: they outlive every hold.
    tokens: HashMap<(Kind, LockName), u64>,
    faults: Faults,
}

/// One store; every provider connected to it (by the same `memory://NAME`) shares it.
#[derive(Debug, Default)]
pub(crate) struct Store {
    state: Mutex<State>,
    ids: AtomicU64,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store {
    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn faults(&self) -> Faults {
        lock(&self.state).faults
    }

    /// Simulates the round trip to a server: the configured latency, then the outage check.
    async fn round_trip(&self) -> Result<()> {
        let faults = self.faults();
        if !faults.latency.is_zero() {
            tokio::time::sleep(faults.latency).await;
        }
        if self.faults().unavailable {
            return Err(Error::Connection {
                backend: BACKEND,
                message: "the store is unavailable (simulated outage)".into(),
                source: None,
            });
        }
        Ok(())
    }

    /// Acquires `request` on `(kind, name)`, waiting until `deadline` (`None`: forever).
    ///
    /// Cancel safe: the grant and the guard are made under one lock with no await between, and
    /// a waiter's queue entry is removed when its future is dropped.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        kind: Kind,
        name: &LockName,
        request: Request,
        deadline: Option<Instant>,
    ) -> Result<Option<LockGuard>> {
        let started = Instant::now();
        self.round_trip().await?;
        let key = (kind, name.clone());
        let mut queued: Option<QueueTicket> = None;
        loop {
            let (wake, next_expiry) = {
                let mut state = lock(&self.state);
                let now = Instant::now();
                let State {
                    entries, tokens, ..
                } = &mut *state;
                let entry = entries.entry(key.clone()).or_default();
                if entry.prune(now, name) {
                    entry.wake();
                }
                let me = queued.as_ref().map(|t| t.waiter);
                let ahead = request.fair && entry.someone_ahead(me);
                if !ahead && entry.compatible(&request, &[]) {
                    if let Some(ticket) = queued.take() {
                        ticket.disarm(entry);
                    }
                    let token = tokens.entry(key.clone()).or_insert(0);
                    *token += 1;
                    let signal = HoldSignal::new();
                    let id = self.next_id();
                    entry.holds.push(HoldRecord {
                        id,
                        owner: request.owner,
                        mode: request.mode,
                        expires: started + request.lease.ttl(),
                        signal: signal.clone(),
                    });
                    // Someone else may share with us (readers, permits).
                    entry.wake();
                    let hold = Arc::new(MemoryHold {
                        store: Arc::clone(self),
                        key: key.clone(),
                        id,
                    });
                    return Ok(Some(LockGuard::new(NewHold::new(
                        BACKEND,
                        name.clone(),
                        FencingToken::new(*token),
                        request.lease,
                        started,
                        hold,
                        signal,
                    ))));
                }
                if deadline.is_some_and(|d| now >= d) {
                    if let Some(ticket) = queued.take() {
                        ticket.disarm(entry);
                        entry.wake();
                    }
                    return Ok(None);
                }
                let ticket = queued.get_or_insert_with(|| {
                    let id = self.next_id();
                    let wake = Arc::new(Notify::new());
                    entry.waiters.push_back(Waiter {
                        id,
                        request,
                        wake: Arc::clone(&wake),
                    });
                    QueueTicket {
                        store: Arc::clone(self),
                        key: key.clone(),
                        waiter: id,
                        wake,
                        armed: true,
                    }
                });
                (Arc::clone(&ticket.wake), entry.next_expiry())
            };
            let wake_at = match (deadline, next_expiry) {
                (Some(d), Some(e)) => Some(d.min(e)),
                (d, e) => d.or(e),
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        () = wake.notified() => {}
                        () = sleep_until(at) => {}
                    }
                }
                None => wake.notified().await,
            }
            if self.faults().unavailable {
                return Err(Error::Connection {
                    backend: BACKEND,
                    message: "the store is unavailable (simulated outage)".into(),
                    source: None,
                });
            }
        }
    }

    fn release(&self, key: &(Kind, LockName), id: u64) -> Result<()> {
        let mut state = lock(&self.state);
        let now = Instant::now();
        let Some(entry) = state.entries.get_mut(key) else {
            return Err(Error::lock_lost(&key.1));
        };
        entry.prune(now, &key.1);
        let Some(at) = entry.holds.iter().position(|h| h.id == id) else {
            entry.wake();
            return Err(Error::lock_lost(&key.1));
        };
        entry.holds.swap_remove(at);
        entry.wake();
        if entry.is_empty() {
            state.entries.remove(key);
        }
        Ok(())
    }

    fn extend(&self, key: &(Kind, LockName), id: u64, ttl: Duration) -> Result<()> {
        let mut state = lock(&self.state);
        if state.faults.fail_renewals {
            return Err(Error::Connection {
                backend: BACKEND,
                message: "renewal refused (simulated fault)".into(),
                source: None,
            });
        }
        let now = Instant::now();
        let hold = state.entries.get_mut(key).and_then(|entry| {
            entry.prune(now, &key.1);
            entry.holds.iter_mut().find(|h| h.id == id)
        });
        match hold {
            Some(hold) => {
                hold.expires = now + ttl;
                Ok(())
            }
            None => Err(Error::lock_lost(&key.1)),
        }
    }

    // ---- hooks ----

    pub(crate) fn force_expire(&self, name: &str) -> usize {
        let mut state = lock(&self.state);
        let mut expired = 0;
        state.entries.retain(|(_, n), entry| {
            if n.as_str() == name {
                for h in entry.holds.drain(..) {
                    h.signal.mark_lost(n, "expired by a test hook");
                    expired += 1;
                }
                entry.wake();
            }
            !entry.is_empty()
        });
        expired
    }

    pub(crate) fn count(&self, name: &str) -> (usize, usize) {
        let mut state = lock(&self.state);
        let now = Instant::now();
        let mut counts = (0, 0);
        for ((_, n), entry) in &mut state.entries {
            if n.as_str() == name {
                if entry.prune(now, n) {
                    entry.wake();
                }
                counts.0 += entry.holds.len();
                counts.1 += entry.waiters.len();
            }
        }
        counts
    }

    pub(crate) fn set_latency(&self, latency: Duration) {
        lock(&self.state).faults.latency = latency;
    }

    pub(crate) fn set_fail_renewals(&self, fail: bool) {
        lock(&self.state).faults.fail_renewals = fail;
    }

    pub(crate) fn set_unavailable(&self, unavailable: bool) {
        lock(&self.state).faults.unavailable = unavailable;
    }
}

/// A waiter's place in the queue; dropping it (a cancelled acquire) leaves the queue and passes
/// on any wake-up it may have received.
struct QueueTicket {
    store: Arc<Store>,
    key: (Kind, LockName),
    waiter: u64,
    wake: Arc<Notify>,
    armed: bool,
}

impl QueueTicket {
    /// Leaves the queue while the caller holds the store's lock.
    fn disarm(mut self, entry: &mut Entry) {
        entry.waiters.retain(|w| w.id != self.waiter);
        self.armed = false;
    }
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = lock(&self.store.state);
        if let Some(entry) = state.entries.get_mut(&self.key) {
            entry.waiters.retain(|w| w.id != self.waiter);
            entry.wake();
            if entry.is_empty() {
                state.entries.remove(&self.key);
            }
        }
    }
}

/// One hold in the store, as the guard sees it.
#[derive(Debug)]
struct MemoryHold {
    store: Arc<Store>,
    key: (Kind, LockName),
    id: u64,
}

#[async_trait]
impl Hold for MemoryHold {
    async fn release(&self) -> Result<()> {
        self.store.round_trip().await?;
        self.store.release(&self.key, self.id)
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        self.store.round_trip().await?;
        self.store.extend(&self.key, self.id, ttl)
    }
}
