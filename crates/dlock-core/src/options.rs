//! Lock options and backend capabilities.

use std::time::Duration;

use crate::error::{Error, Result};

/// How long a hold lasts without the holder doing anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Lease {
    /// The hold lasts `ttl` at a time and a background task (the watchdog) renews it at most
    /// `ttl / 3` after the grant or the last renewal, for as long as the guard lives (where
    /// the backend batches renewals, on a beat that the process's holds of this lease share,
    /// so that a provider renews them together). A holder that dies stops renewing and the
    /// lock frees itself within `ttl`. If renewing fails until the lease has run out, the
    /// guard is marked lost.
    Watchdog {
        /// Length of each lease period.
        ttl: Duration,
    },
    /// The hold ends `ttl` after it was taken unless [`LockGuard::extend`](crate::LockGuard::extend)
    /// moves the end. When it ends the guard is marked lost.
    Fixed(Duration),
}

impl Lease {
    /// The default watchdog TTL: 30 seconds (renewed every 10), as in Redisson.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

    /// The longest lease (or `extend`) any backend accepts: 365 days. Longer ones are
    /// [`Error::InvalidArgument`]; a lock meant to outlive that should be renewed.
    pub const MAX: Duration = Duration::from_secs(365 * 24 * 60 * 60);

    /// A watchdog lease with the given period.
    pub const fn watchdog(ttl: Duration) -> Self {
        Self::Watchdog { ttl }
    }

    /// The length of one lease period.
    pub const fn ttl(&self) -> Duration {
        match *self {
            Self::Watchdog { ttl } | Self::Fixed(ttl) => ttl,
        }
    }

    /// Whether a watchdog renews this lease.
    pub const fn is_watchdog(&self) -> bool {
        matches!(self, Self::Watchdog { .. })
    }
}

impl Default for Lease {
    fn default() -> Self {
        Self::watchdog(Self::DEFAULT_TTL)
    }
}

/// How much earlier than the store's bound a guard stops vouching for its hold, for clock
/// drift and a late process: a part of the lease plus a fixed time.
///
/// A store ends a hold by its own clock (Redis's `PX`, a SQL server's `now()`, a ZooKeeper
/// server's session timer) while the client counts by its own: a server clock that runs fast,
/// or a client that is scheduled late, would let the store give the lock away while the
/// client still believes it holds it. dlock assumes the two clocks run at rates within this
/// allowance of each other over one lease (NTP keeps them within 0.05 %), and stops vouching
/// for a hold ([`LockGuard::is_held`](crate::LockGuard::is_held) false,
/// [`LockGuard::lost`](crate::LockGuard::lost) resolved) this much before the store's bound.
/// The default is 1 % of the lease plus 5 ms, as Redlock subtracts.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::DriftAllowance;
///
/// let d = DriftAllowance::default();
/// assert_eq!(d.of(Duration::from_secs(30)), Duration::from_millis(305));
/// let strict = DriftAllowance::new(50_000, Duration::from_millis(20)); // 5 % + 20 ms
/// assert_eq!(strict.of(Duration::from_secs(10)), Duration::from_millis(520));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DriftAllowance {
    ppm: u32,
    fixed: Duration,
}

impl DriftAllowance {
    /// 1 % of the lease plus 5 ms.
    pub const DEFAULT: Self = Self::new(10_000, Duration::from_millis(5));

    /// No allowance at all: the guard vouches for its hold up to the store's bound. Only for
    /// tests of the bound itself; a real deployment always has some drift.
    pub const NONE: Self = Self::new(0, Duration::ZERO);

    /// `ppm` millionths of the lease (10,000 is 1 %) plus `fixed`.
    pub const fn new(ppm: u32, fixed: Duration) -> Self {
        Self { ppm, fixed }
    }

    /// The part of the lease, in millionths.
    pub const fn ppm(&self) -> u32 {
        self.ppm
    }

