//! Metrics, with the `metrics` feature, through the `metrics` facade crate (the table is in the
//! crate docs). Labels never carry lock names.

use std::time::Duration;

use crate::loss::{LockKind, LossReason};

/// The label value of a loss reason.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn reason_label(reason: LossReason) -> &'static str {
    match reason {
        LossReason::RenewalFailed => "renewal_failed",
        LossReason::Gone => "gone",
        LossReason::FixedLeaseEnded => "fixed_lease_ended",
        LossReason::LeaseEnded => "lease_ended",
        LossReason::SessionExpired => "session_expired",
        LossReason::SessionTimedOut => "session_timed_out",
        LossReason::ConnectionLost => "connection_lost",
        LossReason::StoreReset => "store_reset",
        LossReason::Forced => "forced",
        LossReason::KeeperStopped => "keeper_stopped",
        LossReason::ReleaseFailed => "release_failed",
        LossReason::Closed => "closed",
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use super::*;

    pub(crate) fn acquired(
        backend: &'static str,
        kind: LockKind,
        outcome: &'static str,
        took: Duration,
    ) {
        let labels = [
            ("backend", backend),
            ("kind", kind.as_str()),
            ("outcome", outcome),
        ];
        metrics::counter!("dlock_acquire_total", &labels).increment(1);
        metrics::histogram!("dlock_acquire_duration_seconds", &labels).record(took.as_secs_f64());
    }

    pub(crate) fn released(backend: &'static str, kind: LockKind, outcome: &'static str) {
        metrics::counter!("dlock_release_total", "backend" => backend, "kind" => kind.as_str(), "outcome" => outcome)
            .increment(1);
    }

    pub(crate) fn renewed(backend: &'static str, outcome: &'static str) {
        metrics::counter!("dlock_renewal_total", "backend" => backend, "outcome" => outcome)
            .increment(1);
    }

    /// One call to the store carrying the renewals of `holds` holds (a batch).
    pub(crate) fn renewal_call(backend: &'static str, holds: usize) {
        metrics::counter!("dlock_renewal_calls_total", "backend" => backend).increment(1);
        metrics::histogram!("dlock_renewal_batch_size", "backend" => backend).record(holds as f64);
    }

    pub(crate) fn lost(backend: &'static str, kind: LockKind, reason: LossReason) {
        metrics::counter!("dlock_lost_total", "backend" => backend, "kind" => kind.as_str(), "reason" => reason_label(reason))
            .increment(1);
    }

    /// Counts one live hold in `dlock_holds` while it exists.
    #[derive(Debug)]
    pub(crate) struct Live {
        backend: &'static str,
        kind: LockKind,
    }

    impl Live {
        pub(crate) fn new(backend: &'static str, kind: LockKind) -> Self {
            metrics::gauge!("dlock_holds", "backend" => backend, "kind" => kind.as_str())
                .increment(1.0);
            Self { backend, kind }
        }
    }

    impl Drop for Live {
        fn drop(&mut self) {
            metrics::gauge!("dlock_holds", "backend" => self.backend, "kind" => self.kind.as_str())
                .decrement(1.0);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use super::*;

    pub(crate) fn acquired(_: &'static str, _: LockKind, _: &'static str, _: Duration) {}
    pub(crate) fn released(_: &'static str, _: LockKind, _: &'static str) {}
    pub(crate) fn renewed(_: &'static str, _: &'static str) {}
    pub(crate) fn renewal_call(_: &'static str, _: usize) {}
    pub(crate) fn lost(_: &'static str, _: LockKind, _: LossReason) {}

    #[derive(Debug)]
    pub(crate) struct Live;

    impl Live {
        pub(crate) fn new(_: &'static str, _: LockKind) -> Self {
            Self
        }
    }
}

pub(crate) use imp::{Live, acquired, lost, released, renewal_call, renewed};
