//! How a workload set against a floor takes turns with it (W4, W7): its blocks and the
//! floor's alternate, and each of dlock's blocks' connections end on the server before the
//! floor's block opens its own.

use std::time::Duration;

use dlock::backend::Deadline;

use super::super::BenchOpts;
use super::super::floor;
use super::super::targets::Target;
use super::{Block, Cycles, FloorSum};

/// How the blocks of a workload set against a floor take turns with the floor's (W4, W7):
/// `per` cycles a worker, `workers` of them, in [`MANY_BLOCKS`] blocks, each followed by a
/// block of the floor's with as many cycles a worker as dlock's made; so a slow spell of
/// the server, or of the machine, falls on both alike.
pub(super) struct Turns<'a> {
    pub(super) target: &'a Target,
    pub(super) opts: &'a BenchOpts,
    pub(super) workers: u64,
    pub(super) per: u64,
}

impl Turns<'_> {
    /// Runs `block` (dlock's workers, given their cycles; `None` ends the workload, which
    /// the caller reports) and, with `with_floor`, `floor` (the floor's, given its cycles a
    /// worker; `None` where the store has no such floor) in turns; without a floor, one
    /// block. Before each of dlock's blocks the server's connections are counted, and the
    /// floor's block waits until the block's connections have ended. Returns dlock's
    /// blocks together and the floor's.
    pub(super) async fn take<B, F>(
        &self,
        with_floor: bool,
        mut block: impl FnMut(Cycles) -> B,
        mut floor: impl FnMut(u64) -> F,
    ) -> dlock::Result<Option<(Block, Option<FloorSum>)>>
    where
        B: Future<Output = dlock::Result<Option<Block>>>,
        F: Future<Output = dlock::Result<Option<f64>>>,
    {
        let (url, opts, per) = (&self.target.url, self.opts, self.per);
        let mut sum = with_floor.then_some(FloorSum::ZERO);
        let mut all = Block::empty()?;
        let blocks = if with_floor { MANY_BLOCKS } else { 1 };
        for i in 0..blocks {
            let share = per / blocks + u64::from(i < per % blocks);
            if share == 0 || opts.duration.is_some_and(|l| all.elapsed >= l) {
                continue;
            }
            let before = if sum.is_some() {
                floor::server_connections(url).await
            } else {
                None
            };
            let cycles = Cycles {
                per: share,
                limit: opts.duration.map(|l| l.saturating_sub(all.elapsed)),
            };
            let Some(done) = block(cycles).await? else {
                return Ok(None);
            };
            all.add(&done);
            if let Some(before) = before {
                settle_connections(url, before).await;
            }
            // As many cycles a worker as dlock's made (fewer than its share when
            // `--duration` cut the block short).
            let floor_share = done.done.div_ceil(self.workers).max(1);
            if let Some(s) = sum.as_mut() {
                match floor(floor_share).await? {
                    Some(rate) => {
                        let cycles = self.workers * floor_share;
                        s.cycles += cycles;
                        s.secs += cycles as f64 / rate;
                    }
                    None => sum = None,
                }
            }
        }
        Ok(Some((all, sum)))
    }
}

/// W4, W7: how long a block's providers may take to close, and their connections to end on
/// the server, before the floor's block.
pub(super) const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// Asks the server of `url`, every [`SETTLE_EVERY`] until [`CLOSE_WITHIN`] has passed, how
/// many connections it counts, until it counts no more than `before`: a dropped provider's
/// connections end in the background, and a floor that opened its own meanwhile could find
/// the server's connections used up. The count is the server's (other clients of it count
/// too), and a count that cannot be read (a server whose connections are used up refuses the
/// one asking) is asked again; a wait that runs out says so and lets the floor try.
async fn settle_connections(url: &str, before: i64) {
    let mut last = None;
    let mut every = tokio::time::interval(SETTLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let settled = Deadline::after(CLOSE_WITHIN)
        .run(async {
            loop {
                // The first tick is at once.
                every.tick().await;
                last = floor::server_connections(url).await;
                if last.is_some_and(|now| now <= before) {
                    return;
                }
            }
        })
        .await;
    if settled.is_none() {
        eprintln!(
            "dlock bench: {before} connection(s) before a block, {} after it and \
             {CLOSE_WITHIN:?}: the floor's block starts anyway",
            last.map_or_else(|| "an unknown count".to_owned(), |n| n.to_string())
        );
    }
}

/// How often [`settle_connections`] asks the server.
const SETTLE_EVERY: Duration = Duration::from_millis(20);

/// W4, W7: the blocks their cycles run in (as many as a worker has cycles, if fewer), taking
/// turns with as many blocks of the floor's, so that a slow spell of the server, or of the
/// machine, falls on both alike.
pub(super) const MANY_BLOCKS: u64 = 4;
