//! The lease keeper: the one background task per hold that renews a watchdog lease, or ends a
//! fixed lease, and marks the hold lost at the end this client can vouch for (the lease end
//! or the session's horizon, less the drift allowance). It never stops silently: it ends when
//! the guard releases (which disarms it first), after it has marked the hold lost, or, if its
//! runtime shuts down or a backend call panics, by marking the hold lost from its drop guard.
//! Its task is started a sixth of the lease after the grant by its runtime's starter
//! ([`crate::starter`]), so a hold released sooner costs none.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::task::AbortOnDropHandle;

use crate::error::Error;
use crate::gather::renewal_window;
use crate::loss::LossReason;
use crate::metrics;
use crate::options::Lease;
use crate::shared::Shared;
use crate::starter::{self, Key, Startable, Task};
use crate::time::{Backoff, beat_at_or_before, earlier, from_now, jitter, later};
use crate::trace::{self, in_span};

/// The first pause between two failed renewal attempts, before its jitter (which takes up to
/// half of it off).
const RETRY_MIN: Duration = Duration::from_millis(50);
/// The longest pause between two failed renewal attempts.
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
fn keep(shared: Arc<Shared>) -> impl Future<Output = ()> + Send + 'static {
    let armed = Armed(shared);
    async move {
        keep_until_lost(&armed.0).await;
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
    let reason = tokio::select! {
        // Someone else (the backend, a store hook, the guard's own check at the end) marked
        // the hold lost: nothing left to keep.
        () = lost => None,
        reason = work => Some(reason),
    };
    after_loss(shared, reason).await;
}

/// What the keeper does once its hold is lost: reports `reason` (`None`: someone else
/// reported the loss), then cleans up what may be left on the store, unless the release or
/// the drop of the last guard claimed that first.
pub(crate) async fn after_loss(shared: &Shared, reason: Option<LossReason>) {
    if let Some(reason) = reason {
        shared.signal.mark_lost(reason);
    }
    if shared.claim_cleanup() {
        shared.clean_up_after_loss().await;
    }
}

/// Ends when the hold is past its end; `extend` moves the end and wakes us.
async fn fixed(shared: &Shared) -> LossReason {
    loop {
        let (end, reason) = shared.end();
        if Instant::now() >= end {
            return reason;
        }
        tokio::select! {
            () = sleep_until(end) => {}
            () = shared.extended.notified() => {}
        }
    }
}

