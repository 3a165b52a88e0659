//! The memory backend in your own tests: a real implementation of the whole contract, in
//! one process, with hooks that make the bad days happen on demand.
//!
//! ```text
//! cargo run --example testing_with_memory
//! ```
//!
//! Put code like this in `#[tokio::test]`s: here it runs as a program that asserts.

use std::time::Duration;

use dlock::memory::MemoryProvider;
use dlock::{Lease, LockOptions, Locks, LossReason};

/// The code under test: does a job while it holds the lock, and stops when the lock is lost.
async fn nightly_job(locks: &Locks) -> dlock::Result<&'static str> {
    let lock = locks.lock_with(
        "jobs/nightly",
        LockOptions::new().with_lease(Lease::watchdog(Duration::from_millis(300))),
    )?;
    let Some(guard) = lock.try_acquire(Duration::ZERO).await? else {
        return Ok("skipped: another instance runs it");
    };
    tokio::select! {
        () = guard.lost() => Ok("stopped: the lock was lost"),
        () = tokio::time::sleep(Duration::from_secs(2)) => {
            guard.release().await?;
            Ok("done")
        }
    }
}

#[tokio::main]
async fn main() -> dlock::Result<()> {
    // One named store per test keeps tests apart; every provider of that name shares it.
    let store = MemoryProvider::named("example-tests");
    let locks = Locks::new(std::sync::Arc::new(store.clone()));

    // 1. Someone else holds the lock: the job skips.
    let other = locks.lock("jobs/nightly")?.acquire().await?;
    assert_eq!(
        nightly_job(&locks).await?,
        "skipped: another instance runs it"
    );
    other.release().await?;

    // 2. The store becomes unreachable for this client mid-job: renewals fail, the lease
    //    runs out, the job is told and stops.
    let job = tokio::spawn({
        let locks = locks.clone();
        async move { nightly_job(&locks).await }
    });
    while store.holders("jobs/nightly") == 0 {
        tokio::task::yield_now().await;
    }
    store.set_partitioned(true);
    let outcome = job.await.expect("the job task")?;
    assert_eq!(outcome, "stopped: the lock was lost");
    store.set_partitioned(false);

    // 3. An operator deletes the hold behind the holder's back: its next renewal finds out.
    let guard = locks
        .lock_with(
            "jobs/other",
            LockOptions::new().with_lease(Lease::watchdog(Duration::from_millis(300))),
        )?
        .acquire()
        .await?;
    store.drop_holds("jobs/other");
    guard.lost().await;
    assert_eq!(guard.loss_reason(), Some(LossReason::Gone));

    // 4. Nothing is left behind.
    assert_eq!(
        store.holders("jobs/nightly") + store.waiters("jobs/nightly"),
        0
    );
    println!("every scenario behaved");
    Ok(())
}