    /// The fixed part.
    pub const fn fixed(&self) -> Duration {
        self.fixed
    }

    /// The allowance for a lease (or session) of `span`: never more than `span`.
    pub fn of(&self, span: Duration) -> Duration {
        let part = span.as_nanos().saturating_mul(u128::from(self.ppm)) / 1_000_000;
        let part = Duration::from_nanos(u64::try_from(part).unwrap_or(u64::MAX));
        part.saturating_add(self.fixed).min(span)
    }
}

impl Default for DriftAllowance {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Options for a lock handle. The defaults are what most users want: not reentrant (a task
/// that acquires twice waits for itself, as with a `tokio::sync::Mutex`), not fair, watchdog
/// lease of 30 s, drift allowance of 1 % of the lease plus 5 ms.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{Lease, LockOptions};
///
/// let opts = LockOptions::new()
///     .with_lease(Lease::Fixed(Duration::from_secs(10)))
///     .with_fair(true)
///     .with_reentrant(false);
/// assert!(opts.fair);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LockOptions {
    /// How the hold is kept alive.
    pub lease: Lease,
    /// Grant waiters in the order they started waiting. Backends that cannot do it reject the
    /// option with [`Error::Unsupported`].
    pub fair: bool,
    /// Let the owner acquire again while it holds the lock: the same task through the same
    /// handle re-enters its hold, as a Redisson thread does (see
    /// [`DistributedLock`](crate::DistributedLock)). Off by default: a guard is often moved to
    /// another task, and the task that acquired it would then re-enter a hold that other task
    /// is using. When false, a second acquire by the same task waits like anyone else's;
    /// [`LockGuard::reenter`](crate::LockGuard::reenter) re-enters explicitly either way.
    pub reentrant: bool,
    /// How much before the store's bound a guard stops vouching for its hold.
    pub drift: DriftAllowance,
    /// The least time a hold is kept from its grant (ShedLock's `lockAtLeastFor`): a release
    /// (or the drop of the last guard) that comes sooner keeps the hold, renewed, until then,
    /// and releases it then; a hold lost meanwhile ends at once (the release returns
    /// [`Error::LockLost`], and `lost()` resolves). [`LockGuard::release_now`] skips it.
    ///
    /// For a job that must run once across a fleet whose schedulers fire seconds apart: each
    /// takes the lock with a `try_acquire`, and the one that got it keeps it past the others'
    /// tries even when its job is quick. The hold lives in this process meanwhile: a process
    /// that exits sooner leaves it to its lease (ZooKeeper and etcd end it with the session).
    /// At most the lease of a [`Lease::Fixed`] less its drift allowance (nothing renews a
    /// fixed lease). Zero by default.
    ///
    /// [`LockGuard::release_now`]: crate::LockGuard::release_now
    pub hold_at_least: Duration,
    /// Chubby's lock-delay: a holder that is cut off (or whose renewals fail) is told its hold
    /// is lost this much earlier than the drift allowance alone would tell it, so the name
    /// stays unavailable to everyone else for at least this long after the holder was told,
    /// while a release frees it at once. Writes the old holder sent just before it learned
    /// of the loss (in flight, queued in a client) get this long to land before a new holder
    /// starts. It costs the same time off every renewal's reach: the delay plus the drift
    /// allowance must be at most half the lease (on ZooKeeper and etcd, half the session's
    /// timeout or time to live, else grants arrive lost). It does not help against a holder
    /// that is paused rather than cut off (it cannot be told): fence the resource for that.
    /// Zero by default.
    pub lock_delay: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            lease: Lease::default(),
            fair: false,
            reentrant: false,
            drift: DriftAllowance::DEFAULT,
            hold_at_least: Duration::ZERO,
            lock_delay: Duration::ZERO,
        }
    }
}

