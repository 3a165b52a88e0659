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
    /// Which way, for `OneWay`.
    pub(super) upstream: bool,
}

/// The schedule of a run: one fault at a time, every one healed before the next, drawn from
/// the seed.
pub(super) fn schedule(
    seed: u64,
    opts: &TortureOpts,
    kinds: &[FaultKind],
    slots: usize,
) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let mut plan = Vec::new();
    if kinds.is_empty() {
        return plan;
    }
    let lease = opts.lease;
    let mut at = lease;
    let stop = opts.duration.saturating_sub(lease * 2);
    while at < stop {
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let slot = rng.below(slots as u64) as usize;
        let lasts = match kind {
            FaultKind::Pause | FaultKind::Partition | FaultKind::OneWay | FaultKind::Delay => {
                rng.between(lease * 3 / 2, lease * 3)
            }
            FaultKind::Latency => rng.between(lease / 2, lease * 2),
            FaultKind::Reset | FaultKind::Kill | FaultKind::Restart => Duration::ZERO,
        };
        plan.push(Planned {
            at,
            kind,
            slot,
            lasts,
            latency: Duration::from_millis(50 + rng.below(251)),
            upstream: rng.below(2) == 0,
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

    #[test]
    fn a_seed_replays_the_same_schedule() {
        let opts = TortureOpts {
            urls: vec![],
            processes: 4,
            duration: Duration::from_secs(60),
            faults: FaultKind::ALL.to_vec(),
            restart_cmd: None,
            seed: Some(7),
            primitives: vec![Primitive::Mutex],
            names: 3,
            lease: Duration::from_secs(2),
            hold: Duration::from_millis(60),
            json: None,
            history: None,
            sabotage: None,
        };
        let a = schedule(7, &opts, &FaultKind::ALL, 4);
        let b = schedule(7, &opts, &FaultKind::ALL, 4);
        assert!(!a.is_empty());
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let c = schedule(8, &opts, &FaultKind::ALL, 4);
        assert_ne!(format!("{a:?}"), format!("{c:?}"));
        assert!(a.iter().all(|p| p.at + p.lasts <= opts.duration));
    }
}
