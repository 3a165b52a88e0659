//! The in-process store: holds, waiters, fencing counters, and the fault hooks.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::backend::{Deadline, Hold, HoldSignal, Mutex, NewHold, later, renewal_window};
use dlock_core::{
    Error, FencingToken, Lease, LockGuard, LockKind, LockName, LossReason, Result, async_trait,
};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use crate::BACKEND;
use crate::link::{Link, Renewal};

/// Which primitive a hold belongs to. The three share one namespace: holds of different
/// kinds on one name exclude each other (a mutex hold is exclusive like a write hold; readers
/// share only with readers, permits only with permits of the same semaphore).
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

impl Mode {
    fn kind(self, kind: Kind) -> LockKind {
        match (self, kind) {
            (Self::Permit(_), _) => LockKind::Permit,
            (Self::Shared, _) => LockKind::Read,
            (Self::Exclusive, Kind::ReadWrite) => LockKind::Write,
            (Self::Exclusive, _) => LockKind::Mutex,
        }
    }
}

/// One acquisition request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Want {
    pub(crate) owner: u64,
    pub(crate) kind: Kind,
    pub(crate) mode: Mode,
    pub(crate) fair: bool,
    pub(crate) lease: Lease,
}

/// Promises the store can break on purpose, to show that the conformance suite catches each.
#[cfg_attr(not(feature = "sabotage"), allow(dead_code, unreachable_pub))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sabotage {
    /// Count a hold's lease from when the acquire call started, not from the grant (a waiter
    /// that waited longer than its lease gets a hold that is already over).
    LeaseFromCallStart,
    /// Release and renew the first hold of a name, whoever owns it.
    OwnerBlindRelease,
    /// Restart the fencing counter when a name has no holds left.
    TokensRestart,
    /// Leave a cancelled waiter in the queue.
    CancelLeavesWaiter,
    /// Let semaphore handles with different permit counts each count against their own.
    PermitCountIgnored,
    /// Grant every request: no exclusion at all.
    NoExclusion,
    /// Free a released hold a second after `release()` returned, in the background.
    LateRelease,
    /// Refuse every renewal: a watchdog cannot keep any hold past its first lease.
    NoRenewal,
    /// Keep a mutex, a read-write lock and a semaphore on one name apart: each kind ignores
    /// the others' holds.
    KindsApart,
    /// Answer "held by someone" (`Ok(None)`) when the store cannot be reached.
    SilenceIsHeld,
    /// End holds on the store 2 % of their lease early, more than the client's drift
    /// allowance.
    FreeEarly,
    /// End holds on the store 0.5 % of their lease early: within the client's drift
    /// allowance (1 % and 5 ms), so its holders stop first, but by less than the allowance.
    FreeSlightlyEarly,
    /// Queue a fair downgrade (a read beside the owner's own write) behind waiting writers.
    DowngradeQueued,
    /// Let a fair request in ahead of the waiters queued before it, and wake the newest
    /// waiters first.
    Unfair,
    /// Answer a release with success and keep the hold until its lease ends.
    ReleaseIgnored,
    /// Never end a hold whose lease ran out.
    NeverExpires,
}

#[derive(Debug)]
struct HoldRecord {
    id: u64,
    owner: u64,
    kind: Kind,
    mode: Mode,
    expires: Instant,
    signal: HoldSignal,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    want: Want,
    wake: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Entry {
    holds: Vec<HoldRecord>,
    waiters: VecDeque<Waiter>,
    /// A semaphore's permit count, recorded by its first holder while any permit is held.
    permits: Option<u32>,
    /// The last fencing token issued on the name while this entry lived.
    last_token: Option<u64>,
    /// Sabotaged ([`Sabotage::KindsApart`]): each kind ignores the holds of the others.
    apart: bool,
    /// Sabotaged ([`Sabotage::Unfair`]): a release wakes the newest waiters first.
    unfair: bool,
    /// An election's leader's proposal, with its term: the leader's only while that term is
    /// the last token and its hold is there.
    proposal: Option<(u64, Arc<[u8]>)>,
}

impl Entry {
    /// Whether `want` is compatible with the holds plus `extra` holds granted in simulation.
    fn compatible(&self, want: &Want, extra: &[(u64, Kind, Mode)]) -> bool {
        let holds = self
            .holds
            .iter()
            .map(|h| (h.owner, h.kind, h.mode))
            .chain(extra.iter().copied())
            .filter(|(_, kind, _)| !self.apart || *kind == want.kind);
        let mut count = 0u32;
        for (owner, _, mode) in holds {
            match (want.mode, mode) {
                // A reader may share with readers and with its own write hold (downgrade).
                (Mode::Shared, Mode::Shared) => {}
                (Mode::Shared, Mode::Exclusive) if owner == want.owner => {}
                (Mode::Permit(_), Mode::Permit(_)) => count += 1,
                _ => return false,
            }
        }
        match want.mode {
            Mode::Permit(permits) => count < permits,
            _ => true,
        }
    }

