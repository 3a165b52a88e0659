//! The provider's live holds, and the watcher that checks them after every disconnection: a
//! restart without persistence, a flush or a failover may have taken holds away, and the
//! holders learn it when the server answers again rather than at their next renewal or, for
//! fixed leases, at their lease end.

use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Backoff, HoldSet, from_now};
use dlock_core::{LockName, LossReason, Result, async_trait};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::acquire::OUTAGE_PAUSE_MAX;
use crate::provider::Inner;

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

/// How often the watcher wakes without being told of a disconnection: to notice a dropped
/// provider, and to ping the subscription connection while holds are live.
const PING_EVERY: Duration = Duration::from_secs(10);

/// Checks the provider's holds after every disconnection, until the provider is dropped.
/// While holds are live, the subscription connection is also pinged every [`PING_EVERY`]: a
/// connection that broke with nothing to send would otherwise stay broken (the manager
/// reconnects only when used) and report no further disconnection.
pub(crate) async fn watch_disconnects(inner: Weak<Inner>, disconnects: Arc<Notify>) {
    loop {
        let told = tokio::time::timeout(PING_EVERY, disconnects.notified()).await;
        let Some(inner) = inner.upgrade() else { return };
        if told.is_ok() || (!inner.holds.is_empty() && inner.subs.ping().await.is_err()) {
            check_holds(&inner.holds).await;
        }
    }
}

/// Once the server answers again, asks it about every live hold, one round trip each, and
/// marks the missing ones lost at once. Tries again with a pause while the server is away,
/// for at most [`CHECK_WINDOW`].
async fn check_holds(holds: &Holds) {
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
