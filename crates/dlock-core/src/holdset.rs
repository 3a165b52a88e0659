//! The live holds of one session or connection, for the events that reach them all at once.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Weak};

use crate::hold::HoldSignal;
use crate::loss::LossReason;
use crate::sync::Mutex;

/// The live holds of one session or connection (a ZooKeeper session, an etcd lease, a Redis
/// connection, a pinned SQL connection), each with what the backend keeps about it (`T`),
/// for the events that reach them all at once: a disconnection suspends them, a reconnection
/// vouches for them again, an expiry loses them.
///
/// A hold registers when it is granted and leaves when its [`Registration`] is dropped (with
/// the backend's hold). A hold that registers while the set is suspended starts suspended,
/// and one that registers after the set was closed (its session expired meanwhile) is lost at
/// once, so a grant that races a change of state gets that state.
///
/// ```
/// use dlock_core::LossReason;
/// use dlock_core::backend::{HoldSet, HoldSignal};
///
/// let set: HoldSet = HoldSet::new();
/// let signal = HoldSignal::new();
/// let registration = set.register(&signal, ());
/// set.suspend_all(true);
/// assert_eq!(signal.state(), dlock_core::HoldState::Suspended);
/// set.close(LossReason::SessionExpired);
/// assert_eq!(signal.reason(), Some(LossReason::SessionExpired));
/// assert!(set.is_empty());
/// drop(registration);
/// ```
pub struct HoldSet<T = ()> {
    inner: Arc<Mutex<State<T>>>,
}

struct State<T> {
    holds: HashMap<u64, (HoldSignal, T)>,
    next: u64,
    suspended: bool,
    /// Closed for this reason: later holds are lost at once.
    closed: Option<LossReason>,
}

impl<T> Default for HoldSet<T> {
    fn default() -> Self {
        Self {
            inner: Arc::new(Mutex::new(State {
                holds: HashMap::new(),
                next: 0,
                suspended: false,
                closed: None,
            })),
        }
    }
}

impl<T> Clone for HoldSet<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> fmt::Debug for HoldSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("HoldSet")
            .field("holds", &state.holds.len())
            .field("suspended", &state.suspended)
            .field("closed", &state.closed)
            .finish()
    }
}

impl<T: Send + 'static> HoldSet<T> {
    /// An empty, open set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a hold's signal with `data`: suspended at once while the set is, lost at
    /// once (and not kept) if the set is closed. The hold leaves the set when the returned
    /// registration is dropped.
    pub fn register(&self, signal: &HoldSignal, data: T) -> Registration<T> {
        let mut state = self.inner.lock();
        let id = state.next;
        state.next = state.next.wrapping_add(1);
        let registration = Registration {
            set: Arc::downgrade(&self.inner),
            id,
        };
        if let Some(reason) = state.closed {
            drop(state);
            signal.mark_lost(reason);
            return registration;
        }
        if state.suspended {
            signal.set_suspended(true);
        }
        state.holds.insert(id, (signal.clone(), data));
        registration
    }

    /// Suspends every hold (`true`: the session cannot be asked right now) or vouches for
    /// them again (`false`); holds registered meanwhile start in that state.
    pub fn suspend_all(&self, suspended: bool) {
        let mut state = self.inner.lock();
        state.suspended = suspended;
        for (signal, _) in state.holds.values() {
            signal.set_suspended(suspended);
        }
    }

    /// Marks every hold lost with `reason` and empties the set; it stays open for new
    /// holds. Returns how many were lost.
    pub fn lose_all(&self, reason: LossReason) -> usize {
        let lost: Vec<(HoldSignal, T)> = {
            let mut state = self.inner.lock();
            state.suspended = false;
            state.holds.drain().map(|(_, h)| h).collect()
        };
        // Marked outside the lock: a loss wakes watchers, whose code may register again.
        for (signal, _) in &lost {
            signal.mark_lost(reason);
        }
        lost.len()
    }

    /// Marks every hold lost with `reason`, and every hold registered from now on too, until
    /// [`reopen`](Self::reopen): the session that carried them is over.
    pub fn close(&self, reason: LossReason) -> usize {
        self.inner.lock().closed = Some(reason);
        self.lose_all(reason)
    }

    /// Opens a closed set again (a new session carries new holds).
    pub fn reopen(&self) {
        let mut state = self.inner.lock();
        state.closed = None;
        state.suspended = false;
    }

    /// Whether the set is closed.
    pub fn is_closed(&self) -> bool {
        self.inner.lock().closed.is_some()
    }

    /// How many holds are registered.
    pub fn len(&self) -> usize {
        self.inner.lock().holds.len()
    }

    /// Whether no hold is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The registered holds' signals and data, for a check that reaches each (a snapshot:
    /// holds may come and go meanwhile).
    pub fn snapshot(&self) -> Vec<(HoldSignal, T)>
    where
        T: Clone,
    {
        self.inner.lock().holds.values().cloned().collect()
    }
}

/// A hold's place in a [`HoldSet`]; dropped, the hold leaves the set.
#[must_use = "dropping the registration takes the hold out of its set at once"]
pub struct Registration<T> {
    set: Weak<Mutex<State<T>>>,
    id: u64,
}

impl<T> Drop for Registration<T> {
    fn drop(&mut self) {
        if let Some(set) = self.set.upgrade() {
            let left = set.lock().holds.remove(&self.id);
            // Dropped outside the lock: the data may hold anything.
            drop(left);
        }
    }
}

impl<T> fmt::Debug for Registration<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.id)
            .finish()
    }
}
