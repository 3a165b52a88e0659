//! The decisions of a hold's races, each one atomic transition: whether the hold ends released
//! or lost (and for which reason), whether a guard may still join it, whether its keeper
//! stopped on purpose, and who cleans up after its loss.
//!
//! These types compile against std's atomics, or loom's under `cfg(loom)`, so the models of
//! `tests/loom.rs` check this very code. Whatever wakes a waiter (a cancellation token, a
//! `Notify`) stays outside: its caller wakes after the transition succeeded.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering};

use crate::loss::LossReason;

/// Where a hold's signal is: held, released on purpose, or lost for a reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Neither released nor lost (it may be suspended).
    Held,
    /// Released on purpose: never lost after this.
    Released,
    /// Lost, for good, for the first reason reported.
    Lost(LossReason),
}

/// The state word of a hold's signal: its [`Phase`] in the low byte, and whether the backend
/// cannot vouch for it right now (suspended) in the bit above.
///
/// Invariant: the phase leaves `Held` once, to `Released` or to `Lost`, never from one of them
/// to the other, so a hold is never both released and lost, and the first loss reason stays.
/// The suspended bit changes in any phase; it means something only while held.
pub(crate) struct SignalState(AtomicU32);

const PHASE: u32 = 0xff;
const HELD: u32 = 0;
const RELEASED: u32 = 1;
/// `LOST + n`: lost for the reason numbered `n` by [`reason_code`].
const LOST: u32 = 2;
const SUSPENDED: u32 = 1 << 8;

impl SignalState {
    /// Held, not suspended.
    pub(crate) fn new() -> Self {
        Self(AtomicU32::new(HELD))
    }

    /// The phase.
    pub(crate) fn phase(&self) -> Phase {
        phase_of(self.0.load(Ordering::SeqCst))
    }

    /// Whether it was released on purpose.
    pub(crate) fn is_released(&self) -> bool {
        self.phase() == Phase::Released
    }

    /// Whether it is marked suspended.
    pub(crate) fn is_suspended(&self) -> bool {
        self.0.load(Ordering::SeqCst) & SUSPENDED != 0
    }

    /// Held to lost for `reason`. False if it was released or lost already: then nothing
    /// changed, and the caller must not report the loss.
    pub(crate) fn lose(&self, reason: LossReason) -> bool {
        let lost = LOST + reason_code(reason);
        update(&self.0, |word| {
            (word & PHASE == HELD).then_some((word & !PHASE) | lost)
        })
        .is_ok()
    }

    /// Held to released. False if it was lost first: then it stays lost.
    pub(crate) fn release(&self) -> bool {
        update(&self.0, |word| {
            (word & PHASE == HELD).then_some((word & !PHASE) | RELEASED)
        })
        .is_ok()
    }

    /// Marks it suspended or not; true if that changed it.
    pub(crate) fn set_suspended(&self, suspended: bool) -> bool {
        let previous = if suspended {
            self.0.fetch_or(SUSPENDED, Ordering::SeqCst)
        } else {
            self.0.fetch_and(!SUSPENDED, Ordering::SeqCst)
        };
        (previous & SUSPENDED != 0) != suspended
    }
}

impl Default for SignalState {
    fn default() -> Self {
        Self::new()
    }
}

fn phase_of(word: u32) -> Phase {
    match word & PHASE {
        HELD => Phase::Held,
        RELEASED => Phase::Released,
        lost => Phase::Lost(reason_of(lost - LOST)),
    }
}

/// One table numbers the loss reasons in the state word, both ways: [`reason_code`] (an
/// exhaustive match, so a new reason cannot go without a number), [`reason_of`] (any number
/// not in the table reads as [`LossReason::Gone`] rather than panicking; only the table's
/// numbers are ever stored) and, for the tests, every reason.
macro_rules! loss_codes {
    ($($reason:ident = $code:literal,)+) => {
        /// The number of a loss reason in the state word.
        const fn reason_code(reason: LossReason) -> u32 {
            match reason {
                $(LossReason::$reason => $code,)+
            }
        }

        /// The reason numbered `code` by [`reason_code`].
        #[deny(unreachable_patterns)]
        const fn reason_of(code: u32) -> LossReason {
            match code {
                $($code => LossReason::$reason,)+
                _ => LossReason::Gone,
            }
        }

        // Every code fits under the phase mask with `LOST` added.
        const _: () = {
            let codes: &[u32] = &[$($code),+];
            let mut i = 0;
            while i < codes.len() {
                assert!(codes[i] <= PHASE - LOST, "a loss code past the phase bits");
                i += 1;
            }
        };

        /// Every loss reason.
        #[cfg(all(test, not(loom)))]
        const ALL_REASONS: &[LossReason] = &[$(LossReason::$reason,)+];
    };
}

