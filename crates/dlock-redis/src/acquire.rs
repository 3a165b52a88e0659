//! One acquisition of a mutex, fair lock, read or write hold, or permit: the scripts it runs,
//! the wait between attempts, and the hold it becomes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock_core::{
    Error, FencingToken, Hold, HoldSignal, Lease, LockGuard, LockName, NewHold, Result, async_trait,
};
use redis::{Script, Value};
use tokio::time::Instant;

use crate::error::unexpected;
use crate::pubsub::{self, ChannelKind};
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
}

/// One acquisition: the lock's keys and the hash field (`<client uuid>:<hold id>`) it holds as.
#[derive(Debug)]
pub(crate) struct Acquisition {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: LockName,
    pub(crate) keys: Keys,
    pub(crate) field: String,
    pub(crate) kind: Kind,
    pub(crate) lease: Lease,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Reads a `{-1, token}` / `{pttl, -1}` reply.
fn read_attempt(reply: Value) -> Result<Attempt> {
    let pair = match &reply {
        Value::Array(items) if items.len() == 2 => (&items[0], &items[1]),
        _ => return Err(unexpected("acquire", &reply)),
    };
    match pair {
        (Value::Int(-1), Value::Int(token)) => u64::try_from(*token)
            .map(Attempt::Granted)
            .map_err(|_| unexpected("acquire token", &reply)),
        // -2: the key vanished between the checks: try again at once.
        (Value::Int(-2), _) => Ok(Attempt::Busy(Some(Duration::ZERO))),
        (Value::Int(pttl), _) if *pttl >= 0 => Ok(Attempt::Busy(Some(Duration::from_millis(
            u64::try_from(*pttl).unwrap_or(0),
        )))),
        // A holder without expiry (a foreign client's key): wake on messages only.
        (Value::Int(_), _) => Ok(Attempt::Busy(None)),
        _ => Err(unexpected("acquire", &reply)),
    }
}

/// How many times a call is retried after a connection error.
const RETRIES: usize = 2;

/// Longest sleep without a message when the holder's key has no expiry.
const NO_TTL_RECHECK: Duration = Duration::from_secs(5);

impl Acquisition {
    fn publish(&self) -> &'static str {
        if self.inner.conn.is_cluster() {
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

    /// One try; `queue` lets a fair waiter take its place in the queue.
    async fn attempt(&self, queue: bool) -> Result<Attempt> {
        let k = &self.keys;
        let lease = self.lease_ms().to_string();
        let field = self.field.as_bytes();
        let reply = match &self.kind {
            Kind::Mutex => {
                self.run(
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
                let now = now_ms().to_string();
                self.run(
                    "acquire",
                    script,
                    &[&k.name, &k.queue, &k.timeouts, &k.token],
                    &[lease.as_bytes(), field, wait.as_bytes(), now.as_bytes()],
                )
                .await?
            }
            Kind::Read { downgrade } => {
                let timeouts = k.read_timeouts(&self.field);
                let write = downgrade.as_deref().unwrap_or("");
                self.run(
                    "read",
                    &scripts::READ_LOCK,
                    &[&k.name, &timeouts, &k.token],
                    &[lease.as_bytes(), field, write.as_bytes()],
                )
                .await?
            }
            Kind::Write => {
                self.run(
                    "write",
                    &scripts::WRITE_LOCK,
                    &[&k.name, &k.token],
                    &[lease.as_bytes(), field],
                )
                .await?
            }
            Kind::Permit { permits, id } => {
                let now = now_ms();
                let expiry = now.saturating_add(self.lease_ms()).to_string();
                let permits = permits.to_string();
                let now = now.to_string();
                self.run(
                    "acquire permit",
                    &scripts::SEM_ACQUIRE,
                    &[&k.name, &k.sem_timeouts, &k.sem_channel, &k.token],
                    &[
                        permits.as_bytes(),
                        expiry.as_bytes(),
                        now.as_bytes(),
                        b"",
                        self.publish().as_bytes(),
                        id,
                    ],
                )
                .await?
            }
        };
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
                let now = now_ms().to_string();
                self.run(
                    "release",
                    &scripts::FAIR_UNLOCK,
                    &[&k.name, &k.queue, &k.timeouts, &k.channel],
                    &[
                        pubsub::UNLOCK.as_bytes(),
                        lease.as_bytes(),
                        field,
                        now.as_bytes(),
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
                let now = now_ms().to_string();
                self.run(
                    "release permit",
                    &scripts::SEM_RELEASE,
                    &[&k.name, &k.sem_channel, &k.sem_timeouts],
                    &[id, now.as_bytes(), publish],
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
    async fn renew(&self, ttl: Duration) -> Result<bool> {
        let k = &self.keys;
        let ttl_ms = ms(ttl).to_string();
        let field = self.field.as_bytes();
        let reply = match &self.kind {
            Kind::Mutex | Kind::Fair | Kind::Write => {
                self.run(
                    "renew",
                    &scripts::RENEW,
                    &[&k.name],
                    &[ttl_ms.as_bytes(), field],
                )
                .await?
            }
            Kind::Read { .. } => {
                self.run(
                    "renew read",
                    &scripts::READ_RENEW,
                    &[&k.name, &k.rw_prefix],
                    &[ttl_ms.as_bytes(), field],
                )
                .await?
            }
            Kind::Permit { id, .. } => {
                let expiry = now_ms().saturating_add(ms(ttl)).to_string();
                self.run(
                    "renew permit",
                    &scripts::SEM_RENEW,
                    &[&k.sem_timeouts],
                    &[expiry.as_bytes(), id],
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
        if let Kind::Fair = self.kind {
            let wait = ms(self.inner.fair_wait).to_string();
            let k = &self.keys;
            self.run(
                "leave queue",
                &scripts::FAIR_LEAVE,
                &[&k.queue, &k.timeouts],
                &[self.field.as_bytes(), wait.as_bytes()],
            )
            .await?;
        }
        self.release().await.map(|_| ())
    }

    /// [`attempt`](Self::attempt), retried after a connection error a reconnect may cure (a
    /// killed connection fails the first call on it). What the failed call may have done is
    /// undone first, so a retry can never hold twice.
    async fn attempt_retrying(&self, queue: bool) -> Result<Attempt> {
        let mut pause = Duration::from_millis(20);
        for _ in 0..RETRIES {
            match self.attempt(queue).await {
                Err(e) if e.is_retryable() => {
                    tracing::debug!(lock = %self.name, error = %e, "acquire attempt failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause *= 4;
                    if self.undo().await.is_err() {
                        return Err(e);
                    }
                }
                other => return other,
            }
        }
        self.attempt(queue).await
    }

    /// Acquires, waiting until `deadline` (`None`: as long as it takes).
    ///
    /// Cancel safe: while a call that may grant the lock is in flight, and while a fair waiter
    /// is queued, an undo is armed that runs in the background if this future is dropped.
    pub(crate) async fn run_until(
        self: Arc<Self>,
        deadline: Option<Instant>,
    ) -> Result<Option<LockGuard>> {
        let started = Instant::now();
        let queue = deadline.is_none_or(|d| d > started);
        let undo = Undo {
            acq: Arc::clone(&self),
            armed: true,
        };
        if let Attempt::Granted(token) = self.attempt_retrying(queue).await? {
            return Ok(Some(undo.grant(token, started)));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            undo.finish(queue).await;
            return Ok(None);
        }
        let (channel, kind) = self.channel();
        let listener = self.inner.subs.listen(&channel, kind).await?;
        loop {
            // Tried, subscribed, try again: a release between the two is not missed.
            let tried = Instant::now();
            let attempt = self.attempt_retrying(true).await;
            listener.consumed();
            let wait = match attempt? {
                Attempt::Granted(token) => return Ok(Some(undo.grant(token, tried))),
                Attempt::Busy(wait) => wait,
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                undo.finish(true).await;
                return Ok(None);
            }
            let retry = now + wait.unwrap_or(NO_TTL_RECHECK);
            let until = deadline.map_or(retry, |d| d.min(retry));
            listener.wait(Some(until)).await;
        }
    }
}

/// Undoes an acquisition in the background if dropped while armed.
struct Undo {
    acq: Arc<Acquisition>,
    armed: bool,
}

impl Undo {
    /// Disarms and turns the granted acquisition into a guard, with no await in between.
    fn grant(mut self, token: u64, started: Instant) -> LockGuard {
        self.armed = false;
        LockGuard::new(NewHold::new(
            BACKEND,
            self.acq.name.clone(),
            FencingToken::new(token),
            self.acq.lease,
            started,
            Arc::new(RedisHold(Arc::clone(&self.acq))),
            HoldSignal::new(),
        ))
    }

    /// Gives up: undoes now if something may be left (a fair waiter's queue entry).
    async fn finish(mut self, queued: bool) {
        self.armed = false;
        if queued
            && matches!(self.acq.kind, Kind::Fair)
            && let Err(e) = self.acq.undo().await
        {
            tracing::warn!(lock = %self.acq.name, error = %e, "could not leave the fair queue; the entry expires with its wait");
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
pub(crate) struct RedisHold(Arc<Acquisition>);

#[async_trait]
impl Hold for RedisHold {
    async fn release(&self) -> Result<()> {
        match self.0.release().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::lock_lost(&self.0.name)),
            // A killed connection fails the first call on it; the unlock is owner-checked, so
            // one more try is safe. Its "not held" then may mean the first one did release.
            Err(e) if e.is_retryable() => self.0.release().await.map(|_| ()),
            Err(e) => Err(e),
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        if self.0.renew(ttl).await? {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.0.name))
        }
    }
}
