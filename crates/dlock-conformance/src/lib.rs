//! The dlock conformance suite: one `pub async fn` per promise of the contract, run against
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
//! [`Capabilities`](dlock_core::Capabilities) say it lacks what the case tests ("unsupported"),
//! or the factory lacks a fault hook the case needs ("skipped"). The cases that check that
//! nothing is left behind need [`Factory::residue`]: without it they fail, they never skip.
//!
//! # Results
//!
//! With `DLOCK_RESULTS_DIR` set, every case writes how it ended (passed, unsupported, skipped,
//! each with its reason) to `$DLOCK_RESULTS_DIR/<label>/<case>`; the `guarantees` example turns
//! a directory of results into the table of `docs/guarantees.md`. [`CASES`] says which promise
//! each case checks.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod cases;
pub mod contention;
mod proxy;
mod record;
mod support;
pub mod tls;

use std::time::Duration;

use dlock_core::{DynLockProvider, Result};

pub use crate::proxy::ProxyPartition;
pub use crate::record::{Outcome, run};
pub use crate::support::{Names, eventually, must, refuses_urls};
pub use async_trait::async_trait;

/// Cuts one client off its store and back: a fault-injecting proxy in front of the server, or
/// a store's own hook.
pub trait Partition: Send + Sync + 'static {
    /// Cuts the client off (`true`: its calls hang or fail, nothing reaches the store) or
    /// reconnects it (`false`).
    fn set_partitioned(&self, partitioned: bool);
}

/// How the suite reaches a backend: fresh clients of one store, and optional fault hooks.
#[async_trait]
pub trait Factory: Send + Sync + 'static {
    /// A short, stable label for messages and results, e.g. `"redis"` or
    /// `"mysql/for-update"`.
    fn label(&self) -> String;

    /// A new client of the store, with its own connections, like another process.
    async fn connect(&self) -> Result<DynLockProvider>;

    /// A new client whose line to the store the case can cut (see [`Partition`]). `None` if
    /// the factory cannot (the cases that need it then say they skipped, and why).
    async fn connect_partitionable(&self) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        None
    }

    /// As [`connect_partitionable`](Self::connect_partitionable), with the backend's default
    /// settings (its default session timeout or lease TTL; the holds then take the default
    /// 30 s watchdog lease): what users run. For the case that cuts a holder's network
    /// silently and checks that it stops before anyone else is granted the lock, a claim that
    /// shortened sessions cannot prove. `None` if the factory cannot (the case then says it
    /// skipped, and why).
    async fn connect_partitionable_as_deployed(
        &self,
    ) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        None
    }

    /// The short lease used by the expiry cases. Long enough that a healthy renewal never
    /// misses it on a loaded 2-core machine.
    fn short_lease(&self) -> Duration {
        Duration::from_millis(600)
    }

    /// How long a holder that stopped talking to the store (dead, paused, partitioned) keeps
    /// the others out at most: its lease on lease stores, its session timeout on session
    /// stores. Holds taken with [`short_lease`](Self::short_lease).
    fn holder_timeout(&self) -> Duration {
        self.short_lease()
    }

    /// How late an event may come after its due time before the case fails.
    fn slack(&self) -> Duration {
        Duration::from_secs(3)
    }

    /// Ends every hold on `name` behind the holders' backs (deletes the key, the node, the
    /// row; kills the connection that holds a row lock), without telling them: they find out
    /// when they next talk to the store. `None` if the factory cannot.
    async fn force_expire(&self, name: &str) -> Option<Result<()>> {
        let _ = name;
        None
    }

    /// How many things the store keeps for `name` right now: holds, queue entries, nodes,
    /// rows, timeout entries, connections pinned by holds and waiters. A backend's permanent
    /// bookkeeping (its fencing counter, an idle lock row) is not counted. `None` if the
    /// factory cannot count, which fails the cases that need it.
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

