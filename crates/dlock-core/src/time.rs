//! Time arithmetic for deadlines and leases, in one place.
//!
//! `Instant + Duration` panics when the sum does not fit (`Duration::MAX` is a common way to
//! say "forever"), so nothing in dlock adds a caller's duration to an instant directly: a
//! deadline that does not fit is no deadline ([`Deadline::after`]), and a lease end that does
//! not fit is the far future ([`later`]).

use std::future::Future;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::Either;

use tokio::time::Instant;

/// About thirty years: what [`later`] returns past the start when the sum does not fit. Far
/// enough to be "never" for a lock, near enough that every platform's clock can represent it.
const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// `start + d`, or the far future (about thirty years on) if that does not fit.
///
/// Use it for every lease end, renewal time and pause, instead of `+`.
pub fn later(start: Instant, d: Duration) -> Instant {
    start
        .checked_add(d)
        .or_else(|| start.checked_add(FAR))
        .unwrap_or(start)
}

/// `start - d`, or `start` itself if that does not fit (an instant within `d` of the clock's
/// own start, which a running program never meets).
pub fn earlier(start: Instant, d: Duration) -> Instant {
    start.checked_sub(d).unwrap_or(start)
}

/// `d` from now, saturating like [`later`].
pub fn from_now(d: Duration) -> Instant {
    later(Instant::now(), d)
}

/// The last beat at or before `t` of a clock that beats every `period` (the same beats for
/// every caller in the process, counted from the first call), or `t` itself if `period` is
/// zero or the arithmetic does not fit.
///
/// The keeper renews each watchdog lease of a hold that renews in batches on such a beat: the
/// holds of one provider then come due together, so its renewals gather into one batch a
/// period however many holds it keeps (two while holds keep arriving), and since the beat is
/// never after `t`, a renewal is never later than `t`.
pub(crate) fn beat_at_or_before(t: Instant, period: Duration) -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    let period_ns = period.as_nanos();
    if period_ns == 0 {
        return t;
    }
    let behind = if t >= origin {
        (t - origin).as_nanos() % period_ns
    } else {
        // Before the origin: beats run backwards from it too.
        match (origin - t).as_nanos() % period_ns {
            0 => 0,
            ahead => period_ns - ahead,
        }
    };
    u64::try_from(behind)
        .ok()
        .and_then(|ns| t.checked_sub(Duration::from_nanos(ns)))
        .unwrap_or(t)
}

