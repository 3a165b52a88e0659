//! What differs between the primitives. Each is a [`Primitive`]: a small value (a mutex, a
//! fair mutex, a read or write hold, a permit) that names the scripts its acquisition and its
//! hold call, with which keys, and the channel its waiters listen on. One [`Acquisition`] of
//! any of them is driven by one wait loop ([`acquire`](crate::acquire)) and, granted, held by
//! one hold ([`RedisHold`](crate::hold::RedisHold)).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::Request;
use dlock_core::{Lease, LockKind, LockName};
use redis::Script;

use crate::acquire::NO_TTL_RECHECK;
use crate::call::{Call, ms};
use crate::keys::Keys;
use crate::pubsub::ChannelKind;
use crate::scripts;
use crate::shared::Inner;

/// Who holds, and where: what every call of one acquisition names.
#[derive(Debug)]
pub(crate) struct Holder {
    /// The lock's keys, shared by every acquisition of its handle.
    pub(crate) keys: Arc<Keys>,
    /// The acquisition's own hash field, `<client uuid>:<hold id>` (Redisson's
    /// `<client uuid>:<thread id>`).
    pub(crate) field: String,
    /// The lease, in milliseconds.
    pub(crate) lease_ms: u64,
    /// The command a release announces itself with: `spublish` on a cluster with sharded
    /// pub/sub, else `publish`.
    pub(crate) publish: &'static str,
}

impl Holder {
    /// The acquisition of a hold that is one field of the name's hash, counted by the name's
    /// fencing counter (a plain mutex, a write hold). KEYS: name, token. ARGV: lease ms,
    /// field.
    pub(crate) fn field_acquire(&self, what: &'static str, script: &'static Script) -> Call<'_> {
        Call::new(what, script)
            .key(&self.keys.name)
            .key(&self.keys.token)
            .num(self.lease_ms)
            .arg(self.field.as_bytes())
    }

    /// The release of such a hold, announced on `channel` with `message`. KEYS: name,
    /// channel. ARGV: message, lease ms, field, publish command.
    pub(crate) fn field_release<'a>(
        &'a self,
        what: &'static str,
        script: &'static Script,
        channel: &'a str,
        message: &'static str,
    ) -> Call<'a> {
        Call::new(what, script)
            .key(&self.keys.name)
            .key(channel)
            .arg(message.as_bytes())
            .num(self.lease_ms)
            .arg(self.field.as_bytes())
            .arg(self.publish.as_bytes())
    }
}

/// One kind of hold: the calls of its acquisition and its hold, and its waiters' channel.
pub(crate) trait Primitive: fmt::Debug + Send + Sync + 'static {
    /// What a hold of this primitive is.
    const KIND: LockKind;

    /// One try to acquire. `queue`: a fair waiter that cannot take the lock takes a place in
    /// the queue (a try without wait does not).
    fn acquire_call<'a>(&'a self, h: &'a Holder, queue: bool) -> Call<'a>;

    /// The release; its reply is read by [`read_released`](crate::call::read_released).
    fn release_call<'a>(&'a self, h: &'a Holder) -> Call<'a>;

    /// The renewal for `ttl_ms`; its reply is read by [`read_held`](crate::call::read_held).
    /// By default, that of a hold that is one field of the name's hash (a mutex, fair or
    /// write hold).
    fn renew_call<'a>(&'a self, h: &'a Holder, ttl_ms: u64) -> Call<'a> {
        Call::new("renew", &scripts::mutex::RENEW)
            .key(&h.keys.name)
            .num(ttl_ms)
            .arg(h.field.as_bytes())
    }

    /// Whether the store still has the hold (changes nothing); read as a renewal. By
    /// default, whether the hold's field is in the name's hash.
    fn held_call<'a>(&'a self, h: &'a Holder) -> Call<'a> {
        Call::new("check hold", &scripts::HELD)
            .key(&h.keys.name)
            .arg(h.field.as_bytes())
            .arg(b"hash".as_slice())
    }

    /// How a waiter leaves the queue it may have joined, if this primitive queues its
    /// waiters (the fair mutex). By default it queues none: `None`.
    fn leave_call<'a>(&'a self, h: &'a Holder) -> Option<Call<'a>> {
        let _ = h;
        None
    }

    /// The longest a waiter sleeps between two looks, a wake-up message or not (one that
    /// was lost costs at most this). By default [`NO_TTL_RECHECK`].
    fn recheck_within(&self) -> Duration {
        NO_TTL_RECHECK
    }

    /// The channel a waiter listens on, and what its messages mean.
    fn channel(&self, h: &Holder) -> (String, ChannelKind);
}

/// One acquisition of a primitive `P` by a holder of its own. Its wait loop is in
/// [`acquire`](crate::acquire); its release and renewal are in [`hold`](crate::hold).
#[derive(Debug)]
pub(crate) struct Acquisition<P> {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: LockName,
    pub(crate) holder: Holder,
    pub(crate) lease: Lease,
    pub(crate) primitive: P,
    /// Held while an attempt's call runs on a connection of its own (see
    /// [`Inner::call_replicated_to_its_end`]); the undo waits for it, so that it comes after.
    pub(crate) in_flight: Arc<tokio::sync::Mutex<()>>,
}

impl<P: Primitive> Acquisition<P> {
    /// A new acquisition of `primitive` on the lock `keys` names, as a holder of its own.
    pub(crate) fn new(
        inner: &Arc<Inner>,
        keys: &Arc<Keys>,
        req: &Request<'_>,
        primitive: P,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::clone(inner),
            name: req.name.clone(),
            holder: Holder {
                keys: Arc::clone(keys),
                field: inner.next_field(),
                lease_ms: ms(req.options.lease.ttl()),
                publish: inner.publish(),
            },
            lease: req.options.lease,
            primitive,
            in_flight: Arc::new(tokio::sync::Mutex::new(())),
        })
    }
}