loss_codes! {
    RenewalFailed = 0,
    Gone = 1,
    FixedLeaseEnded = 2,
    LeaseEnded = 3,
    SessionExpired = 4,
    SessionTimedOut = 5,
    ConnectionLost = 6,
    StoreReset = 7,
    Forced = 8,
    KeeperStopped = 9,
    ReleaseFailed = 10,
    Closed = 11,
}

/// The live guards of one hold.
///
/// Invariant: once the count has dropped to zero it stays there (an `enter` after the last
/// `leave` is refused), and of all the `leave`s exactly one sees itself last: the one that
/// must release the hold.
pub(crate) struct GuardCount(AtomicUsize);

impl GuardCount {
    /// `guards` live guards.
    pub(crate) fn new(guards: usize) -> Self {
        Self(AtomicUsize::new(guards))
    }

    /// Adds a guard, unless none is left (the hold is being released).
    pub(crate) fn enter(&self) -> bool {
        update(&self.0, |n| if n == 0 { None } else { n.checked_add(1) }).is_ok()
    }

    /// Removes a guard; true if it was the last one. A `leave` with none left changes
    /// nothing and is not last.
    pub(crate) fn leave(&self) -> bool {
        update(&self.0, |n| n.checked_sub(1)) == Ok(1)
    }

