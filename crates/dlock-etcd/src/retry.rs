//! How the backend retries a failed call, and how often it says so.

use std::time::Duration;

/// First pause before a retry of a failed call; doubles up to [`RETRY_MAX`].
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(20);
/// Longest pause between two retries of a failed call.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(1);

/// A time-to-live in etcd's unit (seconds), as a duration (none if not positive).
pub(crate) fn seconds(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}
