//! What every workload measures with: latency histograms, the row's rates, the process's CPU
//! time and memory, the time limit, and a fresh namespace of lock names.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::Row;

/// Latencies from 1 µs to 10 min with 3 significant digits.
pub(super) fn histogram() -> dlock::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000, 3)
        .map_err(|e| dlock::Error::config(format!("latency histogram: {e}")))
}

/// A latency as the histograms record it: whole microseconds, at least 1.
pub(super) fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Whether `samples` say something of the `q` quantile: at least ten of them lie beyond it.
/// Fewer do not (of 2,000 samples, the 99.9th percentile is the second-worst one), and the
/// percentile is then not given.
pub(super) fn tail_known(samples: u64, q: f64) -> bool {
    samples as f64 * (1.0 - q) >= 10.0
}

/// The `q` quantile of `h`, if [`tail_known`].
fn quantile(h: &Histogram<u64>, q: f64) -> Option<u64> {
    tail_known(h.len(), q).then(|| h.value_at_quantile(q))
}

/// The acquire percentiles of `h` into the row, each only from enough samples (nothing if it
/// recorded nothing).
pub(super) fn fill_latency(row: &mut Row, h: &Histogram<u64>) {
    if h.is_empty() {
        return;
    }
    row.acquire_p50_us = h.value_at_quantile(0.5);
    row.acquire_p99_us = quantile(h, 0.99);
    row.acquire_p999_us = quantile(h, 0.999);
}

/// W3: the handoff percentiles of `h` into the row, each only from enough samples (nothing if
/// it recorded nothing).
pub(super) fn fill_handoff(row: &mut Row, h: &Histogram<u64>) {
    if h.is_empty() {
        return;
    }
    row.handoff_p50_us = Some(h.value_at_quantile(0.5));
    row.handoff_p99_us = quantile(h, 0.99);
}

/// The row's cycles, wall time and cycles per second.
pub(super) fn finish(row: &mut Row, cycles: u64, elapsed: Duration) {
    row.cycles = cycles;
    row.seconds = elapsed.as_secs_f64();
    row.cycles_per_sec = if row.seconds > 0.0 {
        cycles as f64 / row.seconds
    } else {
        0.0
    };
}

/// Whether a workload begun at `started` has used up its `--duration`.
pub(super) fn out_of_time(started: Instant, limit: Option<Duration>) -> bool {
    limit.is_some_and(|l| started.elapsed() >= l)
}

/// The process's CPU time so far (user + system), where `getrusage` answers.
pub(super) fn cpu_time() -> Option<Duration> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).ok()?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).ok()?)
            .checked_add(Duration::from_micros(u64::try_from(t.tv_usec()).ok()?))
    };
    tv(usage.user_time())?.checked_add(tv(usage.system_time())?)
}

/// CPU microseconds per cycle since `before` (from [`cpu_time`]).
pub(super) fn cpu_per_cycle(before: Option<Duration>, cycles: u64) -> Option<f64> {
    let spent = cpu_time()?.checked_sub(before?)?;
    (cycles > 0).then(|| spent.as_secs_f64() * 1e6 / cycles as f64)
}

/// Resident memory of this process, KiB (Linux).
pub(super) fn rss_kib() -> Option<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4)
}

/// A name unlikely to repeat: the clock's nanoseconds, in hex.
pub(super) fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}")
}

/// A fresh prefix of lock names for one workload, so no run meets another's locks.
pub(super) fn namespace() -> String {
    format!("dlock-bench/{}/{}", std::process::id(), uuid_like())
}
