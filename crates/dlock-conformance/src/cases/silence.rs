//! A network that goes silent (connections open, nothing flows): the holder stops before the
//! store can give the lock to anyone else, with the backend's default settings, and a store
//! that does not answer is an error, never a lock held by someone else.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{CALL_GRACE, Mutex};
use dlock_core::{Capabilities, DistributedLockExt, DriftAllowance, Lease, LockOptions};
use tokio::time::Instant;

use super::election::SilentLeader;
use super::{
    Need, WATCHDOG_LEASES_WITH_LOSS_DETECTION, ZERO, assert_busy, caps, client, cuttable_clients,
    cuttable_clients_if, lock, lock_with, release, skip, take,
};
use crate::Factory;
use crate::record::{Outcome, measure, note};
use crate::support::{Names, must};

/// The longest a silent-network case waits for the other client's grant: a 30 s watchdog
/// lease, a session timeout, and time to spare.
const GRANT_WITHIN: Duration = Duration::from_secs(90);

/// Records when it is dropped: when `run()` dropped its work.
struct Stopped(Arc<Mutex<Option<Instant>>>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.lock().get_or_insert_with(Instant::now);
    }
}

/// With the backend's default settings (a 30 s watchdog lease, its default session), a
/// holder whose network goes silent stops before anyone else is granted the lock: `run()`'s
/// work is dropped, and the hold's `lost()` resolves, strictly before another client's
/// `acquire()` returns, by at least 1 % of the lease (less a scheduling tolerance). Where the
/// backend has elections, a leader on the same client is cut off with it and must be told it
/// is deposed before another campaigner leads, by the same margins. The margins are recorded
/// for `docs/guarantees.md`.
///
/// A connection-bound hold (SQL `for-update`, advisory) ends on the server with its session,
/// which the server ends a lease after the last statement that reached it (its idle
/// timeouts), whatever the silent network keeps open. A store that kept such a hold for as
/// long as a silent connection lived would grant nobody else: the run would prove that the
/// holder stops but not the order, and is recorded as inconclusive.
pub async fn a_silent_holder_stops_before_the_lock_passes_on(f: &impl Factory) {
    let Some(partitionable) = f.connect_partitionable_as_deployed().await else {
        return skip(
            f,
            "the factory cannot cut a client with the default settings off the store",
        );
    };
    let (p, cut) = partitionable.unwrap_or_else(|e| panic!("connect: {e}"));
    let b = client(f).await;
    let caps = caps(&p);
    if !WATCHDOG_LEASES_WITH_LOSS_DETECTION.met(f, &caps) {
        return;
    }
    let name = Names::new().name("silent");
    // Reentrant, so that the work can re-enter the hold to watch it; the settings are the
    // backend's defaults otherwise.
    let holder = lock_with(&p, &name, LockOptions::new().with_reentrant(caps.reentrant));
    let lease = LockOptions::default().lease.ttl();
    let stopped = Arc::new(Mutex::new(None));
    let lost_at = Arc::new(Mutex::new(None));
    let (granted_tx, granted) = tokio::sync::oneshot::channel();
    let running = {
        let (l, stopped, lost_at) = (
            Arc::clone(&holder),
            Arc::clone(&stopped),
            Arc::clone(&lost_at),
        );
        let reentrant = caps.reentrant;
        tokio::spawn(async move {
            holder
                .run(move |_| async move {
                    let _stopped = Stopped(stopped);
                    // The same task re-enters its hold to watch it: one hold, watched both
                    // ways.
                    let ahead = if reentrant {
                        let g = l.try_acquire(ZERO).await.ok().flatten();
                        let ahead = g.as_ref().map(dlock_core::LockGuard::remaining);
                        if let Some(g) = g {
                            let lost = g.lost();
                            drop(g);
                            tokio::spawn(async move {
                                lost.await;
                                lost_at.lock().get_or_insert_with(Instant::now);
                            });
                        }
                        ahead
                    } else {
                        None
                    };
                    let _ = granted_tx.send(ahead);
                    std::future::pending::<()>().await;
                })
                .await
        })
    };
    let ahead = must(Duration::from_secs(30), "the holder's grant", granted)
        .await
        .unwrap_or_else(|_| panic!("run() ended before its work began"));
    let waiter = {
        let l = lock(&b, &name);
        tokio::spawn(async move {
            let g = l.acquire().await;
            (Instant::now(), g)
        })
    };
    assert_busy(&lock(&b, &name), "the holder holds it").await;
    // A leader of an election on the same client, cut off with it.
    let leader = if caps.election {
        Some(SilentLeader::start(&p, &b, &name).await)
    } else {
        None
    };
    let cut_at = Instant::now();
    cut.set_partitioned(true);
    let got = tokio::time::timeout(GRANT_WITHIN, waiter).await;
    let stopped_at = *stopped.lock();
    let lost_seen = *lost_at.lock();
    let Ok(got) = got else {
        running.abort();
        cut.set_partitioned(false);
        let stopped_at =
            stopped_at.unwrap_or_else(|| panic!("the silent holder's work never stopped"));
        if caps.connection_bound {
            let why = format!(
                "a connection-bound hold lives on the server as long as its silent \
                 connection: nobody else was granted the lock within {GRANT_WITHIN:?}, so the \
                 order of the handoff was not seen (the holder stopped {:?} after the cut)",
                stopped_at - cut_at
            );
            eprintln!("{}: {why}", f.label());
            return note(Outcome::Inconclusive(why));
        }
        panic!("nobody else was granted the lock within {GRANT_WITHIN:?} of the cut");
    };
    let (granted_at, g) = got.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let g = g.unwrap_or_else(|e| panic!("the other client's acquire: {e}"));
    running.abort();
    let stopped_at =
        stopped_at.unwrap_or_else(|| panic!("run()'s work still ran when the lock passed on"));
    let run_margin = granted_at.saturating_duration_since(stopped_at);
    assert!(
        stopped_at < granted_at,
        "run()'s work stopped {:?} after another client was granted the lock",
        stopped_at - granted_at
    );
    let least = least_margin(lease);
    assert!(
        run_margin >= least,
        "run()'s work stopped only {run_margin:?} before the next grant"
    );
    measure("vouched ahead at the grant", format!("{ahead:.1?}"));
    measure(
        "run() stopped after the cut",
        format!("{:.1?}", stopped_at - cut_at),
    );
    measure(
        "run() stopped before the next grant",
        format!("{run_margin:.1?}"),
    );
    if caps.reentrant {
        let lost_seen =
            lost_seen.unwrap_or_else(|| panic!("lost() had not resolved when the lock passed on"));
        assert!(
            lost_seen < granted_at,
            "lost() resolved {:?} after another client was granted the lock",
            lost_seen - granted_at
        );
        let lost_margin = granted_at.saturating_duration_since(lost_seen);
        assert!(
            lost_margin >= least,
            "lost() resolved only {lost_margin:?} before the next grant"
        );
        measure("lost() before the next grant", format!("{lost_margin:.1?}"));
    }
    eprintln!(
        "{}: cut at 0; run() stopped at {:?}, lost() at {:?}, the next grant at {:?}",
        f.label(),
        stopped_at - cut_at,
        lost_seen.map(|t| t - cut_at),
        granted_at - cut_at
    );
    release(g).await;
    // The network stays silent until the leader too has been deposed by the store: a client
    // that has learnt of its loss closes its connections, and a network healed earlier would
    // carry that close to the store, which would then hand the leadership on before its
    // lease ran out (a connection-bound hold ends with its connection).
    if let Some(leader) = leader {
        leader.check(cut_at, GRANT_WITHIN).await;
    }
    cut.set_partitioned(false);
}

