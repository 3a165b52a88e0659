//! The provider's live holds, and their check after a disconnection: a restart without
//! persistence, a flush or a failover may have taken holds away, and the holders learn it when
//! the server answers again rather than at their next renewal or, for fixed leases, at their
//! lease end. The provider's watcher runs the check after every disconnection.

use std::sync::Weak;
use std::time::Duration;

use dlock_core::backend::{Backoff, HoldSet, from_now};
use dlock_core::{LockName, LossReason, Result, async_trait};
use tokio::time::Instant;

use crate::consts::OUTAGE_PAUSE_MAX;

/// The live holds of one provider.
pub(crate) type Holds = HoldSet<Weak<dyn Checked>>;

/// A live hold, as the check after a disconnection asks about it.
#[async_trait]
pub(crate) trait Checked: Send + Sync {
    /// The lock's name, for logs.
    fn name(&self) -> &LockName;

    /// Whether the store still has the hold (one round trip; changes nothing).
    async fn still_held(&self) -> Result<bool>;

    /// Whether a release of the hold has begun (its "not held" is then no loss).
    fn releasing(&self) -> bool;
}

/// How long after a disconnection the holds are checked for, while the server is away.
const CHECK_WINDOW: Duration = Duration::from_secs(120);

/// Once the server answers again, asks it about every live hold, one round trip each, and
/// marks the missing ones lost at once. Tries again with a pause while the server is away,
/// for at most [`CHECK_WINDOW`].
pub(crate) async fn check_holds(holds: &Holds) {
    let mut pause = Backoff::new(Duration::from_millis(50), OUTAGE_PAUSE_MAX);
    let give_up = from_now(CHECK_WINDOW);
    loop {
        let mut unreachable = false;
        for (signal, hold) in holds.snapshot() {
            let Some(hold) = hold.upgrade() else { continue };
            match hold.still_held().await {
                Ok(true) => {}
                // Released meanwhile: not a loss.
                Ok(false) if hold.releasing() => {}
                Ok(false) => {
                    if signal.mark_lost(LossReason::Gone) {
                        tracing::warn!(lock = %hold.name(), "redis hold gone after a disconnection");
                    }
                }
                Err(e) if e.is_retryable() => {
                    unreachable = true;
                    break;
                }
                Err(e) => {
                    tracing::debug!(lock = %hold.name(), error = %e, "could not check a hold");
                }
            }
        }
        if !unreachable || Instant::now() >= give_up {
            return;
        }
        pause.wait().await;
    }
}
