//! One acquisition of a mutex, fair lock, read or write hold, or permit: the scripts it runs,
//! the wait between attempts, and the hold it becomes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_core::backend::{Backoff, Deadline, Hold, HoldSignal, NewHold};
use dlock_core::{Error, FencingToken, Lease, LockGuard, LockKind, LockName, Result, async_trait};
use redis::{Script, Value};
use tokio::time::Instant;

use crate::error::{other_kind, unexpected};
use crate::pubsub::{self, ChannelKind, Subscribed};
use crate::scripts::{self, Keys};
use crate::{BACKEND, Inner};

/// What is being acquired.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    Mutex,
    Fair,
    /// A read hold; `downgrade` is the field of this owner's write hold, if it has one.
    Read {
        downgrade: Option<String>,
    },
    Write,
    /// A semaphore permit out of `permits`; `id` is the permit's 16 raw bytes.
    Permit {
        permits: u32,
        id: [u8; 16],
    },
}

/// The answer of one attempt.
enum Attempt {
    Granted(u64),
    /// Not granted; retry after this long at the latest (`None`: only when woken).
    Busy(Option<Duration>),
    /// This acquisition already holds: the script ran before (a re-sent call) and its token
    /// is lost. Give the hold back and try again.
    Repeated,
}

/// One acquisition: the lock's keys and the hash field (`<client uuid>:<hold id>`) it holds as.
#[derive(Debug)]
pub(crate) struct Acquisition {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: LockName,
    pub(crate) keys: Arc<Keys>,
    pub(crate) field: String,
    pub(crate) kind: Kind,
    pub(crate) lease: Lease,
    /// Replicas that acknowledged the last acquire script (`?wait_replicas=N` only).
    pub(crate) acked: AtomicU32,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The text of a reply item (a key type a script returned).
fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Some(s.clone()),
        _ => None,
    }
}

/// Reads the `{-6, type}` reply of a script that found another kind's key at the name: the
/// error to return, or `None` for any other reply.
pub(crate) fn read_other_kind(reply: &Value, name: &str, lock: bool) -> Option<Error> {
    match reply {
        Value::Array(items) if items.len() == 2 && items[0] == Value::Int(-6) => {
            let key_type = text(&items[1]).unwrap_or_else(|| "key of another type".into());
            Some(other_kind(name, &key_type, lock))
        }
        _ => None,
    }
}

/// Reads a `{-1, token}` / `{pttl, -1}` reply.
fn read_attempt(reply: Value) -> Result<Attempt> {
    let pair = match &reply {
        Value::Array(items) if items.len() == 2 => (&items[0], &items[1]),
        _ => return Err(unexpected("acquire", &reply)),
    };
    match pair {
        (Value::Int(-1), Value::Int(token)) if *token >= 0 => u64::try_from(*token)
            .map(Attempt::Granted)
            .map_err(|_| unexpected("acquire token", &reply)),
        // -2: the key vanished between the checks: try again at once.
        (Value::Int(-2), _) => Ok(Attempt::Busy(Some(Duration::ZERO))),
        // -3: a semaphore in use with another number of permits.
        (Value::Int(-3), Value::Int(size)) => Err(Error::invalid_argument(
            "permits",
            format!(
                "the semaphore is in use with {size} permits; this handle counts a different \
                 number (handles must agree while any permit is held)"
            ),
        )),
        (Value::Int(pttl), _) if *pttl >= 0 => Ok(Attempt::Busy(Some(Duration::from_millis(
            u64::try_from(*pttl).unwrap_or(0),
        )))),
        (Value::Int(-5), _) => Ok(Attempt::Repeated),
        // -1: a holder without expiry (a foreign client's key); -4: no permit free and none
        // expiring (held without expiry). Only a message can help: wake on messages only.
        (Value::Int(-4 | -1), _) => Ok(Attempt::Busy(None)),
        _ => Err(unexpected("acquire", &reply)),
    }
}

/// How many times a call is retried after a connection error.
const RETRIES: usize = 2;

/// Longest sleep without a message: when the holder's key has no expiry, and the cap on every
/// other wait (so a lost wake-up message costs at most this long).
const NO_TTL_RECHECK: Duration = Duration::from_secs(5);

/// The longest pause between two tries of a waiter while the server is away (a restart, a
/// failover): once it is back, every waiter tries within this long.
pub(crate) const OUTAGE_PAUSE_MAX: Duration = Duration::from_millis(250);

