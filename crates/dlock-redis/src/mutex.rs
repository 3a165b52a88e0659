//! The mutex: Redisson's `RLock` / `RFencedLock`, or `RFairLock` when fair (scripts in
//! [`scripts::mutex`]). Every acquisition holds as a hash field of its own.
//!
//! [`scripts::mutex`]: crate::scripts::mutex

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{RawLock, Request};
use dlock_core::{LockGuard, LockKind, Result, async_trait};

use crate::acquire::NO_TTL_RECHECK;
use crate::call::Call;
use crate::keys::Keys;
use crate::primitive::{Acquisition, Holder, Primitive};
use crate::pubsub::{self, ChannelKind};
use crate::scripts::mutex::{FAIR_LEAVE, FAIR_LOCK, FAIR_TRY, FAIR_UNLOCK, LOCK, UNLOCK};
use crate::shared::Inner;

/// A mutex (Redisson `RLock` / `RFencedLock`, or `RFairLock` when fair).
#[derive(Debug)]
pub struct RedisMutex {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: Arc<Keys>,
}

#[async_trait]
impl RawLock for RedisMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        if req.options.fair {
            let fair = Fair {
                wait_ms: crate::call::ms(self.inner.fair_wait),
            };
            Acquisition::new(&self.inner, &self.keys, req, fair)
                .acquire_until(req.deadline)
                .await
        } else {
            Acquisition::new(&self.inner, &self.keys, req, Plain)
                .acquire_until(req.deadline)
                .await
        }
    }
}

/// A hold of a plain (not fair) mutex.
#[derive(Debug)]
pub(crate) struct Plain;

impl Primitive for Plain {
    const KIND: LockKind = LockKind::Mutex;

    fn acquire_call<'a>(&'a self, h: &'a Holder, _queue: bool) -> Call<'a> {
        h.field_acquire("acquire", &LOCK)
    }

    fn release_call<'a>(&'a self, h: &'a Holder) -> Call<'a> {
        h.field_release("release", &UNLOCK, &h.keys.channel, pubsub::UNLOCK)
    }

    fn channel(&self, h: &Holder) -> (String, ChannelKind) {
        (h.keys.channel.clone(), ChannelKind::Lock)
    }
}

/// A hold of a fair mutex: waiters queue in Redisson's queue and timeouts set, and each is
/// woken on a channel of its own when its turn comes.
#[derive(Debug)]
pub(crate) struct Fair {
    /// How long a queued waiter has to take its turn before the others skip it, in ms.
    pub(crate) wait_ms: u64,
}

impl Primitive for Fair {
    const KIND: LockKind = LockKind::Mutex;

    /// A third of the wait: each look moves the waiter's deadline on by the wait, so a live
    /// waiter looks before the others may skip it.
    fn recheck_within(&self) -> Duration {
        Duration::from_millis(self.wait_ms / 3).min(NO_TTL_RECHECK)
    }

    fn acquire_call<'a>(&'a self, h: &'a Holder, queue: bool) -> Call<'a> {
        let script = if queue { &*FAIR_LOCK } else { &*FAIR_TRY };
        // ARGV[4] (now) is set by the script from the server's clock.
        Call::new("acquire", script)
            .key(&h.keys.name)
            .key(&h.keys.queue)
            .key(&h.keys.timeouts)
            .key(&h.keys.token)
            .num(h.lease_ms)
            .arg(h.field.as_bytes())
            .num(self.wait_ms)
            .arg(b"".as_slice())
    }

    fn release_call<'a>(&'a self, h: &'a Holder) -> Call<'a> {
        // ARGV[4] (now) is set by the script from the server's clock.
        Call::new("release", &FAIR_UNLOCK)
            .key(&h.keys.name)
            .key(&h.keys.queue)
            .key(&h.keys.timeouts)
            .key(&h.keys.channel)
            .arg(pubsub::UNLOCK.as_bytes())
            .num(h.lease_ms)
            .arg(h.field.as_bytes())
            .arg(b"".as_slice())
            .arg(h.publish.as_bytes())
    }

    fn leave_call<'a>(&'a self, h: &'a Holder) -> Option<Call<'a>> {
        Some(
            Call::new("leave queue", &FAIR_LEAVE)
                .key(&h.keys.queue)
                .key(&h.keys.timeouts)
                .key(&h.keys.name)
                .key(&h.keys.channel)
                .arg(h.field.as_bytes())
                .num(self.wait_ms)
                .arg(pubsub::UNLOCK.as_bytes())
                .arg(h.publish.as_bytes()),
        )
    }

    fn channel(&self, h: &Holder) -> (String, ChannelKind) {
        (h.keys.waiter_channel(&h.field), ChannelKind::Lock)
    }
}

/// The two scripts of an uncontended mutex cycle, for measuring the raw floor of a cycle
/// (`dlock bench` runs them with plain redis-rs). Not API-stable.
pub mod raw {
    /// Acquire: KEYS `name`, `redisson_lock_token:{name}`; ARGV lease ms, field.
    pub fn lock_script() -> &'static redis::Script {
        &super::LOCK
    }

    /// Release: KEYS `name`, `redisson_lock__channel:{name}`,
    /// `redisson_unlock_latch:{name}:<request id>` (a key of each release's own: its answer
    /// stays there for the latch's time); ARGV `0`, lease ms, field, `publish`, the latch's
    /// time in ms.
    pub fn unlock_script() -> &'static redis::Script {
        &super::UNLOCK
    }
}