impl LockOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// Sets the lease.
        with_lease => lease: Lease;
        /// Sets fairness.
        with_fair => fair: bool;
        /// Sets reentrancy.
        with_reentrant => reentrant: bool;
        /// Sets the drift allowance.
        with_drift => drift: DriftAllowance;
        /// Sets the least time a hold is kept from its grant.
        with_hold_at_least => hold_at_least: Duration;
        /// Sets the lock-delay (see [`lock_delay`](Self::lock_delay)).
        with_lock_delay => lock_delay: Duration;
    }

    /// How much before the store's bound a guard stops vouching for its hold: the drift
    /// allowance with the lock-delay added to its fixed part.
    pub fn vouch_margin(&self) -> DriftAllowance {
        DriftAllowance::new(
            self.drift.ppm(),
            self.drift.fixed().saturating_add(self.lock_delay),
        )
    }
}

/// What a backend can do. The conformance suite runs every case whose capability the backend
/// declares, and a backend rejects options it cannot honour with [`Error::Unsupported`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Capabilities {
    /// The backend's short name, e.g. `"redis"`.
    pub backend: &'static str,
    /// Reentrant locks (the default mode).
    pub reentrant: bool,
    /// Non-reentrant locks (`reentrant(false)`).
    pub non_reentrant: bool,
    /// Fair (FIFO) locks.
    pub fair: bool,
    /// [`Lease::Fixed`] leases, with `extend`.
    pub fixed_lease: bool,
    /// [`Lease::Watchdog`] leases.
    pub watchdog: bool,
    /// Fencing tokens strictly increasing per name.
    pub fencing: bool,
    /// Loss is detected and reported through `lost()`.
    pub loss_detection: bool,
    /// Read-write locks.
    pub read_write: bool,
    /// Counting semaphores.
    pub semaphore: bool,
    /// Leader elections ([`LockProvider::election`](crate::LockProvider::election)).
    pub election: bool,
    /// A hold lives in one connection to the store (SQL `for-update`: a row lock of that
    /// connection's transaction). A reset or a network fault that ends the connection ends
    /// the hold on the server at once, and the server may grant the lock to the next waiter
    /// before the holder is told (the backend checks the connection between renewals and
    /// reports [`LossReason::ConnectionLost`](crate::LossReason::ConnectionLost)). Where a
    /// reset must not let two holders act, fence the resource. False where the hold lives in
    /// the store and outlasts a connection (it then ends only with its lease or session).
    pub connection_bound: bool,
    /// The shortest lease the backend accepts.
    pub min_lease: Duration,
    /// The longest lease the backend accepts: the longest its store can keep a hold for a
    /// client that stopped (PostgreSQL's session timeouts end at 2^31 - 1 ms), at most
    /// [`Lease::MAX`]. A longer one would have the store free a hold its client still
    /// vouches for.
    pub max_lease: Duration,
}

impl Capabilities {
    /// A backend that can do nothing optional; start here and switch on what you support.
    pub const fn none(backend: &'static str) -> Self {
        Self {
            backend,
            reentrant: false,
            non_reentrant: false,
            fair: false,
            fixed_lease: false,
            watchdog: false,
            fencing: false,
            loss_detection: false,
            read_write: false,
            semaphore: false,
            election: false,
            connection_bound: false,
            min_lease: Duration::from_millis(1),
            max_lease: Lease::MAX,
        }
    }

    /// A backend that can do everything; switch off what you do not support.
    pub const fn all(backend: &'static str) -> Self {
        Self {
            backend,
            reentrant: true,
            non_reentrant: true,
            fair: true,
            fixed_lease: true,
            watchdog: true,
            fencing: true,
            loss_detection: true,
            read_write: true,
            semaphore: true,
            election: true,
            connection_bound: false,
            min_lease: Duration::from_millis(1),
            max_lease: Lease::MAX,
        }
    }

