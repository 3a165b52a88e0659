//! The backend's name, its URL schemes and the bounds every layer shares.

use std::time::Duration;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["redis", "rediss", "redis+sentinel"];

/// The backend's name, as errors, capabilities and holds carry it.
pub(crate) const BACKEND: &str = "redis";

/// The shortest lease this backend accepts (Redis expires keys with millisecond precision;
/// shorter leases would expire before a renewal could reach the server).
pub const MIN_LEASE: Duration = Duration::from_millis(30);

/// The longest pause between two tries of a waiter, and between two checks of the live holds,
/// while the server is away (a restart, a failover): once it is back, every waiter tries
/// within this long.
pub(crate) const OUTAGE_PAUSE_MAX: Duration = Duration::from_millis(250);