/// The promises of the contract (`LockProvider`'s `# Contract`), as the results table lists
/// them.
pub const PROMISES: &[(u8, &str)] = &[
    (1, "Exclusion"),
    (2, "Reentrancy"),
    (3, "Owner-only release and extend"),
    (4, "Expiry"),
    (5, "Loss is reported before the lock can pass on"),
    (6, "Fencing"),
    (7, "Fairness"),
    (8, "Waiting"),
    (9, "Cancellation"),
    (10, "Read-write"),
    (11, "Semaphore"),
    (12, "MultiLock"),
    (13, "Bad input"),
    (14, "Dropping a guard"),
    (15, "Time: leases from the grant, huge durations"),
    (16, "Inspection"),
    (17, "One name, several kinds"),
    (18, "Leader election"),
];

/// Every case, with the promise it checks (see [`PROMISES`]). The macro below runs exactly
/// these; a unit test checks that the three lists (this one, the macro's, and the
/// `pub async fn`s of [`cases`]) agree.
pub const CASES: &[(&str, u8)] = &[
    ("try_acquire_excludes_other_handles", 1),
    ("exclusion_under_contention", 1),
    ("concurrent_try_acquire_has_one_winner", 1),
    ("release_then_reacquire", 1),
    ("try_acquire_zero_does_not_wait", 8),
    ("try_acquire_zero_on_first_use_is_bounded", 8),
    ("try_acquire_returns_within_wait", 8),
    ("waiter_gets_lock_after_release", 8),
    ("reentrant_acquire_returns_same_token", 2),
    ("reentrant_lock_freed_by_last_guard", 2),
    ("tasks_sharing_a_handle_exclude_each_other", 2),
    ("explicit_reentry_hands_the_hold_to_another_task", 2),
    ("non_reentrant_waits_for_itself", 2),
    ("release_after_takeover_is_lock_lost", 3),
    ("stale_release_reaches_the_store", 3),
    ("stale_extend_reaches_the_store", 3),
    ("abandoned_hold_expires", 4),
    ("watchdog_keeps_hold_past_three_ttls", 4),
    ("fixed_lease_is_exclusive_until_its_end", 4),
    ("extend_keeps_fixed_lease", 4),
    ("extend_after_loss_is_lock_lost", 5),
    ("extend_on_watchdog_lease_is_invalid", 13),
    ("forced_expiry_reports_loss", 5),
    ("renewal_outage_longer_than_the_lease_reports_loss", 5),
    ("is_held_is_false_at_the_lease_end_on_a_stalled_runtime", 5),
    ("keeper_runtime_dropped_reports_loss", 5),
    ("fencing_increases_across_handoffs", 6),
    ("fencing_increases_across_clients", 6),
    ("fencing_increases_across_expiry_and_takeover", 6),
    ("fair_lock_grants_in_waiting_order", 7),
    ("fair_option_rejected_when_unsupported", 7),
    ("cancelled_waiter_leaves_nothing", 9),
    ("cancel_at_every_point_leaves_nothing", 9),
    ("cancelled_fair_waiters_leave_nothing", 9),
    ("cancelled_readers_and_writers_leave_nothing", 9),
    ("cancelled_semaphore_waiters_leave_nothing", 9),
    ("cancelled_multilock_leaves_nothing", 9),
    ("dropped_guard_is_released_in_background", 14),
    ("close_releases_every_hold_and_waits_for_clean_ups", 14),
    ("independent_names_do_not_interfere", 1),
    ("names_are_exact_and_case_sensitive", 13),
    ("names_differing_by_a_trailing_space_are_distinct", 13),
    ("longest_name_works", 13),
    ("bad_names_are_rejected", 13),
    ("bad_options_are_rejected", 13),
    ("missing_primitives_are_unsupported", 13),
    ("rw_readers_share", 10),
    ("rw_writer_excludes_everyone", 10),
    ("rw_reader_blocks_writer", 10),
    ("rw_downgrade", 10),
    ("rw_upgrade_would_deadlock", 10),
    ("semaphore_limits_holders", 11),
    ("semaphore_each_acquire_takes_a_permit", 11),
    ("semaphore_permits_of_dead_holders_return", 11),
    ("semaphore_handles_must_agree_on_permits", 11),
    ("semaphore_counts_available_permits", 11),
    ("multilock_is_all_or_nothing", 12),
    ("multilock_opposite_orders_do_not_deadlock", 12),
    ("multilock_releases_everything", 12),
    ("multilock_rejects_duplicates", 12),
    ("multilock_mixes_reads_and_permits", 12),
    ("multilock_rechecks_members_before_returning", 12),
    ("multilock_rolls_back_after_an_error", 12),
    ("waiter_longer_than_its_lease_keeps_it", 15),
    ("waiter_longer_than_its_fixed_lease_keeps_it", 15),
    ("try_acquire_max_on_a_free_lock", 15),
    ("try_acquire_max_on_a_held_lock_waits", 15),
    ("huge_leases_are_invalid_arguments", 15),
    ("extend_by_huge_durations_never_panics", 15),
    ("multilock_with_huge_waits", 15),
    ("describe_reports_the_holder", 16),
    ("a_silent_holder_stops_before_the_lock_passes_on", 5),
    (
        "a_partitioned_holders_loss_comes_before_the_store_frees_the_lock",
        5,
    ),
    ("lost_never_resolves_after_a_clean_release", 5),
    ("a_silent_store_is_an_error_not_a_held_lock", 8),
    ("a_cancelled_release_finishes_and_is_no_loss", 9),
    ("a_guard_dropped_off_runtime_is_released", 14),
    ("rw_fair_downgrade_with_a_writer_queued", 10),
    ("rw_a_sibling_tasks_read_makes_a_writer_wait", 10),
    ("a_drift_allowance_over_half_the_lease_is_rejected", 13),
    (
        "a_mutex_and_a_read_write_lock_on_one_name_exclude_each_other",
        17,
    ),
    ("a_lock_and_a_semaphore_on_one_name_exclude_each_other", 17),
    ("election_has_one_leader_and_says_who", 18),
    ("election_resign_hands_over_with_a_greater_term", 18),
    ("election_observer_sees_each_change", 18),
    ("election_cancelled_campaign_leaves_nothing", 18),
    ("election_a_deposed_leaders_proclaim_is_refused", 18),
];

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
            try_acquire_zero_on_first_use_is_bounded,
            try_acquire_returns_within_wait,
            waiter_gets_lock_after_release,
            reentrant_acquire_returns_same_token,
            reentrant_lock_freed_by_last_guard,
            tasks_sharing_a_handle_exclude_each_other,
            explicit_reentry_hands_the_hold_to_another_task,
            non_reentrant_waits_for_itself,
            release_after_takeover_is_lock_lost,
            stale_release_reaches_the_store,
            stale_extend_reaches_the_store,
            abandoned_hold_expires,
            watchdog_keeps_hold_past_three_ttls,
            fixed_lease_is_exclusive_until_its_end,
            extend_keeps_fixed_lease,
            extend_after_loss_is_lock_lost,
            extend_on_watchdog_lease_is_invalid,
            forced_expiry_reports_loss,
            renewal_outage_longer_than_the_lease_reports_loss,
            is_held_is_false_at_the_lease_end_on_a_stalled_runtime,
            keeper_runtime_dropped_reports_loss,
            fencing_increases_across_handoffs,
            fencing_increases_across_clients,
            fencing_increases_across_expiry_and_takeover,
            fair_lock_grants_in_waiting_order,
            fair_option_rejected_when_unsupported,
            cancelled_waiter_leaves_nothing,
            cancel_at_every_point_leaves_nothing,
            cancelled_fair_waiters_leave_nothing,
            cancelled_readers_and_writers_leave_nothing,
            cancelled_semaphore_waiters_leave_nothing,
            cancelled_multilock_leaves_nothing,
            dropped_guard_is_released_in_background,
            close_releases_every_hold_and_waits_for_clean_ups,
            independent_names_do_not_interfere,
            names_are_exact_and_case_sensitive,
            names_differing_by_a_trailing_space_are_distinct,
            longest_name_works,
            bad_names_are_rejected,
            bad_options_are_rejected,
            missing_primitives_are_unsupported,
            rw_readers_share,
            rw_writer_excludes_everyone,
            rw_reader_blocks_writer,
            rw_downgrade,
            rw_upgrade_would_deadlock,
            semaphore_limits_holders,
            semaphore_each_acquire_takes_a_permit,
            semaphore_permits_of_dead_holders_return,
            semaphore_handles_must_agree_on_permits,
            semaphore_counts_available_permits,
            multilock_is_all_or_nothing,
            multilock_opposite_orders_do_not_deadlock,
            multilock_releases_everything,
            multilock_rejects_duplicates,
            multilock_mixes_reads_and_permits,
            multilock_rechecks_members_before_returning,
            multilock_rolls_back_after_an_error,
            waiter_longer_than_its_lease_keeps_it,
            waiter_longer_than_its_fixed_lease_keeps_it,
            try_acquire_max_on_a_free_lock,
            try_acquire_max_on_a_held_lock_waits,
            huge_leases_are_invalid_arguments,
            extend_by_huge_durations_never_panics,
            multilock_with_huge_waits,
            describe_reports_the_holder,
            a_silent_holder_stops_before_the_lock_passes_on,
            a_partitioned_holders_loss_comes_before_the_store_frees_the_lock,
            lost_never_resolves_after_a_clean_release,
            a_silent_store_is_an_error_not_a_held_lock,
            a_cancelled_release_finishes_and_is_no_loss,
            a_guard_dropped_off_runtime_is_released,
            rw_fair_downgrade_with_a_writer_queued,
            rw_a_sibling_tasks_read_makes_a_writer_wait,
            a_drift_allowance_over_half_the_lease_is_rejected,
            a_mutex_and_a_read_write_lock_on_one_name_exclude_each_other,
            a_lock_and_a_semaphore_on_one_name_exclude_each_other,
            election_has_one_leader_and_says_who,
            election_resign_hands_over_with_a_greater_term,
            election_observer_sees_each_change,
            election_cancelled_campaign_leaves_nothing,
            election_a_deposed_leaders_proclaim_is_refused,
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
                $crate::run(&factory, stringify!($name), || $crate::cases::$name(&factory)).await;
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The `pub async fn` names of every file of `cases/` (read from the directory, so a new
    /// file is covered as soon as it is there; `mod.rs` holds the helpers).
    fn case_fns() -> BTreeSet<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cases");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .filter(|p| p.file_name().is_some_and(|n| n != "mod.rs"))
            .collect();
        files.sort();
        assert!(files.len() >= 15, "cases/ has {} files", files.len());
        files
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().strip_prefix("pub async fn "))
                    .map(|l| l[..l.find(['(', '<']).unwrap()].to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The names the macro instantiates.
    fn macro_names() -> Vec<String> {
        let src = include_str!("lib.rs");
        let start = src.find("$crate::__cases!($factory;").unwrap();
        let body = &src[start..];
        let body = &body[body.find('\n').unwrap()..body.find(");").unwrap()];
        body.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }

    #[test]
    fn every_case_is_in_the_macro_and_in_cases() {
        let fns = case_fns();
        let in_macro = macro_names();
        let in_macro_set: BTreeSet<String> = in_macro.iter().cloned().collect();
        assert_eq!(in_macro.len(), in_macro_set.len(), "a case is listed twice");
        let listed: BTreeSet<String> = super::CASES.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(listed.len(), super::CASES.len(), "CASES lists a case twice");
        assert_eq!(
            fns, in_macro_set,
            "cases/*.rs and conformance_tests! differ"
        );
        assert_eq!(fns, listed, "cases/*.rs and CASES differ");
        let points: BTreeSet<u8> = super::PROMISES.iter().map(|(p, _)| *p).collect();
        for (name, point) in super::CASES {
            assert!(
                points.contains(point),
                "{name} checks unknown promise {point}"
            );
        }
        assert!(fns.len() >= 80, "the suite has {} cases", fns.len());
    }
}
