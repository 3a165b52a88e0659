//! Every case must be able to fail. Each test here breaks one promise in a memory store on
//! purpose (`MemoryProvider::sabotage`) and checks that the cases written for that promise
//! catch it, so a case that silently stopped asserting anything shows up here.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_conformance::{Factory, Partition, async_trait, cases};
use dlock_core::{DynLockProvider, Result};
use dlock_memory::{MemoryProvider, Sabotage};
use futures::FutureExt;

/// A memory store with one promise broken (or none), and optionally without a residue count.
struct Broken {
    store: String,
    sabotage: Option<Sabotage>,
    counts_residue: bool,
}

impl Broken {
    fn new(sabotage: Option<Sabotage>) -> Self {
        static STORES: AtomicU64 = AtomicU64::new(0);
        let b = Self {
            store: format!("broken-{}", STORES.fetch_add(1, Ordering::Relaxed)),
            sabotage,
            counts_residue: true,
        };
        if let Some(s) = sabotage {
            b.provider().sabotage(s);
        }
        b
    }

    fn provider(&self) -> MemoryProvider {
        MemoryProvider::named(&self.store)
    }
}

struct Cut(MemoryProvider);

impl Partition for Cut {
    fn set_partitioned(&self, partitioned: bool) {
        self.0.set_partitioned(partitioned);
    }
}

#[async_trait]
impl Factory for Broken {
    fn label(&self) -> String {
        format!("memory with {:?}", self.sabotage)
    }

    async fn connect(&self) -> Result<DynLockProvider> {
        Ok(Arc::new(self.provider()))
    }

    async fn connect_partitionable(&self) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        let p = self.provider();
        Some(Ok((Arc::new(p.clone()), Box::new(Cut(p)))))
    }

    async fn connect_partitionable_as_deployed(
        &self,
    ) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        self.connect_partitionable().await
    }

    fn short_lease(&self) -> Duration {
        Duration::from_millis(300)
    }

    fn slack(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn force_expire(&self, name: &str) -> Option<Result<()>> {
        self.provider().drop_holds(name);
        Some(Ok(()))
    }

    async fn residue(&self, name: &str) -> Option<Result<usize>> {
        if !self.counts_residue {
            return None;
        }
        let p = self.provider();
        Some(Ok(p.holders(name) + p.waiters(name)))
    }
}

/// Runs `case` against `factory` and requires it to fail.
async fn must_fail<F>(what: &str, case: F)
where
    F: Future<Output = ()>,
{
    let outcome = AssertUnwindSafe(case).catch_unwind().await;
    assert!(outcome.is_err(), "the case passed against {what}");
}

macro_rules! caught {
    ($test:ident, $sabotage:expr, $($case:ident),+ $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            $(
                let f = Broken::new(Some($sabotage));
                must_fail(
                    concat!(stringify!($case), " with ", stringify!($sabotage)),
                    cases::$case(&f),
                )
                .await;
            )+
        }
    };
}

/// A store that counts a waiter's lease from the call instead of the grant hands out a guard
/// lost on arrival. These cases failed on it ("lost on arrival") until the core handles
/// learned to drop such a grant and acquire again; now the waiter gets a live hold, and the
/// token it skipped shows the store's dead grant was caught by the handle, not missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_counted_from_the_call_is_caught_by_the_handles() {
    use dlock_core::{Lease, LockOptions, LockProvider};

    let f = Broken::new(Some(Sabotage::LeaseFromCallStart));
    cases::waiter_longer_than_its_lease_keeps_it(&f).await;
    cases::waiter_longer_than_its_fixed_lease_keeps_it(&f).await;

    let (a, b) = (f.provider(), f.provider());
    let lease = LockOptions::default().with_lease(Lease::watchdog(f.short_lease()));
    let holder = a.lock("skipped", lease).unwrap().acquire().await.unwrap();
    let lb = b.lock("skipped", lease).unwrap();
    let waiter = tokio::spawn(async move { lb.acquire().await });
    tokio::time::sleep(f.short_lease() * 2).await;
    let first = holder.fencing_token().get();
    holder.release().await.unwrap();
    let g = waiter.await.unwrap().unwrap();
    assert!(g.is_held());
    assert_eq!(
        g.fencing_token().get(),
        first + 2,
        "the store's grant lost on arrival was dropped and a second one taken"
    );
    g.release().await.unwrap();
}

caught!(
    owner_blind_release_is_caught,
    Sabotage::OwnerBlindRelease,
    stale_release_reaches_the_store,
    stale_extend_reaches_the_store,
);

// The stall probe of these cases excuses a loss only when the runtime really stalled.
caught!(
    renewals_that_fail_are_caught,
    Sabotage::NoRenewal,
    watchdog_keeps_hold_past_three_ttls,
    waiter_longer_than_its_lease_keeps_it,
);

caught!(
    tokens_that_restart_are_caught,
    Sabotage::TokensRestart,
    fencing_increases_across_expiry_and_takeover,
);