    /// Checks that `options`' margin ([`LockOptions::vouch_margin`]: the drift allowance and
    /// the lock-delay) is at most half of `span`, what one renewal vouches for on a backend
    /// whose holds live by a session rather than the lease (ZooKeeper's session timeout,
    /// etcd's lease time to live): a larger one would leave a hold unvouched before its next
    /// renewal, or every grant lost on arrival.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the span.
    pub fn check_session_span(&self, options: &LockOptions, span: Duration) -> Result<()> {
        let margin = options.vouch_margin().of(span);
        if margin > span / 2 {
            return Err(Error::invalid_argument(
                "drift",
                format!(
                    "the lock-delay ({:?}) with the drift allowance ({margin:?}) must be at \
                     most half of {}'s session ({span:?}), which each renewal vouches for",
                    options.lock_delay, self.backend
                ),
            ));
        }
        Ok(())
    }

    /// Checks `options` against these capabilities, as a backend does when it creates a handle.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero, too-short or too-long lease (over
    /// [`max_lease`](Self::max_lease) or [`Lease::MAX`]) or a drift allowance over half the lease, [`Error::Unsupported`] for an
    /// option the backend cannot honour.
    pub fn check(&self, options: &LockOptions) -> Result<()> {
        let ttl = options.lease.ttl();
        if ttl.is_zero() {
            return Err(Error::invalid_argument("lease", "a lease must not be zero"));
        }
        if ttl > Lease::MAX {
            return Err(Error::invalid_argument(
                "lease",
                format!(
                    "{ttl:?} is longer than the {:?} maximum; use a watchdog lease for holds \
                     that last indefinitely",
                    Lease::MAX
                ),
            ));
        }
        if ttl > self.max_lease {
            return Err(Error::invalid_argument(
                "lease",
                format!(
                    "{ttl:?} is longer than the {:?} maximum of {} (the longest its store keeps \
                     a hold); use a watchdog lease of at most that for longer holds",
                    self.max_lease, self.backend
                ),
            ));
        }
        if ttl < self.min_lease {
            return Err(Error::invalid_argument(
                "lease",
                format!(
                    "{ttl:?} is shorter than the {:?} minimum of {}",
                    self.min_lease, self.backend
                ),
            ));
        }
        let drift = options.vouch_margin().of(ttl);
        if drift > ttl / 2 {
            let what = if options.lock_delay.is_zero() {
                "the drift allowance".to_owned()
            } else {
                format!(
                    "the lock-delay ({:?}) with the drift allowance",
                    options.lock_delay
                )
            };
            return Err(Error::invalid_argument(
                "drift",
                format!(
                    "{what} ({drift:?}) must be at most half the lease ({ttl:?}): a watchdog \
                     renews a third of the way into it"
                ),
            ));
        }
        match options.lease {
            Lease::Watchdog { .. } if !self.watchdog => {
                return Err(Error::unsupported(self.backend, "watchdog leases"));
            }
            Lease::Fixed(_) if !self.fixed_lease => {
                return Err(Error::unsupported(self.backend, "fixed leases"));
            }
            _ => {}
        }
        if let Lease::Fixed(fixed) = options.lease
            && options.hold_at_least > fixed.saturating_sub(drift)
        {
            return Err(Error::invalid_argument(
                "hold_at_least",
                format!(
                    "{:?} is longer than the fixed lease ({fixed:?}) less its drift allowance \
                     ({drift:?}): nothing renews a fixed lease, so the hold would end first; \
                     use a watchdog lease, or a longer fixed lease",
                    options.hold_at_least
                ),
            ));
        }
        if options.fair && !self.fair {
            return Err(Error::unsupported(self.backend, "fair locks"));
        }
        if options.reentrant && !self.reentrant {
            return Err(Error::unsupported(self.backend, "reentrant locks"));
        }
        if !options.reentrant && !self.non_reentrant {
            return Err(Error::unsupported(self.backend, "non-reentrant locks"));
        }
        Ok(())
    }

