//! The semaphore: Redisson's `RPermitExpirableSemaphore` (scripts in [`scripts::semaphore`]).
//! Each acquisition holds one permit, a random id in the timeouts set.
//!
//! [`scripts::semaphore`]: crate::scripts::semaphore

use std::sync::Arc;

use dlock_core::backend::{RawSemaphore, Request};
use dlock_core::{LockGuard, LockKind, LockName, Result, async_trait};
use redis::Value;

use crate::call::{Call, read_other_kind};
use crate::error::unexpected;
use crate::keys::Keys;
use crate::primitive::{Acquisition, Holder, Primitive};
use crate::pubsub::ChannelKind;
use crate::scripts::HELD;
use crate::scripts::semaphore::{SEM_ACQUIRE, SEM_AVAILABLE, SEM_RELEASE, SEM_RENEW};
use crate::shared::Inner;

/// A semaphore (Redisson `RPermitExpirableSemaphore` layout).
#[derive(Debug)]
pub struct RedisSemaphore {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: Arc<Keys>,
}

#[async_trait]
impl RawSemaphore for RedisSemaphore {
    async fn acquire(&self, req: &Request<'_>, permits: u32) -> Result<Option<LockGuard>> {
        let permit = Permit {
            permits,
            id: *uuid::Uuid::new_v4().as_bytes(),
        };
        Acquisition::new(&self.inner, &self.keys, req, permit)
            .acquire_until(req.deadline)
            .await
    }

    async fn available(&self, _name: &LockName, permits: u32) -> Result<u32> {
        let call = Call::new("count permits", &SEM_AVAILABLE)
            .key(&self.keys.name)
            .key(&self.keys.sem_timeouts)
            .num(u64::from(permits));
        let reply = self.inner.call(&call).await?;
        if let Some(e) = read_other_kind(&reply, self.keys.name.as_str(), false) {
            return Err(e);
        }
        match reply {
            Value::Int(free) => Ok(u32::try_from(free.max(0)).unwrap_or(u32::MAX)),
            other => Err(unexpected("count permits", other)),
        }
    }
}

/// A permit out of `permits`.
#[derive(Debug)]
pub(crate) struct Permit {
    /// How many permits the handle counts.
    pub(crate) permits: u32,
    /// The permit's id in the timeouts set: 16 random bytes.
    pub(crate) id: [u8; 16],
}

impl Primitive for Permit {
    const KIND: LockKind = LockKind::Permit;

    fn acquire_call<'a>(&'a self, h: &'a Holder, _queue: bool) -> Call<'a> {
        // The expiry and now (ARGV 2 and 3) come from the server's clock.
        Call::new("acquire permit", &SEM_ACQUIRE)
            .key(&h.keys.name)
            .key(&h.keys.sem_timeouts)
            .key(&h.keys.sem_channel)
            .key(&h.keys.token)
            .key(&h.keys.sem_size)
            .num(u64::from(self.permits))
            .arg(b"".as_slice())
            .arg(b"".as_slice())
            .num(h.lease_ms)
            .arg(h.publish.as_bytes())
            .arg(self.id.as_slice())
    }

    fn release_call<'a>(&'a self, h: &'a Holder) -> Call<'a> {
        // Now (ARGV 2) comes from the server's clock.
        Call::new("release permit", &SEM_RELEASE)
            .key(&h.keys.name)
            .key(&h.keys.sem_channel)
            .key(&h.keys.sem_timeouts)
            .arg(self.id.as_slice())
            .arg(b"".as_slice())
            .arg(h.publish.as_bytes())
    }

    fn renew_call<'a>(&'a self, h: &'a Holder, ttl_ms: u64) -> Call<'a> {
        Call::new("renew permit", &SEM_RENEW)
            .key(&h.keys.sem_timeouts)
            .num(ttl_ms)
            .arg(self.id.as_slice())
    }

    fn held_call<'a>(&'a self, h: &'a Holder) -> Call<'a> {
        Call::new("check permit", &HELD)
            .key(&h.keys.sem_timeouts)
            .arg(self.id.as_slice())
            .arg(b"zset".as_slice())
    }

    fn channel(&self, h: &Holder) -> (String, ChannelKind) {
        (h.keys.sem_channel.clone(), ChannelKind::Semaphore)
    }
}