    /// Whether a guard is live.
    pub(crate) fn is_live(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// Whether a hold's lease keeper may still report a loss when it stops.
///
/// Invariant: it leaves `Armed` once, either disarmed (the guard stops the keeper on purpose:
/// its stop reports no loss) or stopped (the keeper ended while armed: its runtime shut down,
/// a backend call panicked, or it saw the loss), and whichever side came second learns it.
pub(crate) struct KeeperArm(AtomicU8);

const ARMED: u8 = 0;
const DISARMED: u8 = 1;
const STOPPED: u8 = 2;

impl KeeperArm {
    /// Armed.
    pub(crate) fn new() -> Self {
        Self(AtomicU8::new(ARMED))
    }

    /// Disarms it (idempotent). False if the keeper stopped armed first: its loss stands.
    pub(crate) fn disarm(&self) -> bool {
        match self
            .0
            .compare_exchange(ARMED, DISARMED, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => true,
            Err(now) => now == DISARMED,
        }
    }

    /// The keeper stopped: true if it was still armed, and so must report the loss (once).
    pub(crate) fn stopped(&self) -> bool {
        self.0
            .compare_exchange(ARMED, STOPPED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Whether the keeper is neither disarmed nor stopped: whether it may still start.
    pub(crate) fn is_armed(&self) -> bool {
        self.0.load(Ordering::SeqCst) == ARMED
    }
}

/// A job done once, by whoever claims it first (the clean-up on the store after a loss).
///
/// Invariant: of all the calls to [`claim`](Self::claim), exactly one returns true.
pub(crate) struct Claim(AtomicU8);

impl Claim {
    /// Not claimed.
    pub(crate) fn new() -> Self {
        Self(AtomicU8::new(0))
    }

    /// Claims it; true for the first caller only.
    pub(crate) fn claim(&self) -> bool {
        self.0.swap(1, Ordering::SeqCst) == 0
    }
}

/// The compare-and-swap loop of `fetch_update` (one definition for std's atomics and
/// loom's): applies `f` to the current value until it stores the result or `f` refuses.
/// Returns the value it replaced, or the one `f` refused.
fn update<A: Atomic>(
    atomic: &A,
    mut f: impl FnMut(A::Value) -> Option<A::Value>,
) -> Result<A::Value, A::Value> {
    let mut current = atomic.load();
    loop {
        let Some(new) = f(current) else {
            return Err(current);
        };
        match atomic.cas(current, new) {
            Ok(previous) => return Ok(previous),
            Err(now) => current = now,
        }
    }
}

/// The two operations [`update`] needs, on the atomics it is used with.
trait Atomic {
    type Value: Copy;
    fn load(&self) -> Self::Value;
    fn cas(&self, current: Self::Value, new: Self::Value) -> Result<Self::Value, Self::Value>;
}

macro_rules! atomic {
    ($atomic:ty, $value:ty) => {
        impl Atomic for $atomic {
            type Value = $value;
            fn load(&self) -> $value {
                <$atomic>::load(self, Ordering::SeqCst)
            }
            fn cas(&self, current: $value, new: $value) -> Result<$value, $value> {
                self.compare_exchange(current, new, Ordering::SeqCst, Ordering::SeqCst)
            }
        }
    };
}

atomic!(AtomicU32, u32);
atomic!(AtomicUsize, usize);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_reason_survives_the_state_word() {
        for &reason in ALL_REASONS {
            let s = SignalState::new();
            assert!(s.set_suspended(true));
            assert!(s.lose(reason));
            assert_eq!(s.phase(), Phase::Lost(reason));
            assert!(s.is_suspended());
        }
    }

    #[test]
    fn released_and_lost_exclude_each_other() {
        let s = SignalState::new();
        assert!(s.lose(LossReason::Forced));
        assert!(!s.lose(LossReason::Gone));
        assert!(!s.release());
        assert_eq!(s.phase(), Phase::Lost(LossReason::Forced));
        let s = SignalState::new();
        assert!(s.release());
        assert!(!s.lose(LossReason::Gone));
        assert_eq!(s.phase(), Phase::Released);
    }

    #[test]
    fn the_guard_count_never_comes_back_from_zero() {
        let g = GuardCount::new(1);
        assert!(g.enter());
        assert!(!g.leave());
        assert!(g.leave());
        assert!(!g.enter());
        assert!(!g.leave());
        assert!(!g.is_live());
    }

    #[test]
    fn the_keeper_is_disarmed_or_stopped_once() {
        let k = KeeperArm::new();
        assert!(k.disarm());
        assert!(k.disarm());
        assert!(!k.stopped());
        let k = KeeperArm::new();
        assert!(k.stopped());
        assert!(!k.stopped());
        assert!(!k.disarm());
        assert!(!k.is_armed());
    }
}

/// Entry points of `tests/loom.rs` into a real hold: under loom there is no runtime, so no
/// keeper task and no background task; these run, on a model's thread, what those tasks run.
#[cfg(loom)]
pub mod loom_api {
    use std::sync::{Arc, Weak};

    use crate::guard::LockGuard;
    use crate::hold::HoldSignal;
    use crate::keeper;
    use crate::loss::LossReason;
    use crate::shared::Shared;

    /// What the lease keeper of a hold does, with no task.
    #[derive(Debug)]
    pub struct Keeper(Arc<Shared>);

    impl Keeper {
        /// The keeper of `guard`'s hold.
        pub fn of(guard: &LockGuard) -> Option<Self> {
            guard.shared().map(|shared| Self(Arc::clone(shared)))
        }

        /// Its task ends after the hold was lost: it reports `reason` (`None`: someone else
        /// reported the loss, which it was waiting for), cleans up once, then its drop guard
        /// runs.
        pub async fn ends_after_loss(&self, reason: Option<LossReason>) {
            keeper::after_loss(&self.0, reason).await;
            self.0.keeper_stopped();
        }

        /// Its task is dropped while it keeps the hold (its runtime shut down): the drop
        /// guard alone.
        pub fn dropped(&self) {
            self.0.keeper_stopped();
        }
    }

    /// A re-entry by the same owner, as an acquire finds the hold in its registry.
    #[derive(Debug)]
    pub struct Entry(Weak<Shared>);

    impl Entry {
        /// Re-entry into `guard`'s hold.
        pub fn of(guard: &LockGuard) -> Option<Self> {
            guard.shared().map(|shared| Self(Arc::downgrade(shared)))
        }

        /// A new guard on the hold, if it can be entered.
        pub fn enter(&self) -> Option<LockGuard> {
            let shared = self.0.upgrade()?;
            shared.enter().then(|| LockGuard::from_shared(shared))
        }
    }

    /// Whether the hold of `signal` was released on purpose.
    pub fn is_released(signal: &HoldSignal) -> bool {
        signal.is_released()
    }

    /// What dropping `guard` does, with the background release run here instead of in a
    /// task of its own.
    pub async fn drop_guard(guard: LockGuard) {
        let Some(shared) = guard.into_shared() else {
            return;
        };
        if !shared.leave() {
            return;
        }
        if let Some(lost) = shared.background_release() {
            shared.finish_release(lost).await;
        }
    }
}
