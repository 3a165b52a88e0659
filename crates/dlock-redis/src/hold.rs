//! A granted acquisition as the core's [`Hold`]: its guard, release and renewal, and its
//! place among the provider's live holds, which the provider's watcher checks.

use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Hold, HoldSignal, Mutex, NewHold, Registration, renewal_window};
use dlock_core::{Error, FencingToken, Lease, LockGuard, LockName, Result, async_trait};
use redis::Value;
use tokio::time::Instant;

use crate::call::{Call, ms, read_held, read_released};
use crate::consts::BACKEND;
use crate::holds::{CHECK_EVERY, Checked};
use crate::primitive::{Acquisition, Primitive};

/// The backend side of a Redis hold.
#[derive(Debug)]
pub(crate) struct RedisHold<P> {
    acq: Arc<Acquisition<P>>,
    /// Its place among the provider's live holds; taken when a release begins, so no check
    /// after a disconnection calls a hold being released lost.
    registration: Mutex<Option<Registration<Weak<dyn Checked>>>>,
}

impl<P: Primitive> RedisHold<P> {
    /// The guard of a granted acquisition; the lease runs from `sent`, when the granting call
    /// was sent.
    pub(crate) fn guard(acq: Arc<Acquisition<P>>, token: u64, sent: Instant) -> LockGuard {
        let signal = HoldSignal::new();
        let name = acq.name.clone();
        let lease = acq.lease;
        let hold = Arc::new_cyclic(|me: &Weak<Self>| {
            let me: Weak<dyn Checked> = Weak::<Self>::clone(me);
            Self {
                registration: Mutex::new(Some(acq.inner.holds.register(&signal, me))),
                acq,
            }
        });
        LockGuard::new(
            NewHold::new(
                BACKEND,
                P::KIND,
                name,
                FencingToken::new(token),
                lease,
                sent,
                hold,
            )
            .with_signal(signal),
        )
    }
}

impl<P: Primitive> Acquisition<P> {
    /// Releases the hold. `Ok(false)`: it was not ours (any more). `request` names this
    /// release (one of [`Inner::next_release`]'s), and its latch: sent again with the same
    /// `request`, the unlock answers what it did the first time.
    pub(crate) async fn release(&self, request: &str) -> Result<bool> {
        let h = &self.holder;
        let call = self
            .primitive
            .release_call(h)
            .key(h.keys.unlock_latch(request))
            .num(self.inner.latch_ms);
        read_released(self.inner.call(&call).await?)
    }

    /// Renews the hold for `ttl`. `Ok(false)`: it is not ours (any more).
    async fn renew(&self, ttl: Duration) -> Result<bool> {
        let call = self.primitive.renew_call(&self.holder, ms(ttl));
        let renewed = |reply: &Value| *reply == Value::Int(1);
        let (reply, ack) = self.inner.call_replicated(&call, renewed).await?;
        // A lease the replicas have not seen extended is not extended: a failover would cut
        // the hold shorter than its holder believes.
        if let Some(e) = ack.error(format_args!("renew of {:?}", self.name)) {
            return Err(e);
        }
        read_held("renew", reply)
    }

    /// The watchdog's renewal for `ttl`: in the provider's next batch of renewals, where
    /// it has one (see [`Inner::renewals`](crate::shared::Inner)), else alone. `Ok(false)`:
    /// the hold is not ours (any more).
    async fn renew_in_batch(&self, ttl: Duration) -> Result<bool> {
        let Some(renewals) = &self.inner.renewals else {
            return self.renew(ttl).await;
        };
        let call = self
            .primitive
            .renew_call(&self.holder, ms(ttl))
            .into_owned();
        read_held("renew", renewals.call(call, renewal_window(ttl)).await?)
    }
}

#[async_trait]
impl<P: Primitive> Hold for RedisHold<P> {
    async fn release(&self) -> Result<()> {
        // Leaves the live holds first: no check after a disconnection may call a hold being
        // released lost.
        drop(self.registration.lock().take());
        let request = self.acq.inner.next_release();
        let released = match self.acq.release(&request).await {
            // A killed connection fails the first call on it; the unlock is owner-checked and
            // latched, so one more try is safe, and answers what the first did if it ran.
            Err(e) if e.is_retryable() => self.acq.release(&request).await,
            other => other,
        };
        if released? {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.acq.name))
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        if self.acq.renew(ttl).await? {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.acq.name))
        }
    }

    async fn renew(&self, ttl: Duration) -> Result<()> {
        if self.acq.renew_in_batch(ttl).await? {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.acq.name))
        }
    }

    fn renews_in_batches(&self) -> bool {
        self.acq.inner.renewals.is_some()
    }
}

impl<P: Primitive> Checked for RedisHold<P> {
    fn name(&self) -> &LockName {
        &self.acq.name
    }

    fn held_call(&self) -> Call<'static> {
        self.acq.primitive.held_call(&self.acq.holder).into_owned()
    }

    fn renewed_often(&self) -> bool {
        matches!(self.acq.lease, Lease::Watchdog { ttl } if ttl / 3 <= CHECK_EVERY)
    }

    fn releasing(&self) -> bool {
        self.registration.lock().is_none()
    }
}
