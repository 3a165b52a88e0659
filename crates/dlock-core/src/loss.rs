//! Why a hold was lost, and what kind of hold it was.

use std::fmt;

/// What a guard stands for: a mutex hold, a read or write hold, or a semaphore permit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// A mutex hold.
    Mutex,
    /// A shared hold of a read-write lock.
    Read,
    /// The exclusive hold of a read-write lock.
    Write,
    /// One permit of a semaphore.
    Permit,
}

impl LockKind {
    /// A short lower-case name: `mutex`, `read`, `write`, `permit`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Mutex => "mutex",
            Self::Read => "read",
            Self::Write => "write",
            Self::Permit => "permit",
        }
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a hold was lost: [`LockGuard::loss_reason`](crate::LockGuard::loss_reason) returns it
/// once [`lost`](crate::LockGuard::lost) has resolved, and the `dlock.lost` tracing event
/// carries it.
///
/// ```
/// use dlock_core::LossReason;
/// assert_eq!(LossReason::FixedLeaseEnded.to_string(), "the fixed lease ended");
/// assert!(!LossReason::RenewalFailed.is_forced());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// Renewals kept failing (the store was unreachable, or answered with errors) until the
    /// lease ran out.
    RenewalFailed,
    /// The store no longer has the hold: it expired there, was deleted, or another owner took
    /// the lock. Found by a renewal, an `extend` or a `release`.
    Gone,
    /// The fixed lease ran out and was not extended.
    FixedLeaseEnded,
    /// The lease ran out before the keeper could renew it: the process or its runtime was
    /// stalled (a blocked runtime, a paused process, a long GC-like pause).
    LeaseEnded,
    /// The session that carried the hold ended (ZooKeeper session expiry, an etcd lease
    /// revoked).
    SessionExpired,
    /// The store did not answer within the session's timeout: it may have ended the session
    /// (and given the lock to someone else), though the client library has not said so yet.
    SessionTimedOut,
    /// The connection that carried the hold broke (a `for-update` row lock ends with its
    /// connection).
    ConnectionLost,
    /// The store was restarted, flushed or failed over, and the hold did not survive it.
    StoreReset,
    /// Someone ended the hold on purpose: an operator, or a test hook such as the memory
    /// store's `force_expire`.
    Forced,
    /// The lease keeper stopped before the hold was released: its runtime shut down while the
    /// guard lived on, or a backend call panicked.
    KeeperStopped,
    /// The release failed (the store did not answer, or answered with an error): nothing
    /// renews the hold any more, and the store ends it with its lease or session.
    ReleaseFailed,
    /// Its provider was closed ([`LockProvider::close`](crate::LockProvider::close)), which
    /// released it.
    Closed,
}

impl LossReason {
    /// Whether the hold was ended on purpose ([`LossReason::Forced`]).
    pub const fn is_forced(self) -> bool {
        matches!(self, Self::Forced)
    }

    /// A short sentence, as [`Display`](fmt::Display) prints it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RenewalFailed => "renewals failed until the lease ran out",
            Self::Gone => "the store no longer has the hold",
            Self::FixedLeaseEnded => "the fixed lease ended",
            Self::LeaseEnded => "the lease ran out before it could be renewed",
            Self::SessionExpired => "the session expired",
            Self::SessionTimedOut => "the store did not answer within the session timeout",
            Self::ConnectionLost => "the connection holding the lock broke",
            Self::StoreReset => "the store was restarted, flushed or failed over",
            Self::Forced => "the hold was ended on purpose",
            Self::KeeperStopped => "the lease keeper stopped (its runtime shut down)",
            Self::ReleaseFailed => "the release failed; the store ends the hold with its lease",
            Self::Closed => "its provider was closed, which released it",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