    /// Whether `want` is a read beside its owner's own write hold (a downgrade), which no
    /// one queued can be ahead of: a queued writer waits for that very write.
    fn is_downgrade(&self, want: &Want) -> bool {
        want.mode == Mode::Shared
            && self
                .holds
                .iter()
                .any(|h| h.owner == want.owner && h.mode == Mode::Exclusive)
    }

    /// Whether a fair request must let someone waiting before it go first.
    fn someone_ahead(&self, me: Option<u64>) -> bool {
        match (self.waiters.front(), me) {
            (None, _) => false,
            (Some(first), Some(me)) => first.id != me,
            (Some(_), None) => true,
        }
    }

    /// Drops holds whose lease ended in the store. Their guards found out no later (the client
    /// counts the same lease from the same instant or earlier). Returns whether any went.
    fn prune(&mut self, now: Instant) -> bool {
        let before = self.holds.len();
        self.holds.retain(|h| h.expires > now);
        if !self.holds.iter().any(|h| matches!(h.mode, Mode::Permit(_))) {
            self.permits = None;
        }
        self.holds.len() != before
    }

    /// Wakes the waiters that could proceed now, in arrival order, without granting anything:
    /// a woken waiter takes its hold itself. One release wakes one exclusive waiter, or every
    /// reader that can share, or as many permit waiters as permits came free.
    fn wake(&self) {
        let mut granted: Vec<(u64, Kind, Mode)> = Vec::new();
        let mut blocked = false;
        let order: Box<dyn Iterator<Item = &Waiter>> = if self.unfair {
            Box::new(self.waiters.iter().rev())
        } else {
            Box::new(self.waiters.iter())
        };
        for w in order {
            let can = self.compatible(&w.want, &granted) && !(w.want.fair && blocked);
            if can {
                w.wake.notify_one();
                granted.push((w.want.owner, w.want.kind, w.want.mode));
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
#[derive(Debug, Default, Clone)]
struct Faults {
    latency: Duration,
    fail_renewals: bool,
    unavailable: bool,
    sabotage: Vec<Sabotage>,
}

impl Faults {
    fn broken(&self, s: Sabotage) -> bool {
        self.sabotage.contains(&s)
    }

    /// How long the store keeps a hold given a lease of `ttl`: less, under the sabotages that
    /// free holds early.
    fn kept_for(&self, ttl: Duration) -> Duration {
        if self.broken(Sabotage::FreeEarly) {
            ttl - ttl / 50
        } else if self.broken(Sabotage::FreeSlightlyEarly) {
            ttl - ttl / 200
        } else {
            ttl
        }
    }
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<LockName, Entry>,
    /// The store's one fencing counter, never reset: every name's tokens increase with it,
    /// and it costs nothing per name.
    tokens: u64,
    faults: Faults,
}

/// One store; every provider connected to it (by the same `memory://NAME`) shares it.
#[derive(Debug, Default)]
pub(crate) struct Store {
    state: Mutex<State>,
    ids: AtomicU64,
}

fn unreachable_store(why: &str) -> Error {
    Error::connection_failed(BACKEND, format!("the store is unreachable ({why})"))
}

impl Store {
    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Fails like a call to a server that cannot be reached.
    pub(crate) fn reachable(&self, link: &Link) -> Result<()> {
        if link.is_cut() {
            return Err(unreachable_store("this client is partitioned from it"));
        }
        if self.state.lock().faults.unavailable {
            return Err(unreachable_store("simulated outage"));
        }
        Ok(())
    }

    /// The configured latency of a round trip to a server: the fault itself, not a wait for
    /// an event.
    pub(crate) async fn latency(&self) {
        let latency = self.state.lock().faults.latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    /// Simulates the round trip to a server: the configured latency, then the outage checks.
    async fn round_trip(&self, link: &Link) -> Result<()> {
        self.latency().await;
        self.reachable(link)
    }

    /// Acquires `want` on `name`, waiting until `deadline`.
    ///
    /// Cancel safe: the grant and the guard are made under one lock with no await between, and
    /// a waiter's queue entry is removed when its future is dropped.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        link: &Arc<Link>,
        name: &LockName,
        want: Want,
        deadline: Deadline,
        proposal: Option<&[u8]>,
    ) -> Result<Option<LockGuard>> {
        let kind = want.kind;
        let called = Instant::now();
        if let Err(e) = self.round_trip(link).await {
            if self.state.lock().faults.broken(Sabotage::SilenceIsHeld) {
                return Ok(None);
            }
            return Err(e);
        }
        let key = name.clone();
        let mut queued: Option<QueueTicket> = None;
        loop {
            let (wake, next_expiry) = {
                let mut state = self.state.lock();
                let now = Instant::now();
                let State {
                    entries,
                    tokens,
                    faults,
                } = &mut *state;
                let entry = entries.entry(key.clone()).or_insert_with(|| Entry {
                    apart: faults.broken(Sabotage::KindsApart),
                    unfair: faults.broken(Sabotage::Unfair),
                    ..Entry::default()
                });
                if entry.prune(now) {
                    entry.wake();
                }
                if let (Mode::Permit(permits), Some(recorded)) = (want.mode, entry.permits)
                    && permits != recorded
                    && !faults.broken(Sabotage::PermitCountIgnored)
                {
                    if let Some(ticket) = queued.take() {
                        ticket.disarm(entry);
                    }
                    return Err(Error::invalid_argument(
                        "permits",
                        format!(
                            "semaphore {name:?} is in use with {recorded} permits; this handle \
                             says {permits}"
                        ),
                    ));
                }
                let me = queued.as_ref().map(|t| t.waiter);
                let downgrade =
                    entry.is_downgrade(&want) && !faults.broken(Sabotage::DowngradeQueued);
                let ahead = want.fair
                    && !downgrade
                    && !faults.broken(Sabotage::Unfair)
                    && entry.someone_ahead(me);
                let free = entry.compatible(&want, &[]) || faults.broken(Sabotage::NoExclusion);
                if !ahead && free {
                    if let Some(ticket) = queued.take() {
                        ticket.disarm(entry);
                    }
                    *tokens += 1;
                    let token = *tokens;
                    entry.last_token = Some(token);
                    if let Some(proposal) = proposal {
                        entry.proposal = Some((token, Arc::from(proposal)));
                    }
                    // The lease runs from the grant: this instant is when the store said yes.
                    let sent = if faults.broken(Sabotage::LeaseFromCallStart) {
                        called
                    } else {
                        now
                    };
                    let signal = HoldSignal::new();
                    let id = self.next_id();
                    entry.holds.push(HoldRecord {
                        id,
                        owner: want.owner,
                        kind,
                        mode: want.mode,
                        expires: later(
                            sent,
                            if faults.broken(Sabotage::NeverExpires) {
                                Duration::MAX
                            } else {
                                faults.kept_for(want.lease.ttl())
                            },
                        ),
                        signal: signal.clone(),
                    });
                    if let Mode::Permit(permits) = want.mode {
                        entry.permits.get_or_insert(permits);
                    }
                    // Someone else may share with us (readers, permits).
                    entry.wake();
                    let hold = Arc::new(MemoryHold {
                        store: Arc::clone(self),
                        link: Arc::clone(link),
                        key: key.clone(),
                        id,
                    });
                    return Ok(Some(LockGuard::new(
                        NewHold::new(
                            BACKEND,
                            want.mode.kind(kind),
                            name.clone(),
                            FencingToken::new(token),
                            want.lease,
                            sent,
                            hold,
                        )
                        .with_signal(signal),
                    )));
                }
                if deadline.has_passed() {
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
                        want,
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
            let wake_at = match (deadline.instant(), next_expiry) {
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
            self.reachable(link)?;
        }
    }

    /// The index of hold `id` in `entry`, or (sabotaged) of any hold.
    fn find(entry: &Entry, id: u64, owner_blind: bool) -> Option<usize> {
        if owner_blind {
            (!entry.holds.is_empty()).then_some(0)
        } else {
            entry.holds.iter().position(|h| h.id == id)
        }
    }

    fn release(&self, key: &LockName, id: u64) -> Result<()> {
        let mut state = self.state.lock();
        let now = Instant::now();
        let owner_blind = state.faults.broken(Sabotage::OwnerBlindRelease);
        let restart_tokens = state.faults.broken(Sabotage::TokensRestart);
        let Some(entry) = state.entries.get_mut(key) else {
            return Err(Error::lock_lost(key));
        };
        entry.prune(now);
        let Some(at) = Self::find(entry, id, owner_blind) else {
            entry.wake();
            return Err(Error::lock_lost(key));
        };
        entry.holds.swap_remove(at);
        if !entry
            .holds
            .iter()
            .any(|h| matches!(h.mode, Mode::Permit(_)))
        {
            entry.permits = None;
        }
        entry.wake();
        if entry.is_empty() {
            state.entries.remove(key);
            if restart_tokens {
                state.tokens = 0;
            }
        }
        Ok(())
    }

    pub(crate) fn extend(&self, key: &LockName, id: u64, ttl: Duration) -> Result<()> {
        let mut state = self.state.lock();
        if state.faults.fail_renewals || state.faults.broken(Sabotage::NoRenewal) {
            return Err(Error::connection_failed(
                BACKEND,
                "renewal refused (simulated fault)",
            ));
        }
        let owner_blind = state.faults.broken(Sabotage::OwnerBlindRelease);
        let kept_for = state.faults.kept_for(ttl);
        let now = Instant::now();
        let hold = state.entries.get_mut(key).and_then(|entry| {
            entry.prune(now);
            let at = Self::find(entry, id, owner_blind)?;
            entry.holds.get_mut(at)
        });
        match hold {
            Some(hold) => {
                hold.expires = later(now, kept_for);
                Ok(())
            }
            None => Err(Error::lock_lost(key)),
        }
    }

    // ---- hooks ----

    /// Ends every hold on `name` now (all primitives): their guards report the loss.
    pub(crate) fn force_expire(&self, name: &str) -> usize {
        self.end_holds(name, Some(LossReason::Forced))
    }

    /// Removes every hold on `name` without telling the holders, like an operator deleting
    /// keys behind their backs: they find out when they next talk to the store.
    pub(crate) fn drop_holds(&self, name: &str) -> usize {
        self.end_holds(name, None)
    }

    /// Ends every hold on `name`, telling each holder of its loss with `told` (`None`: not
    /// at all), and wakes the waiters. Returns how many holds ended.
    fn end_holds(&self, name: &str, told: Option<LossReason>) -> usize {
        let mut state = self.state.lock();
        let restart_tokens = state.faults.broken(Sabotage::TokensRestart);
        let mut ended = 0;
        let State {
            entries, tokens, ..
        } = &mut *state;
        entries.retain(|key, entry| {
            if key.as_str() == name {
                for h in entry.holds.drain(..) {
                    if let Some(reason) = told {
                        h.signal.mark_lost(reason);
                    }
                    ended += 1;
                }
                entry.permits = None;
                entry.wake();
            }
            let keep = !entry.is_empty();
            if !keep && restart_tokens {
                *tokens = 0;
            }
            keep
        });
        ended
    }

    /// What the store holds for `name` and the last token issued for it while it was in use
    /// (the store keeps no record of a name nobody holds or waits for).
    pub(crate) fn describe(&self, name: &str) -> dlock_core::LockStatus {
        let mut state = self.state.lock();
        let now = Instant::now();
        let Some(entry) = state.entries.iter_mut().find(|(n, _)| n.as_str() == name) else {
            return dlock_core::LockStatus::free(None);
        };
        let entry = entry.1;
        entry.prune(now);
        let last_token = entry.last_token;
        let Some(first) = entry.holds.first() else {
            return dlock_core::LockStatus::free(last_token);
        };
        let lock_kind = first.mode.kind(first.kind);
        let holders = entry
            .holds
            .iter()
            .map(|h| format!("hold-{}", h.id))
            .collect();
        let remaining = entry
            .next_expiry()
            .map(|e| e.saturating_duration_since(now));
        dlock_core::LockStatus::held_by(lock_kind, holders)
            .with_remaining(remaining)
            .with_last_token(last_token)
    }

    /// The exclusive holder of `name` (an election's leader, or a mutex's holder) as its
    /// token, with the proposal made for that token if there is one.
    pub(crate) fn leader(&self, name: &LockName) -> Option<(u64, Option<Arc<[u8]>>)> {
        let mut state = self.state.lock();
        let entry = state.entries.get_mut(name)?;
        entry.prune(Instant::now());
        let first = entry.holds.first()?;
        if first.kind != Kind::Mutex || first.mode != Mode::Exclusive {
            return None;
        }
        let token = entry.last_token?;
        let proposal = entry
            .proposal
            .as_ref()
            .filter(|(term, _)| *term == token)
            .map(|(_, p)| Arc::clone(p));
        Some((token, proposal))
    }

    /// Sets the proposal of the leader of term `token` of `name`: false if that term is not
    /// the holder's (the hold ended, another leads).
    pub(crate) fn proclaim(&self, name: &LockName, token: u64, proposal: &[u8]) -> bool {
        let mut state = self.state.lock();
        let Some(entry) = state.entries.get_mut(name) else {
            return false;
        };
        entry.prune(Instant::now());
        let leads = entry.last_token == Some(token)
            && entry
                .holds
                .first()
                .is_some_and(|h| h.kind == Kind::Mutex && h.mode == Mode::Exclusive);
        if leads {
            entry.proposal = Some((token, Arc::from(proposal)));
        }
        leads
    }

    /// Free permits of semaphore `name` out of `permits`: ended leases count as free.
    pub(crate) async fn available(
        &self,
        link: &Link,
        name: &LockName,
        permits: u32,
    ) -> Result<u32> {
        self.round_trip(link).await?;
        let mut state = self.state.lock();
        let Some(entry) = state.entries.get_mut(name) else {
            return Ok(permits);
        };
        if entry.prune(Instant::now()) {
            entry.wake();
        }
        let taken = entry
            .holds
            .iter()
            .filter(|h| matches!(h.mode, Mode::Permit(_)))
            .count();
        Ok(permits.saturating_sub(u32::try_from(taken).unwrap_or(u32::MAX)))
    }

    /// How many names the store keeps anything for (holds, waiters, a recorded permit count).
    #[cfg(test)]
    pub(crate) fn names_kept(&self) -> usize {
        self.state.lock().entries.len()
    }

    pub(crate) fn count(&self, name: &str) -> (usize, usize) {
        let mut state = self.state.lock();
        let now = Instant::now();
        let mut counts = (0, 0);
        for (n, entry) in &mut state.entries {
            if n.as_str() == name {
                if entry.prune(now) {
                    entry.wake();
                }
                counts.0 += entry.holds.len();
                counts.1 += entry.waiters.len();
            }
        }
        counts
    }

    pub(crate) fn set_latency(&self, latency: Duration) {
        self.state.lock().faults.latency = latency;
    }

    pub(crate) fn set_fail_renewals(&self, fail: bool) {
        self.state.lock().faults.fail_renewals = fail;
    }

    pub(crate) fn set_unavailable(&self, unavailable: bool) {
        self.state.lock().faults.unavailable = unavailable;
    }

    #[cfg_attr(not(feature = "sabotage"), allow(dead_code))]
    pub(crate) fn sabotage(&self, s: Sabotage) {
        self.state.lock().faults.sabotage.push(s);
    }
}

/// A waiter's place in the queue; dropping it (a cancelled acquire) leaves the queue and passes
/// on any wake-up it may have received.
struct QueueTicket {
    store: Arc<Store>,
    key: LockName,
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
        let mut state = self.store.state.lock();
        if state.faults.broken(Sabotage::CancelLeavesWaiter) {
            return;
        }
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
    link: Arc<Link>,
    key: LockName,
    id: u64,
}

#[async_trait]
impl Hold for MemoryHold {
    async fn release(&self) -> Result<()> {
        self.store.round_trip(&self.link).await?;
        if self
            .store
            .state
            .lock()
            .faults
            .broken(Sabotage::ReleaseIgnored)
        {
            return Ok(());
        }
        if self.store.state.lock().faults.broken(Sabotage::LateRelease) {
            let (store, key, id) = (Arc::clone(&self.store), self.key.clone(), self.id);
            // The delay is the fault itself (a store that frees a released lock a second
            // late), not a wait for an event: nothing is awaited on it.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let _late = store.release(&key, id);
            });
            return Ok(());
        }
        self.store.release(&self.key, self.id)
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        self.store.round_trip(&self.link).await?;
        self.store.extend(&self.key, self.id, ttl)
    }

    async fn renew(&self, ttl: Duration) -> Result<()> {
        let renewal = Renewal {
            key: self.key.clone(),
            id: self.id,
            ttl,
        };
        self.link.renew(renewal, renewal_window(ttl)).await
    }

    fn renews_in_batches(&self) -> bool {
        true
    }
}
