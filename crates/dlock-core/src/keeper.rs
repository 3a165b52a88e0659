//! The lease keeper: the one background task per hold that renews a watchdog lease or ends a
//! fixed one. It never stops silently: it ends when the guard releases (which disarms it
//! first), after it has marked the hold lost, or, if its runtime shuts down or a backend call
//! panics, by marking the hold lost from its drop guard.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::Instrument;

use crate::error::Error;
use crate::guard::Shared;
use crate::loss::LossReason;
use crate::metrics;
use crate::options::Lease;
use crate::time::{Backoff, from_now, later};

/// Shortest pause between two failed renewal attempts.
const RETRY_MIN: Duration = Duration::from_millis(50);
/// Longest pause between two failed renewal attempts.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Reports the loss if the keeper is dropped before it was disarmed (runtime shutdown, panic),
/// even if it was never polled.
struct Armed(Arc<Shared>);

impl Drop for Armed {
    fn drop(&mut self) {
        self.0.keeper_stopped();
    }
}

/// The keeper of one hold, to spawn. Its drop guard exists before the first poll.
pub(crate) fn keep(shared: Arc<Shared>) -> impl Future<Output = ()> + Send + 'static {
    let armed = Armed(shared);
    async move {
        let shared = &armed.0;
        keep_until_lost(shared).await;
    }
}

async fn keep_until_lost(shared: &Shared) {
    let lost = shared.signal.lost();
    let work = async {
        match shared.lease {
            Lease::Watchdog { ttl } => watchdog(shared, ttl).await,
            Lease::Fixed(_) => fixed(shared).await,
        }
    };
    tokio::select! {
        // Someone else (the backend, a store hook, the guard's own check at the lease end)
        // marked the hold lost: nothing left to keep.
        () = lost => {}
        reason = work => {
            shared.signal.mark_lost(reason);
        }
    }
    // Best effort, whoever saw the loss first: clean up what may be left on the server. The
    // guard's check can see a lease end before this task wakes, and a backend without a
    // server-side lease (ZooKeeper) would keep its node until the session ends. The release is
    // owner-checked, so it cannot touch a hold that someone else took over meanwhile.
    if let Err(e) = shared.hold.release().await {
        tracing::debug!(backend = shared.backend, lock = %shared.name, error = %e, "clean-up after a loss found nothing to release");
    }
}

/// Ends when the fixed lease has run out; `extend` moves the end and wakes us.
async fn fixed(shared: &Shared) -> LossReason {
    loop {
        let end = shared.lease_end();
        if Instant::now() >= end {
            return LossReason::FixedLeaseEnded;
        }
        tokio::select! {
            () = sleep_until(end) => {}
            () = shared.extended.notified() => {}
        }
    }
}

/// Renews every `ttl / 3`; ends (with the reason) once the hold cannot be vouched for.
async fn watchdog(shared: &Shared, ttl: Duration) -> LossReason {
    let period = ttl / 3;
    let mut next = later(shared.granted, period);
    loop {
        sleep_until(next).await;
        let lease_end = shared.lease_end();
        let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
        loop {
            let sent = Instant::now();
            if sent >= lease_end {
                return shared.reason_at_lease_end();
            }
            let span = tracing::debug_span!("dlock.renew", backend = shared.backend, kind = %shared.kind, lock = %shared.name);
            match timeout_at(lease_end, shared.hold.extend(ttl).instrument(span)).await {
                Ok(Ok(())) => {
                    metrics::renewed(shared.backend, "renewed");
                    shared.set_lease_end(later(sent, ttl));
                    shared.signal.set_renewal_failing(false);
                    next = later(sent, period);
                    break;
                }
                Ok(Err(Error::LockLost { .. })) => {
                    metrics::renewed(shared.backend, "gone");
                    return LossReason::Gone;
                }
                Ok(Err(e)) if e.is_retryable() => {
                    metrics::renewed(shared.backend, "failed");
                    shared.signal.set_renewal_failing(true);
                    tracing::warn!(
                        backend = shared.backend,
                        lock = %shared.name,
                        error = %e,
                        "dlock.renew failed; retrying until the lease ends"
                    );
                    sleep_until(from_now(retry.next_pause()).min(lease_end)).await;
                }
                Ok(Err(e)) => {
                    metrics::renewed(shared.backend, "failed");
                    tracing::error!(
                        backend = shared.backend,
                        lock = %shared.name,
                        error = %e,
                        "dlock.renew failed with an error that retrying cannot fix"
                    );
                    return LossReason::RenewalFailed;
                }
                Err(_elapsed) => {
                    metrics::renewed(shared.backend, "failed");
                    return LossReason::RenewalFailed;
                }
            }
        }
    }
}
