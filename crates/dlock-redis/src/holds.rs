//! The provider's live holds, and their checks: a restart without persistence, a flush, an
//! eviction or a failover may take holds away, with or without a disconnection. The
//! provider's watcher checks every hold after each disconnection (the holders learn it when
//! the server answers again rather than at their next renewal or, for fixed leases, at their
//! lease end), and every [`CHECK_EVERY`] the holds no renewal asks about that often (fixed
//! leases, long watchdog leases).

use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Backoff, HoldSet, HoldSignal, from_now};
use dlock_core::{Error, LockName, LossReason, Result};
use tokio::time::Instant;

use crate::call::{Call, read_held};
use crate::conn::Conn;
use crate::consts::OUTAGE_PAUSE_MAX;
use crate::error::from_redis_on;

/// The live holds of one provider.
pub(crate) type Holds = HoldSet<Weak<dyn Checked>>;

/// A live hold, as the checks ask about it.
pub(crate) trait Checked: Send + Sync {
    /// The lock's name, for logs.
    fn name(&self) -> &LockName;

    /// The call that asks whether the store still has the hold (it changes nothing).
    fn held_call(&self) -> Call<'static>;

    /// Whether the watchdog's renewals ask about the hold at least every [`CHECK_EVERY`].
    fn renewed_often(&self) -> bool;

    /// Whether a release of the hold has begun (its "not held" is then no loss).
    fn releasing(&self) -> bool;
}

/// How often the holds no renewal asks about are checked: a loss without a disconnection
/// is noticed within this long (and a round trip), as a default watchdog lease's renewal
/// (every 10 s) notices it.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(10);

/// The most holds one pipeline asks about.
const CHECK_AT_ONCE: usize = 5_000;

/// How long after a disconnection the holds are checked for, while the server is away.
const CHECK_WINDOW: Duration = Duration::from_secs(120);

/// Which holds a check asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    /// Every hold, tried again while the server is away (after a disconnection).
    All,
    /// The holds no renewal asks about often enough, once (the periodic check).
    NotRenewedOften,
}

/// Asks the server about the live holds `which` names, in pipelines (one round trip per
/// [`CHECK_AT_ONCE`] holds; hold by hold on a cluster, whose keys lie in many slots), and
/// marks the missing ones lost at once. After a disconnection, tries again with a pause
/// while the server is away, for at most [`CHECK_WINDOW`].
pub(crate) async fn check_holds(conn: &Conn, holds: &Holds, which: Which) {
    let mut pause = Backoff::new(Duration::from_millis(50), OUTAGE_PAUSE_MAX);
    let give_up = from_now(CHECK_WINDOW);
    loop {
        let live: Vec<(HoldSignal, Arc<dyn Checked>)> = holds
            .snapshot()
            .into_iter()
            .filter_map(|(signal, hold)| Some((signal, hold.upgrade()?)))
            .filter(|(_, hold)| which == Which::All || !hold.renewed_often())
            .collect();
        let mut unreachable = false;
        for chunk in live.chunks(CHECK_AT_ONCE) {
            if let Err(e) = check_chunk(conn, chunk).await {
                tracing::debug!(error = %e, "could not check the live holds");
                unreachable = true;
                break;
            }
        }
        if !unreachable || which != Which::All || Instant::now() >= give_up {
            return;
        }
        pause.wait().await;
    }
}

/// Asks about one chunk of holds; a retryable error (the server is away) stops the check.
async fn check_chunk(conn: &Conn, chunk: &[(HoldSignal, Arc<dyn Checked>)]) -> Result<()> {
    let calls: Vec<Call<'static>> = chunk.iter().map(|(_, hold)| hold.held_call()).collect();
    let answers: Vec<Result<bool>> = if conn.is_cluster() {
        let mut answers = Vec::with_capacity(calls.len());
        for call in &calls {
            let answer = conn.script(call).await;
            answers.push(answer.and_then(|reply| read_held(call.what, reply)));
        }
        answers
    } else {
        let reach = conn.reach();
        conn.pipeline("check hold", &calls)
            .await?
            .into_iter()
            .map(|reply| {
                reply
                    .map_err(|e| from_redis_on(reach, "check hold", e))
                    .and_then(|reply| read_held("check hold", reply))
            })
            .collect()
    };
    for ((signal, hold), held) in chunk.iter().zip(answers) {
        match held {
            Ok(true) => {}
            // Released meanwhile: not a loss.
            Ok(false) if hold.releasing() => {}
            Ok(false) => {
                if signal.mark_lost(LossReason::Gone) {
                    tracing::warn!(lock = %hold.name(), "redis hold gone from the server");
                }
            }
            Err(e) if e.is_retryable() => return Err(e),
            Err(e) => tracing::debug!(lock = %hold.name(), error = %e, "could not check a hold"),
        }
    }
    Ok::<(), Error>(())
}
