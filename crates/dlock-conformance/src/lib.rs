//! The dlock conformance suite: one `pub async fn` per point of the contract, run against
//! every backend through a [`Factory`], and the [`conformance_tests!`] macro that turns the
//! cases into one `#[tokio::test]` each.
//!
//! **Not API-stable**: cases and the factory trait may change in patch releases.
//!
//! # For a backend crate
//!
//! ```
//! // tests/conformance.rs of a backend crate
//! use std::sync::Arc;
//! use dlock_conformance::{Factory, async_trait};
//! use dlock_core::{DynLockProvider, Result};
//!
//! struct MyFactory {
//!     url: String,
//! }
//!
//! #[async_trait]
//! impl Factory for MyFactory {
//!     fn label(&self) -> String {
//!         "memory".into()
//!     }
//!     async fn connect(&self) -> Result<DynLockProvider> {
//!         Ok(Arc::new(dlock_memory::MemoryProvider::connect(&self.url)?))
//!     }
//! }
//!
//! // Skipped (with a message) when DLOCK_MY_URL is unset; a failure if DLOCK_TEST_REQUIRE=all.
//! dlock_conformance::conformance_tests!(
//!     dlock_conformance::service_url("DLOCK_MY_URL").map(|url| MyFactory { url })
//! );
//! # fn main() {}
//! ```
//!
//! Each case asks the factory for fresh clients (`connect`), works under a fresh namespace
//! ([`Names`]), and skips itself, with a printed reason, only when the backend's
//! [`Capabilities`](dlock_core::Capabilities) say it lacks what the case tests, or the factory
//! lacks a fault hook the case needs.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod cases;
mod support;

use std::time::Duration;

use dlock_core::{DynLockProvider, Result};

pub use crate::support::{Names, eventually, must};
pub use async_trait::async_trait;

/// How the suite reaches a backend: fresh clients of one store, and optional fault hooks.
#[async_trait]
pub trait Factory: Send + Sync + 'static {
    /// A short label for messages, e.g. `"redis"` or `"mysql/for-update"`.
    fn label(&self) -> String;

    /// A new client of the store, with its own connections, like another process.
    async fn connect(&self) -> Result<DynLockProvider>;

    /// The short lease used by the expiry cases. Long enough that a healthy renewal never
    /// misses it on a loaded 2-core machine.
    fn short_lease(&self) -> Duration {
        Duration::from_millis(600)
    }

    /// How late an event may come after its due time before the case fails.
    fn slack(&self) -> Duration {
        Duration::from_secs(3)
    }

    /// Ends every hold on `name` behind the holders' backs (deletes the key, the node, the
    /// row). `None` if the factory cannot.
    async fn force_expire(&self, name: &str) -> Option<Result<()>> {
        let _ = name;
        None
    }

    /// How many things the store keeps for `name` right now: holds, queue entries, nodes. A
    /// backend's permanent bookkeeping (e.g. its fencing counter) is not counted. `None` if
    /// the factory cannot count.
    async fn residue(&self, name: &str) -> Option<Result<usize>> {
        let _ = name;
        None
    }
}

/// Reads a service URL from the environment for a backend's tests.
///
/// Returns `None` (and prints that the tests are skipped) if `var` is unset, unless
/// `DLOCK_TEST_REQUIRE` is `all` (as `scripts/test` and CI set it) or names the backend (e.g.
/// `redis,zk`), in which case it panics: a required server that is missing is a failure, not a
/// pass.
pub fn service_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            let require = std::env::var("DLOCK_TEST_REQUIRE").unwrap_or_default();
            let required = require
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .any(|r| r == "all" || var.contains(&r.to_uppercase()));
            if required {
                panic!(
                    "{var} is not set but DLOCK_TEST_REQUIRE={require} forbids skipping: \
                     start the servers with `eval \"$(scripts/services up)\"`"
                );
            }
            eprintln!("skipped: {var} is not set (run `eval \"$(scripts/services up)\"`)");
            None
        }
    }
}

/// Instantiates every conformance case as a `#[tokio::test]` in the calling module.
///
/// `$factory` is an expression of type `Option<impl Factory>`, evaluated once per test;
/// `None` skips the test. The calling crate needs `tokio` (with `macros` and `rt-multi-thread`)
/// as a dev-dependency.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::__cases!($factory;
            try_acquire_excludes_other_handles,
            exclusion_under_contention,
            concurrent_try_acquire_has_one_winner,
            release_then_reacquire,
            try_acquire_zero_does_not_wait,
            try_acquire_returns_within_wait,
            waiter_gets_lock_after_release,
            reentrant_acquire_returns_same_token,
            reentrant_lock_freed_by_last_guard,
            clones_share_the_owner,
            non_reentrant_waits_for_itself,
            release_after_takeover_is_lock_lost,
            abandoned_hold_expires,
            watchdog_keeps_hold_past_three_ttls,
            fixed_lease_ends_and_reports_loss,
            extend_keeps_fixed_lease,
            extend_after_loss_is_lock_lost,
            extend_on_watchdog_lease_is_invalid,
            forced_expiry_reports_loss,
            fencing_increases_across_handoffs,
            fencing_increases_across_clients,
            fair_lock_grants_in_waiting_order,
            fair_option_rejected_when_unsupported,
            cancelled_waiter_leaves_nothing,
            cancel_at_every_point_leaves_nothing,
            dropped_guard_is_released_in_background,
            independent_names_do_not_interfere,
            names_are_exact_and_case_sensitive,
            longest_name_works,
            bad_names_are_rejected,
            bad_options_are_rejected,
            rw_readers_share,
            rw_writer_excludes_everyone,
            rw_reader_blocks_writer,
            rw_downgrade,
            rw_upgrade_would_deadlock,
            semaphore_limits_holders,
            semaphore_each_acquire_takes_a_permit,
            semaphore_permits_of_dead_holders_return,
            multilock_is_all_or_nothing,
            multilock_opposite_orders_do_not_deadlock,
            multilock_releases_everything,
            multilock_rejects_duplicates,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __cases {
    ($factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let Some(factory) = $factory else { return };
                $crate::cases::$name(&factory).await;
            }
        )*
    };
}
