//! A granted acquisition as the core's [`Hold`]: its guard, release and renewal, and its
//! place among the provider's live holds, which are checked after a disconnection.

use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Hold, HoldSignal, Mutex, NewHold, Registration, renewal_window};
use dlock_core::{Error, FencingToken, LockGuard, LockName, Result, async_trait};
use tokio::time::Instant;

use crate::call::{ms, read_held, read_released};
use crate::consts::BACKEND;
use crate::holds::Checked;
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
        let reply = self.inner.call_replicated(&call, &self.name).await?;
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

    /// Whether the store still has this hold (one round trip; changes nothing).
    async fn still_held(&self) -> Result<bool> {
        let call = self.primitive.held_call(&self.holder);
        read_held("check hold", self.inner.call(&call).await?)
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
}

#[async_trait]
impl<P: Primitive> Checked for RedisHold<P> {
    fn name(&self) -> &LockName {
        &self.acq.name
    }

    async fn still_held(&self) -> Result<bool> {
        self.acq.still_held().await
    }

    fn releasing(&self) -> bool {
        self.registration.lock().is_none()
    }
}
