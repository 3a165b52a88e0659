//! Helpers for cases: fresh names, bounded waits, bounded polls.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Fresh lock names under a namespace no other case (or run) uses.
#[derive(Debug, Clone)]
pub struct Names {
    prefix: String,
}

impl Names {
    /// A fresh namespace.
    pub fn new() -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Self {
            prefix: format!("dlock-test/{}/", &id[..12]),
        }
    }

    /// The name `suffix` in this namespace.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// The namespace prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl Default for Names {
    fn default() -> Self {
        Self::new()
    }
}

/// Awaits `fut`, failing the case with `what` if it takes longer than `limit`.
pub async fn must<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not complete within {limit:?}"),
    }
}

/// How long past its limit the check running at the limit may take before it counts as hung.
const CHECK_GRACE: Duration = Duration::from_secs(10);

/// Polls `check` until it returns `Ok`, every 10 ms (doubling to at most 200 ms), failing the
/// case with `what` and the last value seen if `limit` passes first. A check that hangs is cut
/// off 10 s after the limit (and fails the case): a probe of a server that accepted
/// the connection and never answered once hung CI for good.
pub async fn eventually<T, V, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    V: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, V>>,
{
    let deadline = dlock_core::backend::from_now(limit);
    let mut pause = Duration::from_millis(10);
    // A check that started in time may finish a little late (a slow call on a loaded machine);
    // one that does not return at all is cut off, so a hang fails the case.
    let cut_off = dlock_core::backend::later(deadline, CHECK_GRACE);
    loop {
        let last = match tokio::time::timeout_at(cut_off, check()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(last)) => last,
            Err(_) => panic!(
                "{what}: not true within {limit:?}; the last check did not return within \
                 {CHECK_GRACE:?} more"
            ),
        };
        if Instant::now() >= deadline {
            panic!("{what}: not true within {limit:?}; last seen: {last:?}");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// How long the runtime kept a task from running, watched while a case waits: a task that
/// wakes every [`StallProbe::TICK`] and keeps each time it overslept by more than
/// [`StallProbe::NOTED`], with when that ended.
///
/// A watchdog renews a lease every third of it and counts each renewal's lease from when it
/// was sent (`dlock_core`'s keeper), so a runtime kept from polling it for about two thirds of
/// the lease, less a renewal's round trip, loses the hold however correct the backend: the
/// lease doing its job, not a failure. A case that asserts a live holder keeps its hold asks
/// the probe whether the holder was live before it fails.
pub(crate) struct StallProbe {
    seen: std::sync::Arc<std::sync::Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

struct Seen {
    /// When the probe last woke.
    last_wake: Instant,
    /// The oversleeps above [`StallProbe::NOTED`]: when each ended, and how long it was.
    stalls: Vec<(Instant, Duration)>,
}

impl StallProbe {
    /// How often the probe wakes.
    pub(crate) const TICK: Duration = Duration::from_millis(5);

    /// The shortest oversleep kept.
    pub(crate) const NOTED: Duration = Duration::from_millis(10);

    /// Starts watching the current runtime.
    pub(crate) fn start() -> Self {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen {
            last_wake: Instant::now(),
            stalls: Vec::new(),
        }));
        let mine = std::sync::Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let before = Instant::now();
                tokio::time::sleep(Self::TICK).await;
                let now = Instant::now();
                let over = now
                    .saturating_duration_since(before)
                    .saturating_sub(Self::TICK);
                let mut seen = mine
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                seen.last_wake = now;
                if over >= Self::NOTED {
                    seen.stalls.push((now, over));
                }
            }
        });
        Self { seen, task }
    }

    /// The longest stall that ended within `window` before now, or is still going on (the
    /// time since the probe last woke, less its tick).
    pub(crate) fn worst_within(&self, window: Duration) -> Duration {
        self.stalls_within(window, Duration::max)
    }

    /// All the time the runtime was kept from running the probe within `window` before now:
    /// the stalls that ended in it, and the one still going on (each counted whole).
    pub(crate) fn stalled_within(&self, window: Duration) -> Duration {
        self.stalls_within(window, Duration::saturating_add)
    }

    /// The stalls that ended within `window` before now and the one still going on, combined
    /// with `combine`.
    fn stalls_within(
        &self,
        window: Duration,
        combine: fn(Duration, Duration) -> Duration,
    ) -> Duration {
        let now = Instant::now();
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ongoing = now
            .saturating_duration_since(seen.last_wake)
            .saturating_sub(Self::TICK);
        seen.stalls
            .iter()
            .filter(|(end, _)| now.saturating_duration_since(*end) <= window)
            .map(|(_, d)| *d)
            .fold(ongoing, combine)
    }

    /// Whether a loss for `reason` of a watchdog hold with `lease` is the lease doing its job:
    /// the lease ended without a renewal (`LeaseEnded`: no renewal had failed, the keeper
    /// did not get one through in time) and the runtime stalled for half the lease or more
    /// within the last two leases. Says so when it is: the run then proves nothing about
    /// keeping a live hold. A renewal the store refused (`RenewalFailed`) or a hold it took
    /// away (`Gone`) is never excused.
    pub(crate) fn explains_a_loss(
        &self,
        what: &str,
        lease: Duration,
        reason: Option<dlock_core::LossReason>,
    ) -> bool {
        if reason != Some(dlock_core::LossReason::LeaseEnded) {
            return false;
        }
        let worst = self.worst_within(lease * 2);
        let stalled = worst >= lease / 2;
        if stalled {
            eprintln!(
                "{what}: the runtime stalled {worst:?}, half the {lease:?} lease or more: its \
                 watchdog could not renew in time, so the loss is the lease doing its job and \
                 this run proves nothing about keeping a live hold"
            );
        }
        stalled
    }
}

impl Drop for StallProbe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn the_probe_sees_a_blocked_runtime_and_excuses_only_a_lease_that_ended() {
        let probe = StallProbe::start();
        // The probe's first sleep has begun.
        tokio::task::yield_now().await;
        let lease = Duration::from_millis(300);
        // The only thread of the runtime is kept busy: the probe cannot run. (Whether a quiet
        // runtime looks quiet depends on the machine's load; the sabotage cases in
        // tests/cases_can_fail.rs show that a loss without a stall still fails a case.)
        std::thread::sleep(Duration::from_millis(200));
        // Seen while it goes on, and once the probe has woken and kept it.
        assert!(probe.worst_within(lease) >= Duration::from_millis(150));
        assert!(probe.stalled_within(lease) >= Duration::from_millis(150));
        eventually(
            Duration::from_secs(5),
            "the probe keeps the stall",
            || async {
                let seen = probe
                    .seen
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if seen.stalls.is_empty() {
                    Err(())
                } else {
                    Ok(())
                }
            },
        )
        .await;
        assert!(
            probe.worst_within(lease) >= Duration::from_millis(150),
            "{:?}",
            probe.worst_within(lease)
        );
        let ended = Some(dlock_core::LossReason::LeaseEnded);
        assert!(probe.explains_a_loss("blocked", lease, ended));
        for other in [
            None,
            Some(dlock_core::LossReason::RenewalFailed),
            Some(dlock_core::LossReason::Gone),
        ] {
            assert!(!probe.explains_a_loss("blocked", lease, other));
        }
    }
}
