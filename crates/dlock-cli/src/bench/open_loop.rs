//! W9, the open loop: lock cycles that arrive at a fixed rate, whatever the store answers,
//! at half and four fifths of the most that one provider shared by 64 tasks does (W7's closed
//! loop, measured first in the same run). Each cycle's latency runs from the moment it was
//! due, not from when it began: a stall of the store holds up every cycle due during it, and
//! they all count it, where a closed loop would have sent fewer cycles and hidden it
//! (coordinated omission).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{DynLock, LockOptions};
use tokio::time::MissedTickBehavior;

use super::measure::{fill_latency, finish, histogram, namespace, out_of_time, us};
use super::targets::Target;
use super::workloads::shared_provider_max;
use super::{BenchOpts, Row};

/// The loads of W9: shares of the closed loop's cycles per second.
pub(super) const LOADS: [f64; 2] = [0.5, 0.8];

/// The names the arrivals spread over, one after the other: as many as a busy moment has
/// cycles in flight, so that an arrival rarely waits for another's hold.
const NAMES: usize = 256;

/// W9's rows on `target`, one per load of [`LOADS`]: each `2 × --cycles` arrivals (enough for
/// p99), at that share of the closed loop's rate.
pub(super) async fn rows(target: &Target, opts: &BenchOpts) -> dlock::Result<Vec<Row>> {
    let closed = shared_provider_max(target, opts).await?;
    if !closed.is_finite() || closed <= 0.0 {
        return Err(dlock::Error::config(format!(
            "the closed loop did {closed} cycles/s: no rate to offer"
        )));
    }
    let ns = namespace();
    let p = target.client().await?;
    let mut locks = Vec::with_capacity(NAMES);
    for i in 0..NAMES {
        locks.push(p.lock(&format!("{ns}/w9/{i}"), LockOptions::default())?);
    }
    let locks = Arc::new(locks);
    let mut rows = Vec::new();
    for load in LOADS {
        let mut row = Row::new(&target.label, format!("W9/{:.0}%", load * 100.0));
        arrivals(&mut row, &locks, closed * load, opts).await?;
        row.closed_loop_per_sec = Some(closed);
        rows.push(row);
    }
    Ok(rows)
}

/// `2 × --cycles` cycles on `locks` in turn, one due every `1 / rate` s from the start, each
/// run by a task of its own; their latencies from when they were due into `row`.
async fn arrivals(
    row: &mut Row,
    locks: &Arc<Vec<DynLock>>,
    rate: f64,
    opts: &BenchOpts,
) -> dlock::Result<()> {
    let every = Duration::try_from_secs_f64(1.0 / rate)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| dlock::Error::config(format!("no arrival period for {rate} cycles/s")))?;
    // Ticks that came late (the dispatcher was not run in time) are given at once, each with
    // the instant it was due.
    let mut due = tokio::time::interval(every);
    due.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut cycles = tokio::task::JoinSet::new();
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < opts.cycles.saturating_mul(2) && !out_of_time(started, opts.duration) {
        let at = due.tick().await;
        let locks = Arc::clone(locks);
        let i = usize::try_from(sent).unwrap_or(0) % locks.len().max(1);
        cycles.spawn(async move {
            if let Some(lock) = locks.get(i) {
                lock.acquire().await?.release().await?;
            }
            Ok::<_, dlock::Error>(at.elapsed())
        });
        sent += 1;
    }
    let mut h = histogram()?;
    while let Some(cycle) = cycles.join_next().await {
        let latency =
            cycle.map_err(|e| dlock::Error::config(format!("a cycle panicked: {e}")))??;
        let _ = h.record(us(latency));
    }
    finish(row, sent, started.elapsed());
    fill_latency(row, &h);
    row.offered_per_sec = Some(rate);
    row.max_wait_ms = Some(h.max() as f64 / 1000.0);
    Ok(())
}
