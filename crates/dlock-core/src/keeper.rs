//! The lease keeper: the one background task per hold that renews a watchdog lease or ends a
//! fixed one. It never stops silently: it ends only when the guard releases (and aborts it) or
//! after it has marked the hold lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::Instrument;

use crate::error::Error;
use crate::guard::{Shared, lock};
use crate::options::Lease;

/// Shortest pause between two failed renewal attempts.
const RETRY_MIN: Duration = Duration::from_millis(50);
/// Longest pause between two failed renewal attempts.
const RETRY_MAX: Duration = Duration::from_secs(2);

pub(crate) async fn keep(shared: Arc<Shared>) {
    let lost = shared.signal.lost();
    let work = async {
        match shared.lease {
            Lease::Watchdog { ttl } => watchdog(&shared, ttl).await,
            Lease::Fixed(_) => fixed(&shared).await,
        }
    };
    tokio::select! {
        // Someone else (the backend, a store hook) marked the hold lost: nothing left to keep.
        () = lost => {}
        reason = work => {
            shared.signal.mark_lost(&shared.name, reason);
            // Best effort: clean up what may be left on the server. The release is owner-checked,
            // so it cannot touch a hold that someone else took over meanwhile.
            let _ = shared.hold.release().await;
        }
    }
}

/// Ends when the fixed lease has run out; `extend` moves the end and wakes us.
async fn fixed(shared: &Shared) -> &'static str {
    loop {
        let end = *lock(&shared.lease_end);
        if Instant::now() >= end {
            return "the fixed lease ended";
        }
        tokio::select! {
            () = sleep_until(end) => {}
            () = shared.extended.notified() => {}
        }
    }
}

/// Renews every `ttl / 3`; ends (with the reason) once the hold cannot be vouched for.
async fn watchdog(shared: &Shared, ttl: Duration) -> &'static str {
    let period = ttl / 3;
    let mut next = *lock(&shared.lease_end) - ttl + period;
    loop {
        sleep_until(next).await;
        let lease_end = *lock(&shared.lease_end);
        let mut retry = RETRY_MIN;
        loop {
            let started = Instant::now();
            if started >= lease_end {
                return "renewal did not succeed before the lease ended";
            }
            let span =
                tracing::debug_span!("dlock.renew", backend = shared.backend, lock = %shared.name);
            match timeout_at(lease_end, shared.hold.extend(ttl).instrument(span)).await {
                Ok(Ok(())) => {
                    *lock(&shared.lease_end) = started + ttl;
                    next = started + period;
                    break;
                }
                Ok(Err(Error::LockLost { .. })) => return "renewal found the hold gone",
                Ok(Err(e)) if e.is_retryable() => {
                    tracing::warn!(
                        backend = shared.backend,
                        lock = %shared.name,
                        error = %e,
                        "dlock.renew failed; retrying until the lease ends"
                    );
                    let pause = retry.min(lease_end.saturating_duration_since(Instant::now()));
                    sleep_until(Instant::now() + pause).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
                Ok(Err(e)) => {
                    tracing::error!(
                        backend = shared.backend,
                        lock = %shared.name,
                        error = %e,
                        "dlock.renew failed with an error that retrying cannot fix"
                    );
                    return "renewal failed for good";
                }
                Err(_elapsed) => return "renewal did not answer before the lease ended",
            }
        }
    }
}