    /// Checks a semaphore's permit count.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for zero permits, [`Error::Unsupported`] if the backend has
    /// no semaphores.
    pub fn check_permits(&self, permits: u32) -> Result<()> {
        if !self.semaphore {
            return Err(Error::unsupported(self.backend, "semaphores"));
        }
        if permits == 0 {
            return Err(Error::invalid_argument(
                "permits",
                "a semaphore needs at least one permit",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Capabilities {
        Capabilities {
            min_lease: Duration::from_millis(100),
            ..Capabilities::all("test")
        }
    }

    #[test]
    fn defaults() {
        let o = LockOptions::default();
        assert_eq!(
            o.lease,
            Lease::Watchdog {
                ttl: Duration::from_secs(30)
            }
        );
        assert!(!o.reentrant && !o.fair);
        assert!(all().check(&o).is_ok());
    }

    #[test]
    fn rejects_zero_and_short_leases() {
        let zero = LockOptions::new().with_lease(Lease::Fixed(Duration::ZERO));
        assert!(matches!(
            all().check(&zero),
            Err(Error::InvalidArgument {
                argument: "lease",
                ..
            })
        ));
        let short = LockOptions::new().with_lease(Lease::watchdog(Duration::from_millis(5)));
        let err = all().check(&short).unwrap_err();
        assert!(err.to_string().contains("shorter"), "{err}");
        for huge in [Lease::Fixed(Duration::MAX), Lease::watchdog(Duration::MAX)] {
            let err = all()
                .check(&LockOptions::new().with_lease(huge))
                .unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        }
        let longest = LockOptions::new().with_lease(Lease::Fixed(Lease::MAX));
        assert!(all().check(&longest).is_ok());
    }

    #[test]
    fn rejects_unsupported_options() {
        let caps = Capabilities {
            fair: false,
            ..all()
        };
        let err = caps.check(&LockOptions::new().with_fair(true)).unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }));
        assert_eq!(err.to_string(), "test does not support fair locks");
    }

    #[test]
    fn permits() {
        assert!(all().check_permits(0).is_err());
        assert!(all().check_permits(3).is_ok());
        assert!(Capabilities::none("x").check_permits(3).is_err());
    }
}

/// What a store records about one lock name right now, for inspection
/// ([`LockProvider::describe`](crate::LockProvider::describe), `dlock status`).
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{LockKind, LockStatus};
///
/// let free = LockStatus::free(Some(41));
/// assert!(!free.is_held());
/// let held = LockStatus::held_by(LockKind::Mutex, vec!["client-1:7".into()])
///     .with_remaining(Some(Duration::from_secs(20)))
///     .with_last_token(Some(42));
/// assert!(held.is_held());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// What holds the name: a mutex hold, read holds, the write hold or semaphore permits.
    /// `None` when nobody holds it.
    pub kind: Option<crate::LockKind>,
    /// The holders as the store records them (Redis hash fields, znode names, row owners);
    /// empty when free.
    pub holders: Vec<String>,
    /// How long the hold lasts unless renewed (the shortest, for several holders), where the
    /// store records it.
    pub remaining: Option<std::time::Duration>,
    /// The last fencing token issued for the name, where the store can tell.
    pub last_token: Option<u64>,
}

impl LockStatus {
    /// Nobody holds the name.
    pub fn free(last_token: Option<u64>) -> Self {
        Self {
            last_token,
            ..Self::default()
        }
    }

    /// `holders` hold the name as `kind`.
    pub fn held_by(kind: crate::LockKind, holders: Vec<String>) -> Self {
        Self {
            kind: Some(kind),
            holders,
            ..Self::default()
        }
    }

    setters! {
        /// Sets how long the hold lasts unless renewed.
        with_remaining => remaining: Option<std::time::Duration>;
        /// Sets the last fencing token issued.
        with_last_token => last_token: Option<u64>;
    }

    /// Whether someone holds the name.
    pub fn is_held(&self) -> bool {
        self.kind.is_some()
    }
}
