//! The wait loop of one acquisition, the same for every primitive: try, listen on the
//! primitive's channel, try again when woken or when the holder's lease may have ended, until
//! granted or the deadline; and what a cancelled or given-up acquisition leaves, undone.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Backoff, Deadline, UndoOnDrop};
use dlock_core::{Error, LockGuard, LockKind, LockName, Result};
use tokio::time::Instant;

use crate::call::{Attempt, is_grant, read_attempt, read_other_kind};
use crate::consts::{BACKEND, OUTAGE_PAUSE_MAX};
use crate::hold::RedisHold;
use crate::primitive::{Acquisition, Primitive};
use crate::pubsub::Subscribed;
use crate::replicas::Ack;

/// What an acquisition may have left on the store until it becomes a guard: itself (a queue
/// entry, or a hold granted by a call whose answer was lost), undone in the background if
/// dropped while armed.
type Undo<P> = UndoOnDrop<Arc<Acquisition<P>>, fn(Arc<Acquisition<P>>) -> BoxedUndo>;

type BoxedUndo = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How many times a call is retried after a connection error.
const RETRIES: usize = 2;

/// Longest sleep without a message: when the holder's key has no expiry, and the cap on every
/// other wait (so a lost wake-up message costs at most this long).
pub(crate) const NO_TTL_RECHECK: Duration = Duration::from_secs(5);

