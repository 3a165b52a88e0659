//! The mutex handle and its waiting loop: polls with capped exponential backoff and jitter
//! (unique-insert, optimistic) or waits on the row lock (for-update).

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    DistributedLock, Error, FencingToken, HoldSignal, LockGuard, LockName, LockOptions, NewHold,
    Reentrancy, Result, async_trait,
};
use rand::Rng;
use tokio::time::Instant;
use tracing::Instrument;

use crate::Inner;
use crate::config::Strategy;
use crate::strategies::{Attempt, SqlHold};

/// First pause between two attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(4);
/// Longest pause between two attempts.
const BACKOFF_MAX: Duration = Duration::from_millis(200);

/// A mutex handle on one SQL provider.
#[derive(Debug)]
pub(crate) struct SqlLock {
    inner: Arc<Inner>,
    name: LockName,
    options: LockOptions,
    reentrancy: Reentrancy,
}

impl SqlLock {
    pub(crate) fn new(inner: Arc<Inner>, name: LockName, options: LockOptions) -> Self {
        Self {
            inner,
            name,
            options,
            reentrancy: Reentrancy::new(),
        }
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("dlock.acquire", backend = self.inner.backend, lock = %self.name, strategy = %self.inner.strategy);
        async {
            if self.options.reentrant {
                self.reentrancy
                    .acquire(deadline, || self.remote(deadline))
                    .await
            } else {
                self.remote(deadline).await
            }
        }
        .instrument(span)
        .await
    }

    async fn remote(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let mut pause = BACKOFF_MIN;
        loop {
            let started = Instant::now();
            let attempt = Attempt {
                inner: Arc::clone(&self.inner),
                name: self.name.clone(),
                owner: self.inner.next_owner(),
                lease: self.options.lease.ttl(),
            };
            match self.try_once(attempt, started, deadline).await {
                Ok(Some(guard)) => return Ok(Some(guard)),
                Ok(None) => {}
                Err(e) if e.is_retryable() => {
                    tracing::debug!(lock = %self.name, error = %e, "acquire attempt failed; retrying");
                }
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let jittered = rand::rng().random_range(pause / 2..=pause);
            let wake = deadline.map_or(now + jittered, |d| d.min(now + jittered));
            tokio::time::sleep_until(wake).await;
            pause = (pause * 2).min(BACKOFF_MAX);
        }
    }

    /// One attempt. While a statement that may grant the lock is in flight, an undo is armed
    /// that deletes (or frees) the hold in the background if this future is dropped: holds
    /// are owner-checked and each attempt has its own owner, so the undo touches nothing else.
    /// For-update needs none: the connection holding the row lock is closed if dropped.
    async fn try_once(
        &self,
        attempt: Attempt,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Result<Option<LockGuard>> {
        let strategy = self.inner.strategy;
        if strategy == Strategy::ForUpdate {
            let Some((conn, connection_id)) = attempt.for_update(deadline).await? else {
                return Ok(None);
            };
            let token = attempt.next_fence().await?;
            attempt
                .inner
                .remember_holder(&attempt.owner, &attempt.name, connection_id);
            let hold = SqlHold::ForUpdate(attempt, tokio::sync::Mutex::new(conn));
            return Ok(Some(self.guard(hold, token, started)));
        }
        let attempt = Arc::new(attempt);
        let mut undo = Undo(Some(Arc::clone(&attempt)));
        let got = match strategy {
            Strategy::UniqueInsert => attempt.unique_insert().await,
            _ => attempt.optimistic().await,
        };
        let token = match got {
            Ok(Some(token)) => token,
            Ok(None) => {
                undo.0 = None;
                return Ok(None);
            }
            Err(e) => {
                // The statement may have taken the lock: undo now, before the next attempt.
                undo.run().await;
                return Err(e);
            }
        };
        undo.0 = None;
        drop(undo);
        let attempt = Arc::try_unwrap(attempt).map_err(|_| shared_attempt())?;
        let hold = match strategy {
            Strategy::UniqueInsert => SqlHold::UniqueInsert(attempt),
            _ => SqlHold::Optimistic(attempt, token),
        };
        Ok(Some(self.guard(hold, token, started)))
    }

    fn guard(&self, hold: SqlHold, token: u64, started: Instant) -> LockGuard {
        LockGuard::new(NewHold::new(
            self.inner.backend,
            self.name.clone(),
            FencingToken::new(token),
            self.options.lease,
            started,
            Arc::new(hold),
            HoldSignal::new(),
        ))
    }
}

fn shared_attempt() -> Error {
    Error::Backend {
        backend: "sql",
        message: "an attempt was still shared when it became a hold".into(),
        retryable: true,
        source: None,
    }
}

/// Frees whatever an in-flight attempt may have taken, if dropped while armed.
struct Undo(Option<Arc<Attempt>>);

impl Undo {
    async fn run(&mut self) {
        if let Some(a) = self.0.take() {
            undo(&a).await;
        }
    }
}

async fn undo(a: &Attempt) {
    let r = match a.inner.strategy {
        Strategy::UniqueInsert => a.unique_release().await,
        Strategy::Optimistic => a.optimistic_release(None).await,
        Strategy::ForUpdate => Ok(false),
    };
    if let Err(e) = r {
        tracing::warn!(lock = %a.name, error = %e, "undo of an interrupted acquisition failed; its lease ends it");
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(a) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move { undo(&a).await });
        }
    }
}

#[async_trait]
impl DistributedLock for SqlLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn options(&self) -> &LockOptions {
        &self.options
    }

    fn store_id(&self) -> &str {
        &self.inner.store_id
    }

    async fn acquire(&self) -> Result<LockGuard> {
        self.acquire_until(None)
            .await?
            .ok_or_else(|| Error::Backend {
                backend: self.inner.backend,
                message: format!(
                    "an unbounded wait for {:?} ended without the lock",
                    self.name
                ),
                retryable: true,
                source: None,
            })
    }

    async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(Some(Instant::now() + wait)).await
    }
}
