//! The plan of an attack, drawn from its seed: which fault hits which worker slot when, and
//! for how long. The workers draw their choices from the same kind of seeded numbers.

use std::time::Duration;

use super::TortureOpts;
use super::history::FaultKind;

/// Tiny, stable pseudo-random numbers (SplitMix64): a seed replays the same run on any
/// version of anything.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 for `n` = 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = u64::try_from(high.saturating_sub(low).as_millis()).unwrap_or(0);
        low.saturating_add(Duration::from_millis(self.below(span + 1)))
    }
}

/// One planned fault.
#[derive(Debug, Clone, Copy)]
pub(super) struct Planned {
    /// When, from the start of the attack.
    pub(super) at: Duration,
    pub(super) kind: FaultKind,
    pub(super) slot: usize,
    /// How long it lasts (zero for a reset or a kill).
    pub(super) lasts: Duration,
    /// The added latency, for `Latency`.
    pub(super) latency: Duration,
    /// Which way, for `OneWay` and a one-way `Silent`.
    pub(super) upstream: bool,
    /// Whether a `Silent` network is silent both ways (one way, `upstream`'s, otherwise).
    pub(super) both_ways: bool,
}

/// The schedule of a run: one fault at a time, every one healed before the next, drawn from
/// the seed, each scaled to `lease`: the store's span (the watchdog lease, or the session of
/// a session store).
pub(super) fn schedule(
    seed: u64,
    opts: &TortureOpts,
    lease: Duration,
    kinds: &[FaultKind],
    slots: usize,
) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let mut plan = Vec::new();
    if kinds.is_empty() {
        return plan;
    }
    let mut at = lease;
    let stop = opts.duration.saturating_sub(lease * 2);
    while at < stop {
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let slot = rng.below(slots as u64) as usize;
        let lasts = match kind {
            FaultKind::Pause
            | FaultKind::Partition
            | FaultKind::OneWay
            | FaultKind::Delay
            | FaultKind::Silent => rng.between(lease * 3 / 2, lease * 3),
            FaultKind::Latency => rng.between(lease / 2, lease * 2),
            // At most half a lease: a store keeps a stalled hold for at least two thirds of
            // one, less the checker's margins for a late renewal (`vouched_after_fault`), so
            // a blip heals with time to spare for the renewal it held up. Of the shorter of
            // the span and the watchdog lease: a client whose lease is shorter than its
            // session gives its hold up at the lease's end.
            FaultKind::BlipPause | FaultKind::BlipPartition => {
                let short = lease.min(opts.lease);
                rng.between(short / 5, short / 2)
            }
            FaultKind::Reset | FaultKind::Kill | FaultKind::Restart => Duration::ZERO,
        };
        let latency = Duration::from_millis(50 + rng.below(251));
        let upstream = rng.below(2) == 0;
        // Drawn only for a silent network, so that the schedules of the other kinds stay
        // those their seeds drew before it existed.
        let both_ways = kind == FaultKind::Silent && rng.below(2) == 0;
        plan.push(Planned {
            at,
            kind,
            slot,
            lasts,
            latency,
            upstream,
            both_ways,
        });
        at = at
            .saturating_add(lasts)
            .saturating_add(rng.between(lease / 2, lease * 2));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torture::Primitive;

    /// A run of 4 workers with a 2 s lease, `duration` long, with `faults`.
    fn opts(duration: Duration, faults: &[FaultKind]) -> TortureOpts {
        TortureOpts {
            urls: vec![],
            processes: 4,
            duration,
            faults: faults.to_vec(),
            restart_cmd: None,
            seed: Some(7),
            primitives: vec![Primitive::Mutex],
            names: 3,
            lease: Duration::from_secs(2),
            hold: Duration::from_millis(60),
            json: None,
            history: None,
            sabotage: None,
            defaults: false,
            clock_rate: None,
        }
    }

    #[test]
    fn a_seed_replays_the_same_schedule() {
        let opts = opts(Duration::from_secs(60), &FaultKind::ALL);
        let a = schedule(7, &opts, opts.lease, &FaultKind::ALL, 4);
        let b = schedule(7, &opts, opts.lease, &FaultKind::ALL, 4);
        assert!(!a.is_empty());
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let c = schedule(8, &opts, opts.lease, &FaultKind::ALL, 4);
        assert_ne!(format!("{a:?}"), format!("{c:?}"));
        assert!(a.iter().all(|p| p.at + p.lasts <= opts.duration));
    }

    /// Blips last 0.2-0.5 of a lease, a silent network 1.5-3 leases, and silent networks
    /// are drawn both ways and one way.
    #[test]
    fn blips_are_short_and_silent_networks_long() {
        let kinds = [
            FaultKind::BlipPause,
            FaultKind::BlipPartition,
            FaultKind::Silent,
        ];
        let opts = opts(Duration::from_secs(600), &kinds);
        let plan = schedule(7, &opts, opts.lease, &kinds, 4);
        for kind in kinds {
            assert!(plan.iter().any(|p| p.kind == kind), "{kind} never drawn");
        }
        for p in &plan {
            let (low, high) = if p.kind == FaultKind::Silent {
                (opts.lease * 3 / 2, opts.lease * 3)
            } else {
                (opts.lease / 5, opts.lease / 2)
            };
            assert!(p.lasts >= low && p.lasts <= high, "{p:?}");
            assert!(!p.both_ways || p.kind == FaultKind::Silent, "{p:?}");
        }
        let silent = plan.iter().filter(|p| p.kind == FaultKind::Silent);
        assert!(silent.clone().any(|p| p.both_ways));
        assert!(silent.clone().any(|p| !p.both_ways && p.upstream));
        assert!(silent.clone().any(|p| !p.both_ways && !p.upstream));
    }
}