impl<P: Primitive> Acquisition<P> {
    /// Acquires, waiting until `deadline`.
    ///
    /// Cancel safe: while a call that may grant the lock is in flight, and while a fair waiter
    /// is queued, an undo is armed that runs in the background if this future is dropped.
    pub(crate) async fn acquire_until(
        self: Arc<Self>,
        deadline: Deadline,
    ) -> Result<Option<LockGuard>> {
        let queue = !deadline.has_passed();
        let mut undo: Undo<P> = UndoOnDrop::new(undo_in_background::<P>);
        undo.arm(Arc::clone(&self));
        // The error of the last attempt, while the store has not answered since: its script
        // may have run with the answer lost (the undo then gives back what it may have
        // taken), and at the deadline it is the answer, never "held by someone", which only
        // a store that answered can say.
        let mut unanswered: Option<Error> = None;
        let mut outage_log = OutageLog::default();
        match self.attempt_retrying(queue).await {
            Ok((Attempt::Granted { token, ack }, sent)) => {
                match self.confirm(&mut undo, token, ack, sent).await {
                    Ok(guard) => return Ok(Some(guard)),
                    // Given back unreplicated: a waiter with time left tries again.
                    Err(e) if e.is_retryable() && !deadline.has_passed() => {
                        self.rearm(&mut undo, &e);
                        unanswered = Some(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(_) => {}
            // The server is away or slow on the first try too: a waiter with time left keeps
            // waiting, as it does when that happens later.
            Err(e) if e.is_retryable() && !deadline.has_passed() => {
                outage_log.failed(&self.name, &e);
                unanswered = Some(e);
            }
            // The undo is still armed: dropped, it gives back what the attempt may have taken.
            Err(e) => return Err(e),
        }
        if deadline.has_passed() {
            self.give_up(undo, queue, unanswered.is_some()).await;
            return unanswered.map_or(Ok(None), Err);
        }
        // Boxed: only a waiter gets here, and the wait's state (its listener and the attempts
        // it makes through it) is most of an acquisition's, which an acquisition granted at
        // once would otherwise carry, and move, for nothing.
        Box::pin(self.wait_turn(deadline, undo, unanswered, outage_log)).await
    }

    /// The wait of an acquisition the first try did not grant: listens on the primitive's
    /// channel and tries again when woken, or when the holder's lease may have ended, until
    /// granted or `deadline`. `undo`, `unanswered` and `outage_log` carry on from the first
    /// try (see [`acquire_until`](Self::acquire_until)), which had time left, so it asked
    /// with a place in the queue.
    async fn wait_turn(
        self: Arc<Self>,
        deadline: Deadline,
        mut undo: Undo<P>,
        mut unanswered: Option<Error>,
        mut outage_log: OutageLog,
    ) -> Result<Option<LockGuard>> {
        let (channel, kind) = self.primitive.channel(&self.holder);
        // Under the deadline: the channel's SUBSCRIBE may wait behind its UNSUBSCRIBE (its
        // last waiter just left), which only the response timeout bounds.
        let Some(listener) = deadline.run(self.inner.subs.listen(&channel, kind)).await else {
            self.give_up(undo, true, unanswered.is_some()).await;
            return unanswered.map_or(Ok(None), Err);
        };
        let listener = listener?;
        let mut outage = Backoff::new(Duration::from_millis(50), OUTAGE_PAUSE_MAX);
        // Pauses while no subscription can wake this waiter (at most 4 tries a second).
        let mut unheard = Backoff::new(Duration::from_millis(50), OUTAGE_PAUSE_MAX);
        loop {
            // Tried, subscribed, try again: a release between the two is not missed. The
            // listener uses up the wake-up that led here before the attempt, not after it: a
            // release announced while the attempt is in flight (which may have seen the lock
            // still held) wakes this waiter again instead of being erased with the old one.
            let attempt = listener.attempt(self.attempt_retrying(true)).await;
            let wait = match attempt {
                Ok((Attempt::Granted { token, ack }, sent)) => {
                    match self.confirm(&mut undo, token, ack, sent).await {
                        Ok(guard) => return Ok(Some(guard)),
                        // Given back unreplicated (the replicas are slow or away): tried
                        // again with a growing pause, as through an outage.
                        Err(e) if e.is_retryable() => {
                            self.rearm(&mut undo, &e);
                            unanswered = Some(e);
                            Some(outage.next_pause())
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok((Attempt::Busy(wait), _)) => {
                    outage.reset();
                    outage_log.answered(&self.name);
                    unanswered = None;
                    wait
                }
                // attempt_retrying never returns it; try again at once if it did.
                Ok((Attempt::Repeated, _)) => Some(Duration::ZERO),
                // The server is away (a restart, a failover): a waiter keeps waiting until its
                // deadline, trying again with a growing pause. Whatever a lost reply granted
                // is found by the next attempt (the scripts are idempotent) and given back.
                Err(e) if e.is_retryable() => {
                    outage_log.failed(&self.name, &e);
                    unanswered = Some(e);
                    Some(outage.next_pause())
                }
                Err(e) => return Err(e),
            };
            if deadline.has_passed() {
                self.give_up(undo, true, unanswered.is_some()).await;
                return unanswered.map_or(Ok(None), Err);
            }
            // Bounded even when a wake-up message is due: one lost message (a pub/sub
            // connection that died with a restart) costs at most NO_TTL_RECHECK.
            let cap = self.primitive.recheck_within();
            let wait = wait.unwrap_or(cap).min(cap);
            match deadline.run(listener.resubscribe()).await {
                Some(Subscribed::Already) => {
                    unheard.reset();
                    listener.wait(Some(deadline.wake_after(wait))).await;
                }
                // Subscribed again just now (after a disconnection): a release published
                // since the attempt was not heard, so try again before waiting.
                Some(Subscribed::Now) => unheard.reset(),
                // No subscription: no message can wake this waiter, so it looks again soon.
                Some(Subscribed::Failed) => {
                    let short = wait.min(unheard.next_pause());
                    listener.wait(Some(deadline.wake_after(short))).await;
                }
                None => {}
            }
        }
    }

    /// One try; `queue` lets a fair waiter take its place in the queue.
    async fn attempt(&self, queue: bool) -> Result<Attempt> {
        let call = self.primitive.acquire_call(&self.holder, queue);
        let (reply, ack) = self
            .inner
            .call_replicated_to_its_end(call, is_grant, &self.in_flight)
            .await?;
        let lock = P::KIND != LockKind::Permit;
        if let Some(e) = read_other_kind(&reply, self.name.as_str(), lock) {
            return Err(e);
        }
        read_attempt(reply, ack)
    }

    /// [`attempt`](Self::attempt), retried after a connection error a reconnect may cure (a
    /// killed connection fails the first call on it). A retry can never hold twice: the
    /// scripts are idempotent, and a grant found again is given back and tried anew. Also
    /// returns when the answered call was sent: a granted lease runs from there.
    async fn attempt_retrying(&self, queue: bool) -> Result<(Attempt, Instant)> {
        let mut pause = Backoff::new(Duration::from_millis(20), Duration::from_millis(320));
        for _ in 0..RETRIES {
            let sent = Instant::now();
            match self.attempt(queue).await {
                Ok(Attempt::Repeated) => {
                    tracing::debug!(lock = %self.name, "acquire script ran twice; giving the hold back");
                    self.undo().await?;
                }
                // Nothing is undone before the retry: the scripts are idempotent, so a retry
                // finds what the failed call did (a grant is answered `Repeated` and given
                // back above), and a fair waiter keeps its place in the queue. What a call may
                // have taken when the retries run out stays with the acquisition's armed
                // undo.
                Err(e) if e.is_retryable() => {
                    tracing::debug!(lock = %self.name, error = %e, "acquire attempt failed; retrying");
                    pause.wait().await;
                }
                other => return other.map(|a| (a, sent)),
            }
        }
        let sent = Instant::now();
        match self.attempt(queue).await? {
            Attempt::Repeated => {
                self.undo().await?;
                Err(Error::backend_failed(
                    BACKEND,
                    format!(
                        "acquire of {:?}: the script kept running twice (a client retry); \
                         gave the hold back",
                        self.name
                    ),
                    true,
                ))
            }
            a => Ok((a, sent)),
        }
    }

    /// Turns a grant into a guard once it is safe from a failover: once the replicas the
    /// provider waits for acknowledged it (`?wait_replicas=`, the `WAIT` sent after the
    /// granting script on the same connection). If fewer did in time, the grant is given back
    /// (the undo stays armed until then) and a retryable error returned, so no guard carries
    /// a grant that a failover could hand to someone else with the same token.
    async fn confirm(
        self: &Arc<Self>,
        undo: &mut Undo<P>,
        token: u64,
        ack: Ack,
        sent: Instant,
    ) -> Result<LockGuard> {
        let Some(e) = ack.error(format_args!("the grant of {:?}", self.name)) else {
            // Disarmed and turned into a guard with no await in between.
            undo.disarm();
            return Ok(RedisHold::guard(Arc::clone(self), token, sent));
        };
        self.undo_now(undo, "give back an unreplicated grant").await;
        Err(e)
    }

    /// Before trying again after a grant the replicas did not acknowledge (given back by
    /// [`confirm`](Self::confirm)): the undo is armed again for the attempts to come.
    fn rearm(self: &Arc<Self>, undo: &mut Undo<P>, e: &Error) {
        tracing::debug!(lock = %self.name, error = %e, "redis: a grant the replicas did not acknowledge was given back; trying again");
        if !undo.is_armed() {
            undo.arm(Arc::clone(self));
        }
    }

    /// Gives up: undoes what may be left (a fair waiter's queue entry, or, after an attempt
    /// whose answer was lost, a hold it may have been granted).
    async fn give_up(&self, mut undo: Undo<P>, queued: bool, uncertain: bool) {
        let queue_entry = queued && self.primitive.leave_call(&self.holder).is_some();
        if queue_entry || uncertain {
            self.undo_now(&mut undo, "undo a given-up acquisition")
                .await;
        } else {
            undo.disarm();
        }
    }

    /// Undoes now. `undo` stays armed until the undo has run and succeeded: if this future is
    /// dropped meanwhile, or the undo fails, the drop runs it again in the background
    /// (undoing twice is harmless).
    async fn undo_now(&self, undo: &mut Undo<P>, what: &'static str) {
        match self.undo().await {
            Ok(()) => {
                undo.disarm();
            }
            Err(e) => {
                tracing::warn!(lock = %self.name, error = %e, "could not {what}; trying again in the background");
            }
        }
    }

    /// Leaves no trace of this acquisition: the queue entry of a fair waiter, and a hold that
    /// may have been granted by a call whose answer was never read. Every step is
    /// owner-checked, so it cannot touch anyone else's hold.
    pub(crate) async fn undo(&self) -> Result<()> {
        // After the attempt still in flight, if its future was dropped: it may queue or grant.
        let _settled = self.in_flight.lock().await;
        // Both steps run whatever the other did: a failed leave must not keep a hold that the
        // unanswered call may have granted.
        let mut left = Ok(());
        if let Some(leave) = self.primitive.leave_call(&self.holder) {
            left = self.inner.call(&leave).await.map(|_| ());
            if let Err(e) = &left {
                tracing::debug!(lock = %self.name, error = %e, "could not leave the fair queue");
            }
        }
        let released = self.release(&self.inner.next_release()).await.map(|_| ());
        left.and(released)
    }
}

/// The undo of an acquisition whose future was dropped, in a task of its own.
fn undo_in_background<P: Primitive>(acq: Arc<Acquisition<P>>) -> BoxedUndo {
    Box::pin(async move {
        if let Err(e) = acq.undo().await {
            tracing::warn!(lock = %acq.name, error = %e, "undo of a cancelled acquisition failed; its lease ends it");
        }
    })
}

/// How often a waiter whose store keeps failing says so at warning level.
const OUTAGE_WARN_EVERY: Duration = Duration::from_secs(30);

/// The log of one waiter's outage: the first failed attempt is a warning (an `acquire()`
/// without deadline waits through it, and a store that stays away must not pass for a lock
/// held for ever), then at most one warning per [`OUTAGE_WARN_EVERY`] while it lasts, with
/// the failures so far; the rest go to debug.
#[derive(Default)]
struct OutageLog {
    failures: u32,
    warned: Option<Instant>,
}

impl OutageLog {
    fn failed(&mut self, lock: &LockName, e: &Error) {
        self.failures = self.failures.saturating_add(1);
        let due = self
            .warned
            .is_none_or(|at| at.elapsed() >= OUTAGE_WARN_EVERY);
        if due {
            self.warned = Some(Instant::now());
            tracing::warn!(%lock, error = %e, failures = self.failures, "redis: acquire attempt failed; still trying until the store answers");
        } else {
            tracing::debug!(%lock, error = %e, failures = self.failures, "redis: acquire attempt failed; trying again");
        }
    }

    /// The store answered: an outage warned about is over.
    fn answered(&mut self, lock: &LockName) {
        if self.warned.is_some() {
            tracing::info!(%lock, failures = self.failures, "redis: the store answers again");
        }
        *self = Self::default();
    }
}
