//! The read-write lock: Redisson's `RReadWriteLock` (scripts in [`scripts::rwlock`]). Each
//! read or write acquisition holds as a hash field of its own; the hash's `mode` says which.
//!
//! [`scripts::rwlock`]: crate::scripts::rwlock

use std::sync::Arc;

use dlock_core::backend::{Mutex, RawReadWriteLock, Request};
use dlock_core::{LockGuard, LockKind, Result, async_trait};

use crate::call::Call;
use crate::keys::Keys;
use crate::primitive::{Acquisition, Holder, Primitive};
use crate::pubsub::{self, ChannelKind};
use crate::scripts::rwlock::{READ_LOCK, READ_RENEW, READ_UNLOCK, WRITE_LOCK, WRITE_UNLOCK};
use crate::shared::Inner;

/// A read-write lock (Redisson `RReadWriteLock` layout).
#[derive(Debug)]
pub struct RedisReadWrite {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: Arc<Keys>,
    /// The field of this handle's latest write hold, for downgrades.
    pub(crate) write_field: Mutex<Option<String>>,
}

#[async_trait]
impl RawReadWriteLock for RedisReadWrite {
    async fn read(&self, req: &Request<'_>, downgrade: bool) -> Result<Option<LockGuard>> {
        let downgrade = if downgrade {
            self.write_field.lock().clone()
        } else {
            None
        };
        Acquisition::new(&self.inner, &self.keys, req, Read { downgrade })
            .acquire_until(req.deadline)
            .await
    }

    async fn write(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        let acq = Acquisition::new(&self.inner, &self.keys, req, Write);
        let field = acq.holder.field.clone();
        let guard = acq.acquire_until(req.deadline).await?;
        if guard.is_some() {
            *self.write_field.lock() = Some(field);
        }
        Ok(guard)
    }
}

/// A read hold.
#[derive(Debug)]
pub(crate) struct Read {
    /// The field of this owner's write hold, if it has one: a read beside it is a downgrade.
    pub(crate) downgrade: Option<String>,
}

impl Primitive for Read {
    const KIND: LockKind = LockKind::Read;

    fn acquire_call<'a>(&'a self, h: &'a Holder, _queue: bool) -> Call<'a> {
        let write = self.downgrade.as_deref().unwrap_or("");
        Call::new("read", &READ_LOCK)
            .key(&h.keys.name)
            .key(h.keys.read_timeouts(&h.field))
            .key(&h.keys.token)
            .num(h.lease_ms)
            .arg(h.field.as_bytes())
            .arg(write.as_bytes())
    }

    fn release_call<'a>(&'a self, h: &'a Holder) -> Call<'a> {
        Call::new("release read", &READ_UNLOCK)
            .key(&h.keys.name)
            .key(&h.keys.rw_channel)
            .key(h.keys.read_timeouts(&h.field))
            .key(&h.keys.rw_prefix)
            .arg(pubsub::UNLOCK.as_bytes())
            .arg(h.field.as_bytes())
            .arg(h.publish.as_bytes())
    }

    fn renew_call<'a>(&'a self, h: &'a Holder, ttl_ms: u64) -> Call<'a> {
        Call::new("renew read", &READ_RENEW)
            .key(&h.keys.name)
            .key(&h.keys.rw_prefix)
            .num(ttl_ms)
            .arg(h.field.as_bytes())
    }

    fn channel(&self, h: &Holder) -> (String, ChannelKind) {
        (h.keys.rw_channel.clone(), ChannelKind::Lock)
    }
}

/// A write hold.
#[derive(Debug)]
pub(crate) struct Write;

impl Primitive for Write {
    const KIND: LockKind = LockKind::Write;

    fn acquire_call<'a>(&'a self, h: &'a Holder, _queue: bool) -> Call<'a> {
        h.field_acquire("write", &WRITE_LOCK)
    }

    fn release_call<'a>(&'a self, h: &'a Holder) -> Call<'a> {
        // Message 1: every waiter may try (readers can all proceed).
        h.field_release(
            "release write",
            &WRITE_UNLOCK,
            &h.keys.rw_channel,
            pubsub::READ_UNLOCK,
        )
    }

    fn channel(&self, h: &Holder) -> (String, ChannelKind) {
        (h.keys.rw_channel.clone(), ChannelKind::Lock)
    }
}