/// Renews at most `ttl / 3` after the grant or the last renewal. A hold that renews in
/// batches ([`Hold::renews_in_batches`](crate::backend::Hold)) renews on the process's beats
/// ([`beat_at_or_before`]): the first time on the last beat by then of a `ttl / 6` clock (its
/// keeper has started by then), after that of a `ttl / 3` one, so that the holds of a
/// provider with this lease come due together and go in one batch a period, however many it
/// keeps and whenever they were taken. Ends (with the reason) once the hold cannot be vouched
/// for. Between renewals it wakes at the hold's end if that comes first (a session's horizon
/// that no answer moved), to report the loss then.
async fn watchdog(shared: &Shared, ttl: Duration) -> LossReason {
    let period = ttl / 3;
    let on_beat = shared.hold.renews_in_batches();
    let due = |since: Instant, beat: Duration| {
        let due = later(since, period);
        if on_beat {
            beat_at_or_before(due, beat)
        } else {
            due
        }
    };
    let mut next = due(shared.granted, period / 2);
    loop {
        let (end, reason) = shared.end();
        if Instant::now() >= end {
            return reason;
        }
        if end < next {
            sleep_until(end).await;
            continue;
        }
        sleep_until(next).await;
        let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
        let (mut first, mut was_batched) = (true, false);
        loop {
            let sent = Instant::now();
            let (end, reason) = shared.end();
            if sent >= end {
                return reason;
            }
            let span = trace::renew(shared.backend, shared.kind, &shared.name);
            // A try may wait for the provider's next batch of renewals until the last third of
            // the lease on the store (or the hold's end, if a session's horizon comes first):
            // the first, and a retry while the end is further than twice the longest wait for
            // a batch. When a batch fails, every hold in it tries again, and alone they would
            // make one call each, as many as the provider has holds, on a store that may be
            // failing for being busy. A batched try still unanswered at the last third is cut
            // off there, and every later try is sent alone: one close to the end is not held
            // back by a batch, and a batch that keeps failing or hanging where the hold's own
            // call would not cannot cost the hold.
            let batch_until = earlier(shared.lease_end(), period).min(end);
            let batched = batch_until > sent
                && (first
                    || end.saturating_duration_since(sent) > renewal_window(ttl).saturating_mul(2));
            if !batched && was_batched {
                // Alone from here: the pauses start short again, for the time that is left.
                retry = Backoff::new(RETRY_MIN, RETRY_MAX);
            }
            (first, was_batched) = (false, batched);
            let (renewal, until) = if batched {
                (shared.hold.renew(ttl), batch_until)
            } else {
                (shared.hold.extend(ttl), end)
            };
            match timeout_at(until, in_span(&span, renewal)).await {
                Ok(Ok(())) => {
                    metrics::renewed(shared.backend, "renewed");
                    shared.set_lease_end(later(sent, ttl));
                    shared.signal.set_renewal_failing(false);
                    next = due(sent, period);
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
                    // Jittered: the holds of a failed batch do not retry in step. A batched
                    // try's pause ends at the last third at the latest, for the tries alone.
                    sleep_until(from_now(jitter(retry.next_pause())).min(until)).await;
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
                    shared.signal.set_renewal_failing(true);
                    // The end may have moved while the call hung (a session's answers move
                    // its horizon): the loop checks it again before the next try. A batched
                    // try cut off at the last third is followed at once by one alone.
                    let pause = jitter(retry.next_pause());
                    let wake = if batched {
                        until
                    } else {
                        shared.vouched_until()
                    };
                    sleep_until(from_now(pause).min(wake)).await;
                }
            }
        }
    }
}

/// Places the keeper of a hold just granted on `runtime`: waiting in the runtime's starter
/// until a sixth of its lease has passed, or spawned at once if the runtime is shutting down
/// (which drops it, and it reports the loss). Call it under the hold's keeper lock, so the
/// starter cannot start it before it is in place.
pub(crate) fn place(runtime: &Handle, shared: &Arc<Shared>) -> Task {
    let at = later(shared.granted, shared.lease.ttl() / 6);
    let weak: std::sync::Weak<dyn Startable> = Arc::downgrade(shared) as _;
    match starter::enqueue_keeper(runtime, at, weak) {
        Some(waiting) => Task::Waiting(waiting),
        None => spawn(runtime, shared),
    }
}

/// Spawns the keeper now if it still waits for its start: an end moved before the keeper's
/// start (a shortened fixed lease) must not wait for that start.
pub(crate) fn start_now(shared: &Arc<Shared>) {
    let mut keeper = shared.keeper.lock();
    if let Some(runtime) = &shared.runtime
        && keeper.as_ref().is_some_and(Task::is_waiting)
        && shared.keeper_armed()
    {
        *keeper = Some(spawn(runtime, shared));
    }
}

impl Startable for Shared {
    fn start(self: Arc<Self>, key: Key) {
        let mut keeper = self.keeper.lock();
        if let Some(runtime) = &self.runtime
            && keeper.as_ref().is_some_and(|k| k.waits_as(key))
            && self.keeper_armed()
        {
            *keeper = Some(spawn(runtime, &self));
        }
    }

    fn never_started(&self) {
        self.keeper_stopped();
    }
}

/// The keeper of `shared`, spawned on `runtime`.
fn spawn(runtime: &Handle, shared: &Arc<Shared>) -> Task {
    Task::Running(AbortOnDropHandle::new(
        runtime.spawn(keep(Arc::clone(shared))),
    ))
}