caught!(
    waiters_left_behind_are_caught,
    Sabotage::CancelLeavesWaiter,
    cancelled_waiter_leaves_nothing,
    cancelled_fair_waiters_leave_nothing,
    cancelled_readers_and_writers_leave_nothing,
    cancelled_semaphore_waiters_leave_nothing,
    try_acquire_max_on_a_held_lock_waits,
    election_cancelled_campaign_leaves_nothing,
);

caught!(
    permit_counts_each_handle_its_own_are_caught,
    Sabotage::PermitCountIgnored,
    semaphore_handles_must_agree_on_permits,
);

caught!(
    no_exclusion_is_caught,
    Sabotage::NoExclusion,
    try_acquire_excludes_other_handles,
    concurrent_try_acquire_has_one_winner,
    try_acquire_zero_on_first_use_is_bounded,
    names_differing_by_a_trailing_space_are_distinct,
    fixed_lease_is_exclusive_until_its_end,
    multilock_mixes_reads_and_permits,
    tasks_sharing_a_handle_exclude_each_other,
    semaphore_limits_holders,
    election_has_one_leader_and_says_who,
);

// A release that frees the lock after it returned. The checks that a lock is free after a
// release give a slow store its slack, but ask the store first: a lock it says is held is not
// free.
caught!(
    late_release_is_caught,
    Sabotage::LateRelease,
    try_acquire_excludes_other_handles,
    multilock_is_all_or_nothing,
    multilock_releases_everything,
    reentrant_lock_freed_by_last_guard,
);

caught!(
    an_unfair_lock_is_caught,
    Sabotage::Unfair,
    fair_lock_grants_in_waiting_order,
);

caught!(
    a_release_that_frees_nothing_is_caught,
    Sabotage::ReleaseIgnored,
    dropped_guard_is_released_in_background,
    a_guard_dropped_off_runtime_is_released,
);

caught!(
    holds_that_never_expire_are_caught,
    Sabotage::NeverExpires,
    abandoned_hold_expires,
);

caught!(
    kinds_kept_apart_are_caught,
    Sabotage::KindsApart,
    a_mutex_and_a_read_write_lock_on_one_name_exclude_each_other,
    a_lock_and_a_semaphore_on_one_name_exclude_each_other,
);

caught!(
    silence_taken_for_a_held_lock_is_caught,
    Sabotage::SilenceIsHeld,
    a_silent_store_is_an_error_not_a_held_lock,
);

// A store that frees a hold 2 % of its lease early, beyond the client's 1 % + 5 ms drift
// allowance: with the default 30 s lease, another client is granted the lock before the
// silent holder stops.
caught!(
    a_store_that_frees_early_is_caught,
    Sabotage::FreeEarly,
    a_silent_holder_stops_before_the_lock_passes_on,
);

// A store that frees a hold 0.5 % of its lease early, within the client's drift allowance:
// the silent holder still stops first, but by about 145 ms, less than the 1 % of the lease
// (less a loaded machine's slack) the case asks.
caught!(
    a_store_that_frees_slightly_early_is_caught,
    Sabotage::FreeSlightlyEarly,
    a_silent_holder_stops_before_the_lock_passes_on,
);

caught!(
    a_fair_downgrade_queued_behind_writers_is_caught,
    Sabotage::DowngradeQueued,
    rw_fair_downgrade_with_a_writer_queued,
);

/// The same cases pass on an intact store: the failures above are the sabotage's doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_intact_store_passes_the_same_cases() {
    let f = Broken::new(None);
    cases::waiter_longer_than_its_lease_keeps_it(&f).await;
    cases::stale_release_reaches_the_store(&f).await;
    cases::fencing_increases_across_expiry_and_takeover(&f).await;
    cases::cancelled_fair_waiters_leave_nothing(&f).await;
    cases::semaphore_handles_must_agree_on_permits(&f).await;
    cases::tasks_sharing_a_handle_exclude_each_other(&f).await;
    cases::a_mutex_and_a_read_write_lock_on_one_name_exclude_each_other(&f).await;
    cases::a_lock_and_a_semaphore_on_one_name_exclude_each_other(&f).await;
    cases::a_silent_store_is_an_error_not_a_held_lock(&f).await;
    cases::rw_fair_downgrade_with_a_writer_queued(&f).await;
    cases::election_has_one_leader_and_says_who(&f).await;
    cases::election_cancelled_campaign_leaves_nothing(&f).await;
}

/// A factory that cannot count residue fails the cancellation cases; it never passes them in
/// silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_factory_without_a_residue_count_fails_loudly() {
    let mut f = Broken::new(None);
    f.counts_residue = false;
    must_fail(
        "a factory without residue",
        cases::cancelled_waiter_leaves_nothing(&f),
    )
    .await;
    must_fail(
        "a factory without residue",
        cases::cancel_at_every_point_leaves_nothing(&f),
    )
    .await;
}