/// When a wait ends: at an instant, or never (wait as long as it takes).
///
/// `try_acquire(wait)` turns `wait` into a deadline with [`Deadline::after`]; a `wait` too large
/// to add to the clock (e.g. `Duration::MAX`) is no deadline, so `try_acquire(Duration::MAX)`
/// behaves as `acquire()`.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::backend::Deadline;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// assert!(Deadline::after(Duration::MAX).is_never());
/// assert!(!Deadline::after(Duration::from_secs(1)).has_passed());
/// assert!(Deadline::after(Duration::ZERO).has_passed());
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// No deadline: wait as long as it takes.
    pub const NEVER: Self = Self(None);

    /// `wait` from now, or [`Deadline::NEVER`] if that does not fit on the clock.
    pub fn after(wait: Duration) -> Self {
        Self(Instant::now().checked_add(wait))
    }

    /// At `instant`.
    pub const fn at(instant: Instant) -> Self {
        Self(Some(instant))
    }

    /// The instant, or `None` for no deadline.
    pub const fn instant(self) -> Option<Instant> {
        self.0
    }

    /// Whether this is [`Deadline::NEVER`].
    pub const fn is_never(self) -> bool {
        self.0.is_none()
    }

    /// Whether the deadline has passed (never, for no deadline).
    pub fn has_passed(self) -> bool {
        self.0.is_some_and(|d| Instant::now() >= d)
    }

    /// Time left: `None` for no deadline, zero once it passed.
    pub fn remaining(self) -> Option<Duration> {
        self.0.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// The earlier of the deadline and `at`.
    pub fn earliest(self, at: Instant) -> Instant {
        self.0.map_or(at, |d| d.min(at))
    }

    /// The earlier of the deadline and `pause` from now: when a waiter that would sleep
    /// `pause` must wake up.
    pub fn wake_after(self, pause: Duration) -> Instant {
        self.earliest(from_now(pause))
    }

    /// The deadline moved `grace` later (still never for no deadline): a bound for server
    /// calls that may run a little past the wait itself.
    pub fn with_grace(self, grace: Duration) -> Self {
        Self(self.0.map(|d| later(d, grace)))
    }

    /// Sleeps until the deadline; forever for no deadline.
    pub async fn sleep(self) {
        match self.0 {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    }

    /// Runs `fut` until the deadline: `None` if the deadline came first. Nothing happens
    /// until the returned future is first polled (the deadline's timer then belongs to the
    /// runtime that polls it).
    ///
    /// A plain function returning the future, not an `async fn`: an `async fn` keeps the
    /// future it was given beside the one it awaits, doubling its size at every layer that
    /// wraps another (an acquisition passes through several).
    pub fn run<F: Future>(self, fut: F) -> impl Future<Output = Option<F::Output>> {
        match self.0 {
            // Made at the first poll, as an `async fn` would: `timeout_at` takes the
            // current runtime's timer when it is called.
            Some(d) => Either::Left(
                futures::future::lazy(move |_| tokio::time::timeout_at(d, fut))
                    .flatten()
                    .map(Result::ok),
            ),
            None => Either::Right(fut.map(Some)),
        }
    }
}

impl From<Option<Instant>> for Deadline {
    fn from(instant: Option<Instant>) -> Self {
        Self(instant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing happens before the first poll: the future may be made outside a runtime and
    /// run in one (as when `run` was an `async fn`).
    #[test]
    fn a_run_is_made_at_its_first_poll() -> std::io::Result<()> {
        let run = Deadline::after(Duration::from_secs(60)).run(async { 7 });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        assert_eq!(rt.block_on(run), Some(7));
        Ok(())
    }

    /// Beats are `period` apart, never after the instant asked about, and the same for every
    /// instant between two of them, on either side of the origin.
    #[test]
    fn beats_are_a_shared_grid_never_after_the_instant() {
        let period = Duration::from_millis(300);
        let now = Instant::now();
        let beat = beat_at_or_before(now, period);
        assert!(beat <= now && now - beat < period);
        for step in [0, 1, 7, 299] {
            let t = later(beat, Duration::from_millis(step));
            assert_eq!(beat_at_or_before(t, period), beat, "{step} ms after a beat");
        }
        let next = later(beat, period);
        assert_eq!(beat_at_or_before(next, period), next);
        let before = earlier(beat, Duration::from_secs(3600));
        assert_eq!(beat_at_or_before(before, period), before);
        let between = later(before, Duration::from_millis(1));
        assert_eq!(beat_at_or_before(between, period), before);
        assert_eq!(beat_at_or_before(now, Duration::ZERO), now);
        assert!(beat_at_or_before(now, Duration::MAX) <= now);
    }

    #[tokio::test]
    async fn huge_durations_never_panic() {
        let now = Instant::now();
        assert!(later(now, Duration::MAX) > now);
        assert!(later(now, Duration::from_secs(u64::MAX)) > now);
        assert_eq!(
            later(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert!(Deadline::after(Duration::MAX).is_never());
        assert_eq!(Deadline::after(Duration::MAX).remaining(), None);
        assert!(Deadline::NEVER.with_grace(Duration::MAX).is_never());
        let d = Deadline::after(Duration::from_secs(5)).with_grace(Duration::MAX);
        assert!(!d.is_never() && !d.has_passed());
        assert!(Deadline::NEVER.wake_after(Duration::MAX) > now);
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_bound_waits() {
        let d = Deadline::after(Duration::from_millis(100));
        assert_eq!(d.run(std::future::pending::<()>()).await, None);
        assert!(d.has_passed());
        assert_eq!(d.remaining(), Some(Duration::ZERO));
        assert_eq!(Deadline::NEVER.run(async { 7 }).await, Some(7));
        let wake = Deadline::after(Duration::from_secs(1)).wake_after(Duration::from_secs(60));
        assert!(wake <= from_now(Duration::from_secs(1)));
    }

    #[test]
    fn an_outage_is_warned_about_ever_more_rarely() {
        let warned: Vec<u32> = (1..=200).filter(|n| worth_a_warning(*n)).collect();
        assert_eq!(warned, [5, 10, 20, 40, 80, 160]);
        assert!(worth_a_warning(10 * 1024));
        assert!(!worth_a_warning(u32::MAX));
    }
}

/// A pause between retries that doubles after each one, from `first` up to `max`: the one
/// backoff every backend uses for reconnects, polls and retried calls.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::backend::Backoff;
///
/// let mut b = Backoff::new(Duration::from_millis(20), Duration::from_millis(50));
/// assert_eq!(b.next_pause(), Duration::from_millis(20));
/// assert_eq!(b.next_pause(), Duration::from_millis(40));
/// assert_eq!(b.next_pause(), Duration::from_millis(50));
/// b.reset();
/// assert_eq!(b.next_pause(), Duration::from_millis(20));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Starts at `first` and doubles up to `max` (`first` if `max` is smaller).
    pub const fn new(first: Duration, max: Duration) -> Self {
        let max = if max.as_nanos() < first.as_nanos() {
            first
        } else {
            max
        };
        Self {
            first,
            next: first,
            max,
        }
    }

    /// The pause before the next try; the one after it is twice as long (at most `max`).
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        pause
    }

    /// Starts over at the first pause (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// Sleeps the next pause.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_pause()).await;
    }
}

/// A pause drawn between half of `pause` and `pause`, anew at each call: waiters that began
/// together (woken by one release, say) then poll apart instead of all at once. Not for
/// anything that needs unpredictable numbers: the draw is a hash of the moment, keyed per
/// call by the standard library's per-process random keys.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::backend::jitter;
///
/// let pause = Duration::from_millis(200);
/// for _ in 0..100 {
///     let j = jitter(pause);
///     assert!(j >= pause / 2 && j <= pause);
/// }
/// assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
/// ```
pub fn jitter(pause: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let half = pause / 2;
    let span = u64::try_from(pause.saturating_sub(half).as_nanos()).unwrap_or(u64::MAX);
    let draw = RandomState::new().hash_one(Instant::now());
    half.saturating_add(Duration::from_nanos(draw % span.saturating_add(1).max(1)))
}

/// The state of one retry loop: the pause before its next try (a [`Backoff`]) and its
/// failures in a row, of which only some are worth a warning, ever fewer as an outage goes
/// on (see [`worth_a_warning`]). A loop that retries for as long as it takes (an acquire
/// without a deadline) thus says so now and then without flooding the log.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::backend::Retries;
///
/// let mut r = Retries::new(Duration::from_millis(20), Duration::from_millis(50));
/// let warned: Vec<bool> = (0..5).map(|_| r.failed()).collect();
/// assert_eq!(warned, [false, false, false, false, true]);
/// assert_eq!(r.failures(), 5);
/// assert_eq!(r.next_pause(), Duration::from_millis(20));
/// r.answered();
/// assert_eq!(r.failures(), 0);
/// assert_eq!(r.next_pause(), Duration::from_millis(40));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retries {
    pause: Backoff,
    failures: u32,
}

impl Retries {
    /// No failure yet; pauses from `first`, doubling up to `max` (as [`Backoff::new`]).
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self {
            pause: Backoff::new(first, max),
            failures: 0,
        }
    }

    /// Counts a failure; whether it is worth a warning rather than a debug line.
    pub fn failed(&mut self) -> bool {
        self.failures = self.failures.saturating_add(1);
        worth_a_warning(self.failures)
    }

    /// The failures in a row so far.
    pub const fn failures(&self) -> u32 {
        self.failures
    }

    /// The store answered (even "held"): the next failure is the first of a new row. The
    /// pauses go on growing.
    pub fn answered(&mut self) {
        self.failures = 0;
    }

    /// The pause before the next try (see [`Backoff::next_pause`]).
    pub fn next_pause(&mut self) -> Duration {
        self.pause.next_pause()
    }
}

/// Whether the `failures`-th failure in a row of one retry loop is worth a warning: the 5th,
/// then the 10th, 20th, 40th … (fewer as an outage goes on); the others are worth a debug
/// line.
///
pub const fn worth_a_warning(failures: u32) -> bool {
    failures == 5
        || (failures >= 10 && failures.is_multiple_of(10) && (failures / 10).is_power_of_two())
}