impl Acquisition {
    fn publish(&self) -> &'static str {
        if self.inner.conn.sharded() {
            "spublish"
        } else {
            "publish"
        }
    }

    fn lease_ms(&self) -> u64 {
        ms(self.lease.ttl())
    }

    async fn run(
        &self,
        what: &str,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        self.inner.conn.script(what, &invocation).await
    }

    /// Runs a script; with `?wait_replicas=N`, in one pipeline with `WAIT`. Returns the reply
    /// and how many replicas acknowledged it (0 when not waiting).
    async fn run_waiting(
        &self,
        what: &str,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<(Value, u32)> {
        let want = self.inner.wait_replicas;
        if want == 0 {
            return Ok((self.run(what, script, keys, args).await?, 0));
        }
        self.inner
            .conn
            .script_then_wait(what, script, keys, args, want, self.inner.wait_timeout)
            .await
    }

    /// Runs one acquire script, keeping how many replicas acknowledged it for
    /// [`confirm`](Self::confirm).
    async fn run_attempt(
        &self,
        what: &str,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value> {
        self.acked.store(0, Ordering::SeqCst);
        let (reply, acked) = self.run_waiting(what, script, keys, args).await?;
        self.acked.store(acked, Ordering::SeqCst);
        Ok(reply)
    }

    /// Runs a renewal script; with `?wait_replicas=N` it fails (retryable) unless N replicas
    /// acknowledged it: a lease the replicas have not seen extended is not extended, so a
    /// failover cannot cut a hold shorter than its holder believes. A holder whose replicas
    /// stay away is lost at its lease end.
    async fn run_replicated(
        &self,
        what: &str,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value> {
        let want = self.inner.wait_replicas;
        let (reply, acked) = self.run_waiting(what, script, keys, args).await?;
        if acked < want {
            return Err(Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{what} of {:?}: only {acked} of {want} replicas acknowledged it within {:?}",
                    self.name, self.inner.wait_timeout
                ),
                retryable: true,
                source: None,
            });
        }
        Ok(reply)
    }

    /// One try; `queue` lets a fair waiter take its place in the queue.
    async fn attempt(&self, queue: bool) -> Result<Attempt> {
        let k = &self.keys;
        let lease = self.lease_ms().to_string();
        let field = self.field.as_bytes();
        let reply = match &self.kind {
            Kind::Mutex => {
                self.run_attempt(
                    "acquire",
                    &scripts::LOCK,
                    &[&k.name, &k.token],
                    &[lease.as_bytes(), field],
                )
                .await?
            }
            Kind::Fair => {
                let script = if queue {
                    &*scripts::FAIR_LOCK
                } else {
                    &*scripts::FAIR_TRY
                };
                let wait = ms(self.inner.fair_wait).to_string();
                // ARGV[4] (now) is set by the script from the server's clock.
                self.run_attempt(
                    "acquire",
                    script,
                    &[&k.name, &k.queue, &k.timeouts, &k.token],
                    &[lease.as_bytes(), field, wait.as_bytes(), b"".as_slice()],
                )
                .await?
            }
            Kind::Read { downgrade } => {
                let timeouts = k.read_timeouts(&self.field);
                let write = downgrade.as_deref().unwrap_or("");
                self.run_attempt(
                    "read",
                    &scripts::READ_LOCK,
                    &[&k.name, &timeouts, &k.token],
                    &[lease.as_bytes(), field, write.as_bytes()],
                )
                .await?
            }
            Kind::Write => {
                self.run_attempt(
                    "write",
                    &scripts::WRITE_LOCK,
                    &[&k.name, &k.token],
                    &[lease.as_bytes(), field],
                )
                .await?
            }
            Kind::Permit { permits, id } => {
                // The expiry and now (ARGV 2 and 3) come from the server's clock.
                let permits = permits.to_string();
                self.run_attempt(
                    "acquire permit",
                    &scripts::SEM_ACQUIRE,
                    &[
                        &k.name,
                        &k.sem_timeouts,
                        &k.sem_channel,
                        &k.token,
                        &k.sem_size,
                    ],
                    &[
                        permits.as_bytes(),
                        b"",
                        b"",
                        lease.as_bytes(),
                        self.publish().as_bytes(),
                        id,
                    ],
                )
                .await?
            }
        };
        let lock = !matches!(self.kind, Kind::Permit { .. });
        if let Some(e) = read_other_kind(&reply, self.name.as_str(), lock) {
            return Err(e);
        }
        read_attempt(reply)
    }

    /// The channel a waiter listens on.
    fn channel(&self) -> (String, ChannelKind) {
        match &self.kind {
            Kind::Mutex => (self.keys.channel.clone(), ChannelKind::Lock),
            Kind::Fair => (self.keys.waiter_channel(&self.field), ChannelKind::Lock),
            Kind::Read { .. } | Kind::Write => (self.keys.rw_channel.clone(), ChannelKind::Lock),
            Kind::Permit { .. } => (self.keys.sem_channel.clone(), ChannelKind::Semaphore),
        }
    }

    /// Releases the hold. `Ok(false)`: it was not ours (any more).
    async fn release(&self) -> Result<bool> {
        let k = &self.keys;
        let lease = self.lease_ms().to_string();
        let field = self.field.as_bytes();
        let publish = self.publish().as_bytes();
        let reply = match &self.kind {
            Kind::Mutex => {
                self.run(
                    "release",
                    &scripts::UNLOCK,
                    &[&k.name, &k.channel],
                    &[pubsub::UNLOCK.as_bytes(), lease.as_bytes(), field, publish],
                )
                .await?
            }
            Kind::Fair => {
                self.run(
                    "release",
                    &scripts::FAIR_UNLOCK,
                    &[&k.name, &k.queue, &k.timeouts, &k.channel],
                    &[
                        pubsub::UNLOCK.as_bytes(),
                        lease.as_bytes(),
                        field,
                        b"",
                        publish,
                    ],
                )
                .await?
            }
            Kind::Read { .. } => {
                let timeouts = k.read_timeouts(&self.field);
                self.run(
                    "release read",
                    &scripts::READ_UNLOCK,
                    &[&k.name, &k.rw_channel, &timeouts, &k.rw_prefix],
                    &[pubsub::UNLOCK.as_bytes(), field, publish],
                )
                .await?
            }
            Kind::Write => {
                self.run(
                    "release write",
                    &scripts::WRITE_UNLOCK,
                    &[&k.name, &k.rw_channel],
                    &[
                        pubsub::READ_UNLOCK.as_bytes(),
                        lease.as_bytes(),
                        field,
                        publish,
                    ],
                )
                .await?
            }
            Kind::Permit { id, .. } => {
                self.run(
                    "release permit",
                    &scripts::SEM_RELEASE,
                    &[&k.name, &k.sem_channel, &k.sem_timeouts],
                    &[id, b"", publish],
                )
                .await?
            }
        };
        match reply {
            Value::Nil => Ok(false),
            Value::Int(_) => Ok(true),
            other => Err(unexpected("release", other)),
        }
    }

    /// Renews the hold for `ttl`. `Ok(false)`: it is not ours (any more).
    /// Whether the store still has this hold (one round trip; changes nothing).
    pub(crate) async fn still_held(&self) -> Result<bool> {
        let k = &self.keys;
        let reply = match &self.kind {
            Kind::Permit { id, .. } => {
                self.run(
                    "check permit",
                    &scripts::HELD,
                    &[&k.sem_timeouts],
                    &[id.as_slice(), b"zset".as_slice()],
                )
                .await?
            }
            _ => {
                self.run(
                    "check hold",
                    &scripts::HELD,
                    &[&k.name],
                    &[self.field.as_bytes(), b"hash".as_slice()],
                )
                .await?
            }
        };
        match reply {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(unexpected("check hold", other)),
        }
    }

    async fn renew(&self, ttl: Duration) -> Result<bool> {
        let k = &self.keys;
        let ttl_ms = ms(ttl).to_string();
        let field = self.field.as_bytes();
        let reply = match &self.kind {
            Kind::Mutex | Kind::Fair | Kind::Write => {
                self.run_replicated(
                    "renew",
                    &scripts::RENEW,
                    &[&k.name],
                    &[ttl_ms.as_bytes(), field],
                )
                .await?
            }
            Kind::Read { .. } => {
                self.run_replicated(
                    "renew read",
                    &scripts::READ_RENEW,
                    &[&k.name, &k.rw_prefix],
                    &[ttl_ms.as_bytes(), field],
                )
                .await?
            }
            Kind::Permit { id, .. } => {
                self.run_replicated(
                    "renew permit",
                    &scripts::SEM_RENEW,
                    &[&k.sem_timeouts],
                    &[ttl_ms.as_bytes(), id],
                )
                .await?
            }
        };
        match reply {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(unexpected("renew", other)),
        }
    }

    /// Leaves no trace of this acquisition: the queue entry of a fair waiter, and a hold that
    /// may have been granted by a call whose answer was never read. Every step is
    /// owner-checked, so it cannot touch anyone else's hold.
    async fn undo(&self) -> Result<()> {
        // Both steps run whatever the other did (review M5): a failed leave must not keep a
        // hold that the unanswered call may have granted.
        let mut left = Ok(());
        if let Kind::Fair = self.kind {
            let wait = ms(self.inner.fair_wait).to_string();
            let k = &self.keys;
            left = self
                .run(
                    "leave queue",
                    &scripts::FAIR_LEAVE,
                    &[&k.queue, &k.timeouts, &k.name, &k.channel],
                    &[
                        self.field.as_bytes(),
                        wait.as_bytes(),
                        pubsub::UNLOCK.as_bytes(),
                        self.publish().as_bytes(),
                    ],
                )
                .await
                .map(|_| ());
            if let Err(e) = &left {
                tracing::debug!(lock = %self.name, error = %e, "could not leave the fair queue");
            }
        }
        let released = self.release().await.map(|_| ());
        left.and(released)
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
                // back above), and a fair waiter keeps its place in the queue (review L6).
                // What a call may have taken when the retries run out stays with the armed
                // undo of `run_until`.
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
                Err(Error::Backend {
                    backend: BACKEND,
                    message: format!(
                        "acquire of {:?}: the script kept running twice (a client retry); \
                         gave the hold back",
                        self.name
                    ),
                    retryable: true,
                    source: None,
                })
            }
            a => Ok((a, sent)),
        }
    }

    /// Turns a grant into a guard once it is safe from a failover: with `?wait_replicas=N`,
    /// once N replicas acknowledged it (the `WAIT` sent in one pipeline with the granting
    /// script). If fewer did in time, the grant is given back (the undo stays armed until
    /// then) and the acquire fails with a retryable error, so no guard carries a grant that a
    /// failover could hand to someone else with the same token.
    async fn confirm(&self, undo: Undo, token: u64, sent: Instant) -> Result<Option<LockGuard>> {
        let want = self.inner.wait_replicas;
        let got = self.acked.swap(0, Ordering::SeqCst);
        if want == 0 || got >= want {
            return Ok(Some(undo.grant(token, sent)));
        }
        undo.give_back().await;
        Err(Error::Backend {
            backend: BACKEND,
            message: format!(
                "only {got} of {want} replicas acknowledged the grant of {:?} within {:?}; gave \
                 it back",
                self.name, self.inner.wait_timeout
            ),
            retryable: true,
            source: None,
        })
    }

    /// Acquires, waiting until `deadline`.
    ///
    /// Cancel safe: while a call that may grant the lock is in flight, and while a fair waiter
    /// is queued, an undo is armed that runs in the background if this future is dropped.
    pub(crate) async fn run_until(
        self: Arc<Self>,
        deadline: Deadline,
    ) -> Result<Option<LockGuard>> {
        let queue = !deadline.has_passed();
        let undo = Undo {
            acq: Arc::clone(&self),
            armed: true,
        };
        // The error of the last attempt, while the store has not answered since: its script
        // may have run with the answer lost (the undo then gives back what it may have
        // taken), and at the deadline it is the answer, never "held by someone", which only
        // a store that answered can say.
        let mut unanswered: Option<Error> = None;
        let mut outage_log = OutageLog::default();
        match self.attempt_retrying(queue).await {
            Ok((Attempt::Granted(token), sent)) => {
                return self.confirm(undo, token, sent).await;
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
            undo.finish(queue, unanswered.is_some()).await;
            return unanswered.map_or(Ok(None), Err);
        }
        let (channel, kind) = self.channel();
        let listener = self.inner.subs.listen(&channel, kind).await?;
        let mut outage = Backoff::new(Duration::from_millis(50), OUTAGE_PAUSE_MAX);
        // Pauses while no subscription can wake this waiter (at most 4 tries a second).
        let mut unheard = Backoff::new(Duration::from_millis(50), OUTAGE_PAUSE_MAX);
        loop {
            // Tried, subscribed, try again: a release between the two is not missed. The
            // wake-up that led here is used up before the attempt, not after it: a release
            // announced while the attempt is in flight (which may have seen the lock still
            // held) wakes this waiter again instead of being erased with the old wake-up.
            listener.consumed();
            let attempt = self.attempt_retrying(true).await;
            listener.tried();
            let wait = match attempt {
                Ok((Attempt::Granted(token), sent)) => {
                    return self.confirm(undo, token, sent).await;
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
                undo.finish(true, unanswered.is_some()).await;
                return unanswered.map_or(Ok(None), Err);
            }
            // Bounded even when a wake-up message is due: one lost message (a pub/sub
            // connection that died with a restart) costs at most NO_TTL_RECHECK.
            let wait = wait.unwrap_or(NO_TTL_RECHECK).min(NO_TTL_RECHECK);
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

/// Undoes an acquisition in the background if dropped while armed.
struct Undo {
    acq: Arc<Acquisition>,
    armed: bool,
}

impl Undo {
    /// Disarms and turns the granted acquisition into a guard, with no await in between.
    fn grant(mut self, token: u64, sent: Instant) -> LockGuard {
        self.armed = false;
        let kind = match self.acq.kind {
            Kind::Mutex | Kind::Fair => LockKind::Mutex,
            Kind::Read { .. } => LockKind::Read,
            Kind::Write => LockKind::Write,
            Kind::Permit { .. } => LockKind::Permit,
        };
        let signal = HoldSignal::new();
        let id = self.acq.inner.register(&self.acq, &signal);
        LockGuard::new(
            NewHold::new(
                BACKEND,
                kind,
                self.acq.name.clone(),
                FencingToken::new(token),
                self.acq.lease,
                sent,
                Arc::new(RedisHold {
                    acq: Arc::clone(&self.acq),
                    id,
                }),
            )
            .with_signal(signal),
        )
    }

    /// Gives a grant back (its replicas did not acknowledge it); stays armed if that fails,
    /// so the drop tries again in the background.
    async fn give_back(mut self) {
        match self.acq.undo().await {
            Ok(()) => self.armed = false,
            Err(e) => {
                tracing::warn!(lock = %self.acq.name, error = %e, "could not give back an unreplicated grant; trying again in the background");
            }
        }
    }

    /// Gives up: undoes what may be left (a fair waiter's queue entry, or, after an attempt
    /// whose answer was lost, a hold it may have been granted). Stays armed until the undo
    /// has run and succeeded: if this future is dropped meanwhile, or the undo fails, the drop
    /// runs it again in the background (undoing twice is harmless).
    async fn finish(mut self, queued: bool, uncertain: bool) {
        let fair_entry = queued && matches!(self.acq.kind, Kind::Fair);
        if !fair_entry && !uncertain {
            self.armed = false;
            return;
        }
        match self.acq.undo().await {
            Ok(()) => self.armed = false,
            Err(e) => {
                tracing::warn!(lock = %self.acq.name, error = %e, "could not undo a given-up acquisition; trying again in the background");
            }
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if self.armed
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let acq = Arc::clone(&self.acq);
            runtime.spawn(async move {
                    if let Err(e) = acq.undo().await {
                        tracing::warn!(lock = %acq.name, error = %e, "undo of a cancelled acquisition failed; its lease ends it");
                    }
                });
        }
    }
}

/// The backend side of a Redis hold.
#[derive(Debug)]
pub(crate) struct RedisHold {
    acq: Arc<Acquisition>,
    /// Its registration with the provider, for the check after a disconnection.
    id: u64,
}

impl Drop for RedisHold {
    fn drop(&mut self) {
        self.acq.inner.unregister(self.id);
    }
}

#[async_trait]
impl Hold for RedisHold {
    async fn release(&self) -> Result<()> {
        // No check after a disconnection may call a hold being released lost.
        self.acq.inner.unregister(self.id);
        match self.acq.release().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::lock_lost(&self.acq.name)),
            // A killed connection fails the first call on it; the unlock is owner-checked, so
            // one more try is safe. Its "not held" then may mean the first one did release.
            Err(e) if e.is_retryable() => self.acq.release().await.map(|_| ()),
            Err(e) => Err(e),
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        if self.acq.renew(ttl).await? {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.acq.name))
        }
    }
}
