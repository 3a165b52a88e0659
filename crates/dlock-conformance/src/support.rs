//! Helpers for cases: fresh names, bounded waits, bounded polls.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use dlock_core::LossReason;
use dlock_core::backend::Mutex;
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

/// Checks that `parse` (a backend's `from_url`) refuses each of `urls` with a configuration
/// error whose message never shows the password `secret` the URLs carry.
pub fn refuses_urls<T>(parse: impl Fn(&str) -> dlock_core::Result<T>, urls: &[&str]) {
    for url in urls {
        match parse(url) {
            Ok(_) => panic!("{url}: accepted"),
            Err(e) => {
                assert!(matches!(e, dlock_core::Error::Config { .. }), "{url}: {e}");
                assert!(!e.to_string().contains("secret"), "{url}: {e}");
            }
        }
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

/// A probe of what can make a live holder lose a watchdog hold however correct the backend (a
/// stalled runtime, a slow store), and the rule by which it excuses such a loss.
pub(crate) trait ExplainsALoss {
    /// Whether a loss for `reason` can be what this probe watches doing its job.
    fn may_excuse(&self, reason: Option<LossReason>) -> bool;

    /// The worst this probe saw within `window` before now (a stall, a wait for an answer).
    fn worst_seen(&self, window: Duration) -> Duration;

    /// Why a loss for `reason` of a hold with `lease` proves nothing, `worst` having been seen.
    fn why(&self, worst: Duration, lease: Duration, reason: Option<LossReason>) -> String;

    /// Whether a loss for `reason` of a watchdog hold with `lease` is the lease doing its job:
    /// a loss this probe may excuse, while it saw half the lease or more within the last two
    /// leases. Says so when it is: the run then proves nothing about keeping a live hold.
    fn explains_a_loss(&self, what: &str, lease: Duration, reason: Option<LossReason>) -> bool {
        if !self.may_excuse(reason) {
            return false;
        }
        let worst = self.worst_seen(lease * 2);
        let excused = worst >= lease / 2;
        if excused {
            let why = self.why(worst, lease, reason);
            eprintln!("{what}: {why}");
            crate::record::inconclusive_by_chance(why);
        }
        excused
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
    seen: std::sync::Arc<Mutex<Seen>>,
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
        let seen = std::sync::Arc::new(Mutex::new(Seen {
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
                let mut seen = mine.lock();
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
        let seen = self.seen.lock();
        let ongoing = now
            .saturating_duration_since(seen.last_wake)
            .saturating_sub(Self::TICK);
        within(&seen.stalls, now, window, ongoing, combine)
    }
}

impl ExplainsALoss for StallProbe {
    /// Only a lease that ended without a renewal (`LeaseEnded`: no renewal had failed, the
    /// keeper did not get one through in time). A renewal the store refused (`RenewalFailed`)
    /// or a hold it took away (`Gone`) is never excused.
    fn may_excuse(&self, reason: Option<LossReason>) -> bool {
        reason == Some(LossReason::LeaseEnded)
    }

    fn worst_seen(&self, window: Duration) -> Duration {
        self.worst_within(window)
    }

    fn why(&self, worst: Duration, lease: Duration, _: Option<LossReason>) -> String {
        format!(
            "the runtime stalled {worst:?}, half the {lease:?} lease or more: its watchdog \
             could not renew in time, so the loss is the lease doing its job and this run \
             proves nothing about keeping a live hold"
        )
    }
}

/// The lengths of the `events` (when each ended, how long it was) that ended within `window`
/// before `now`, and `ongoing` (one still going on), combined with `combine`.
fn within(
    events: &[(Instant, Duration)],
    now: Instant,
    window: Duration,
    ongoing: Duration,
    combine: fn(Duration, Duration) -> Duration,
) -> Duration {
    events
        .iter()
        .filter(|(end, _)| now.saturating_duration_since(*end) <= window)
        .map(|(_, d)| *d)
        .fold(ongoing, combine)
}

impl Drop for StallProbe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long the store took to answer, watched while a case waits: another client tries the
/// case's lock again and again (`try_acquire(ZERO)`, giving back what it gets) and keeps each
/// try slower than [`StoreProbe::NOTED`], with when it ended.
///
/// A watchdog can keep a hold only while the store answers its renewals within what is left
/// of the lease: a store slow to answer for half the lease or more (a loaded machine starving
/// its process) loses the hold however correct the client, as a stalled runtime does (see
/// [`StallProbe`]). The tries go through another client's own connection, so a client that
/// fails to renew while the store answers others in time is still caught.
pub(crate) struct StoreProbe {
    seen: std::sync::Arc<Mutex<Answers>>,
    task: tokio::task::JoinHandle<()>,
}

struct Answers {
    /// When the try in flight began, if one is.
    asked: Option<Instant>,
    /// The slow tries: when each ended, and how long it took.
    slow: Vec<(Instant, Duration)>,
    /// How many tries were answered.
    answered: u64,
}

impl StoreProbe {
    /// The shortest answer time kept.
    pub(crate) const NOTED: Duration = Duration::from_millis(10);

    /// The pause between two tries.
    const PAUSE: Duration = Duration::from_millis(50);

    /// Starts trying `lock` (a handle of another client than the holder's).
    pub(crate) fn start(lock: dlock_core::DynLock) -> Self {
        let seen = std::sync::Arc::new(Mutex::new(Answers {
            asked: None,
            slow: Vec::new(),
            answered: 0,
        }));
        let mine = std::sync::Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let answers = || mine.lock();
            // A first try that is not timed: a client's first call also connects, loads
            // scripts or reads a cluster's slots, which is not the store being slow.
            if let Ok(Some(g)) = lock.try_acquire(Duration::ZERO).await {
                let _ = g.release().await;
            }
            loop {
                let asked = Instant::now();
                answers().asked = Some(asked);
                let got = lock.try_acquire(Duration::ZERO).await;
                let now = Instant::now();
                {
                    let mut seen = answers();
                    seen.asked = None;
                    seen.answered += 1;
                    let took = now.saturating_duration_since(asked);
                    if took >= Self::NOTED {
                        seen.slow.push((now, took));
                    }
                }
                if let Ok(Some(g)) = got {
                    let _ = g.release().await;
                }
                // The pace of the tries (the probe's own rhythm, not a wait for an event).
                tokio::time::sleep(Self::PAUSE).await;
            }
        });
        Self { seen, task }
    }

    /// The slowest answer that came within `window` before now, or is still awaited.
    pub(crate) fn slowest_within(&self, window: Duration) -> Duration {
        let now = Instant::now();
        let seen = self.seen.lock();
        let ongoing = seen
            .asked
            .map_or(Duration::ZERO, |asked| now.saturating_duration_since(asked));
        within(&seen.slow, now, window, ongoing, Duration::max)
    }
}

impl ExplainsALoss for StoreProbe {
    /// A lease that ended without a renewal (`LeaseEnded`) or with renewals that did not get
    /// through in time (`RenewalFailed`). A hold the store took away (`Gone`) is never
    /// excused.
    fn may_excuse(&self, reason: Option<LossReason>) -> bool {
        matches!(
            reason,
            Some(LossReason::LeaseEnded | LossReason::RenewalFailed)
        )
    }

    fn worst_seen(&self, window: Duration) -> Duration {
        self.slowest_within(window)
    }

    fn why(&self, slowest: Duration, lease: Duration, reason: Option<LossReason>) -> String {
        format!(
            "the store took {slowest:?} to answer another client, half the {lease:?} lease or \
             more: the watchdog could not renew in time, so the loss ({reason:?}) is the lease \
             doing its job and this run proves nothing about keeping a live hold"
        )
    }
}

impl Drop for StoreProbe {
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
                let seen = probe.seen.lock();
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

    /// A lock whose store answers every try after `delay`: nobody ever gets it.
    #[derive(Debug)]
    struct SlowStore {
        name: dlock_core::LockName,
        options: dlock_core::LockOptions,
        delay: Duration,
    }

    #[async_trait::async_trait]
    impl dlock_core::DistributedLock for SlowStore {
        fn name(&self) -> &dlock_core::LockName {
            &self.name
        }

        fn options(&self) -> &dlock_core::LockOptions {
            &self.options
        }

        fn store_id(&self) -> &str {
            "slow"
        }

        async fn acquire(&self) -> dlock_core::Result<dlock_core::LockGuard> {
            std::future::pending().await
        }

        async fn try_acquire(
            &self,
            _wait: Duration,
        ) -> dlock_core::Result<Option<dlock_core::LockGuard>> {
            // The fault this fake store injects: a slow answer.
            tokio::time::sleep(self.delay).await;
            Ok(None)
        }
    }

    fn slow_store(delay: Duration) -> dlock_core::DynLock {
        std::sync::Arc::new(SlowStore {
            name: dlock_core::LockName::new("slow").unwrap(),
            options: dlock_core::LockOptions::default(),
            delay,
        })
    }

    #[tokio::test]
    async fn the_store_probe_excuses_only_a_renewal_loss_while_the_store_was_slow() {
        use dlock_core::LossReason::{Gone, LeaseEnded, RenewalFailed};
        let lease = Duration::from_millis(300);
        let slow = StoreProbe::start(slow_store(Duration::from_millis(200)));
        eventually(
            Duration::from_secs(5),
            "the probe sees a slow answer",
            || async {
                if slow.slowest_within(lease) >= Duration::from_millis(150) {
                    Ok(())
                } else {
                    Err(())
                }
            },
        )
        .await;
        for excused in [LeaseEnded, RenewalFailed] {
            assert!(slow.explains_a_loss("slow", lease, Some(excused)));
        }
        for other in [None, Some(Gone)] {
            assert!(!slow.explains_a_loss("slow", lease, other));
        }
        // A store that answers at once excuses nothing.
        let quick = StoreProbe::start(slow_store(Duration::ZERO));
        eventually(
            Duration::from_secs(5),
            "the probe has asked a few times",
            || async {
                let answered = quick.seen.lock().answered;
                if answered >= 3 { Ok(()) } else { Err(()) }
            },
        )
        .await;
        assert!(!quick.explains_a_loss("quick", lease, Some(RenewalFailed)));
    }
}