/// The line to the store goes silent while a hold with a fixed lease runs: the guard's
/// `lost()` resolves (a drift allowance of a third of the lease, here) while the store still
/// keeps the hold, never after it freed the lock.
pub async fn a_partitioned_holders_loss_comes_before_the_store_frees_the_lock(f: &impl Factory) {
    let offered = |c: &Capabilities| c.fixed_lease && c.loss_detection;
    let why = "no fixed leases with loss detection";
    let Some((p, cut, b)) = cuttable_clients_if(f, Need(offered, why)).await else {
        return;
    };
    let name = Names::new().name("before-free");
    let lease = f.short_lease();
    let options = LockOptions::new()
        .with_lease(Lease::Fixed(lease))
        .with_drift(DriftAllowance::new(333_333, Duration::ZERO));
    let g = take(f, &lock_with(&p, &name, options)).await;
    cut.set_partitioned(true);
    must(lease + f.slack(), "lost() of the cut-off holder", g.lost()).await;
    assert!(!g.is_held());
    assert_busy(
        &lock(&b, &name),
        "lost() resolved only after the store had freed the lock",
    )
    .await;
    cut.set_partitioned(false);
    drop(g);
}

/// A store that does not answer (a silent network) is an error, never `Ok(None)`: whether the
/// lock is free or held by another client, `try_acquire(wait)` through the silent line
/// returns a retryable error by `wait` plus [`CALL_GRACE`] and the factory's slack.
pub async fn a_silent_store_is_an_error_not_a_held_lock(f: &impl Factory) {
    let Some((p, cut, b)) = cuttable_clients(f).await else {
        return;
    };
    let name = Names::new().name("silent-store");
    let l = lock(&p, &name);
    // The line works first: the connections exist when it goes silent.
    release(take(f, &l).await).await;
    let wait = Duration::from_millis(300);
    let limit = wait + CALL_GRACE + f.slack();
    for held in [false, true] {
        let other = if held {
            Some(take(f, &lock(&b, &name)).await)
        } else {
            None
        };
        cut.set_partitioned(true);
        let r = must(
            limit,
            "try_acquire through a silent line",
            l.try_acquire(wait),
        )
        .await;
        cut.set_partitioned(false);
        let state = if held {
            "held by another client"
        } else {
            "free"
        };
        match r {
            Err(e) => assert!(
                e.is_retryable(),
                "a silent store ({state}) gave an error that says retrying cannot help: {e}"
            ),
            Ok(None) => panic!("a silent store was taken for a lock held by someone ({state})"),
            Ok(Some(g)) => panic!("granted through a silent line ({state}): {g:?}"),
        }
        if let Some(other) = other {
            release(other).await;
        }
    }
    // The line is back: the lock works again.
    let again = must(
        f.slack() * 4,
        "the lock after the line is back",
        l.try_acquire(f.slack() * 3),
    )
    .await;
    match again {
        Ok(Some(g)) => release(g).await,
        Ok(None) => panic!("still held after the line came back"),
        Err(e) => panic!("try_acquire after the line came back: {e}"),
    }
}

/// What a silent holder must be told ahead of the next grant: 1 % of the lease (the drift
/// allowance's floor), less what a loaded machine may add to the timer that tells it and to
/// the task that records the moment (the margin without the allowance is one round trip, far
/// below this).
pub(super) fn least_margin(lease: Duration) -> Duration {
    (lease / 100).saturating_sub(Duration::from_millis(100))
}
