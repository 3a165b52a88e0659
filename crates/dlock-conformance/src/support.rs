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
/// wakes every [`StallProbe::TICK`] and keeps the longest it overslept.
///
/// A watchdog renews a lease every third of it, so a process kept off the CPU (or a runtime
/// kept from polling) for a third of the lease can lose a hold however correct the backend.
/// That is the lease doing its job, not a failure: a case that asserts a live holder keeps
/// its hold first asks the probe whether the holder was live.
pub(crate) struct StallProbe {
    worst_ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl StallProbe {
    /// How often the probe wakes.
    pub(crate) const TICK: Duration = Duration::from_millis(5);

    /// Starts watching the current runtime.
    pub(crate) fn start() -> Self {
        let worst_ns = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = std::sync::Arc::clone(&worst_ns);
        let task = tokio::spawn(async move {
            loop {
                let before = Instant::now();
                tokio::time::sleep(Self::TICK).await;
                let over = before.elapsed().saturating_sub(Self::TICK);
                let over = u64::try_from(over.as_nanos()).unwrap_or(u64::MAX);
                seen.fetch_max(over, std::sync::atomic::Ordering::Relaxed);
            }
        });
        Self { worst_ns, task }
    }

    /// The longest the probe was kept waiting past its tick so far.
    pub(crate) fn worst(&self) -> Duration {
        Duration::from_nanos(self.worst_ns.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Whether the runtime stalled long enough (a third of `lease`) that a watchdog on it may
    /// have missed its renewal: then a lost hold proves nothing, and the case says so.
    pub(crate) fn explains_a_loss(&self, what: &str, lease: Duration) -> bool {
        let worst = self.worst();
        let stalled = worst >= lease / 3;
        if stalled {
            eprintln!(
                "{what}: the runtime stalled {worst:?}, a third of the {lease:?} lease or more: \
                 its watchdog could not renew in time, so the loss is the lease doing its job \
                 and this run proves nothing about keeping a live hold"
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
    async fn the_probe_sees_a_blocked_runtime() {
        let probe = StallProbe::start();
        // The probe's first sleep has begun.
        tokio::task::yield_now().await;
        let lease = Duration::from_millis(300);
        // The only thread of the runtime is kept busy: the probe cannot run. (Whether a quiet
        // runtime looks quiet depends on the machine's load; the sabotage cases in
        // tests/cases_can_fail.rs show that a loss without a stall still fails a case.)
        std::thread::sleep(Duration::from_millis(150));
        tokio::time::sleep(StallProbe::TICK * 2).await;
        assert!(
            probe.worst() >= Duration::from_millis(100),
            "{:?}",
            probe.worst()
        );
        assert!(probe.explains_a_loss("blocked", lease));
    }
}
