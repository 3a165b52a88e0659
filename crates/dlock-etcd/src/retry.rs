//! How the backend retries a failed call, and how often it says so.

use std::time::Duration;

/// First pause before a retry of a failed call; doubles up to [`RETRY_MAX`].
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(20);
/// Longest pause between two retries of a failed call.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(1);

/// Whether the `failures`-th failure in a row of one retry loop is logged as a warning: the
/// 5th, then the 10th, 20th, 40th … (fewer as an outage goes on); the others are debug lines.
pub(crate) fn worth_a_warning(failures: u32) -> bool {
    failures == 5
        || (failures >= 10 && failures.is_multiple_of(10) && (failures / 10).is_power_of_two())
}

/// A time-to-live in etcd's unit (seconds), as a duration (none if not positive).
pub(crate) fn seconds(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}
