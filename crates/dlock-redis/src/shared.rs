//! What the handles of one provider share: its two connections, its live holds and its
//! client id; how a call goes through them; and the watcher that checks the live holds.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::Result;
use dlock_core::backend::{Batcher, ProviderMeta};
use redis::Value;
use tokio::sync::Notify;

use crate::call::Call;
use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::consts::BACKEND;
use crate::error::from_redis_on;
use crate::holds::{CHECK_EVERY, Holds, Which, check_holds};
use crate::pubsub::Subscriptions;
use crate::replicas::{Ack, Replicas};

/// What the handles of one provider share.
pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) subs: Arc<Subscriptions>,
    /// Redisson's client id: a fresh v4 UUID per client.
    pub(crate) client_id: String,
    pub(crate) meta: ProviderMeta,
    pub(crate) fair_wait: Duration,
    /// The replicas a grant or a renewal waits for (`?wait_replicas=`), and the connections
    /// the waits run on.
    pub(crate) replicas: Arc<Replicas>,
    /// How long an unlock's latch lives (see [`latched`](crate::scripts::latched)), in ms:
    /// past a retry of the release, which comes after the first try's response timeout (and
    /// a reconnection, bounded by the TCP user timeout of twice that).
    pub(crate) latch_ms: u64,
    /// Every live hold of this provider, checked after a disconnection.
    pub(crate) holds: Holds,
    /// The watchdog's renewals of this provider's holds, sent together: one pipeline per
    /// window and 5,000 holds. `None` on a cluster, whose holds' keys lie in many slots
    /// (one pipeline cannot reach them all): each hold renews alone there.
    pub(crate) renewals: Option<Batcher<Call<'static>, Value>>,
    /// The last hold id given out, for hash fields.
    hold_ids: AtomicU64,
    /// Put before every lock name (`key_prefix`).
    pub(crate) key_prefix: String,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisProvider")
            .field("store", &self.meta.store_id)
            .field("client_id", &self.client_id)
            .finish()
    }
}

impl Inner {
    /// The shared state of a provider connected through `conn` and `subs` with `config`,
    /// under a fresh client id and without holds.
    pub(crate) fn new(
        conn: Conn,
        subs: Arc<Subscriptions>,
        meta: ProviderMeta,
        config: &RedisConfig,
    ) -> Self {
        let replicas = Arc::new(Replicas::new(config.wait_replicas, config.response_timeout));
        Self {
            subs,
            client_id: uuid::Uuid::new_v4().to_string(),
            meta,
            fair_wait: config.fair_wait,
            latch_ms: crate::call::ms(
                config
                    .response_timeout
                    .saturating_mul(4)
                    .saturating_add(Duration::from_secs(10)),
            ),
            holds: Holds::new(),
            renewals: (!conn.is_cluster()).then(|| {
                let conn = conn.clone();
                let replicas = Arc::clone(&replicas);
                Batcher::new(BACKEND, move |calls| {
                    renew_all(conn.clone(), Arc::clone(&replicas), calls)
                })
            }),
            replicas,
            conn,
            hold_ids: AtomicU64::new(0),
            key_prefix: config.key_prefix.clone(),
        }
    }

    /// A fresh name for one release and its latch, `<client uuid>:r<id>`: an acquisition can
    /// be released more than once (given back after an ambiguous grant, then granted again
    /// with the same field), and each release must find only its own latch.
    pub(crate) fn next_release(&self) -> String {
        let id = self.hold_ids.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}:r{id}", self.client_id)
    }

    /// A fresh hash field for one hold: `<client uuid>:<hold id>` (Redisson's
    /// `<client uuid>:<thread id>`).
    pub(crate) fn next_field(&self) -> String {
        let id = self.hold_ids.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}:{id}", self.client_id)
    }

    /// The command releases announce themselves with: `spublish` where wake-ups use sharded
    /// pub/sub, else `publish`.
    pub(crate) fn publish(&self) -> &'static str {
        if self.conn.sharded() {
            "spublish"
        } else {
            "publish"
        }
    }

    /// Sends a call and returns its reply.
    pub(crate) async fn call(&self, call: &Call<'_>) -> Result<Value> {
        self.conn.script(call).await
    }

    /// Sends a call whose writes the replicas must acknowledge (`?wait_replicas=`): `WAIT`
    /// follows it, on the same connection of its own, if `wrote` says its reply wrote
    /// something. Returns the reply and what the replicas said.
    pub(crate) async fn call_replicated(
        &self,
        call: &Call<'_>,
        wrote: impl Fn(&Value) -> bool,
    ) -> Result<(Value, Ack)> {
        let Some(wanted) = self.replicas.wanted(&self.conn).await else {
            return Ok((self.call(call).await?, Ack::Enough));
        };
        self.send_replicated(call, wrote, wanted).await
    }

    /// [`call_replicated`](Self::call_replicated) for a call that must reach the server
    /// before whatever its caller sends next, even if the caller stops waiting for it: on a
    /// connection of its own (replicas to wait for), a call dropped in flight could still
    /// run after a later call on the shared connection (an acquisition's undo, which would
    /// then find nothing to undo and leave what the late call did). Such a call runs to its
    /// answer in a task of its own, holding `in_flight` until then, which the undo locks
    /// first. On the shared connection, calls run in the order they were sent.
    pub(crate) async fn call_replicated_to_its_end(
        self: &Arc<Self>,
        call: Call<'_>,
        wrote: fn(&Value) -> bool,
        in_flight: &Arc<tokio::sync::Mutex<()>>,
    ) -> Result<(Value, Ack)> {
        let Some(wanted) = self.replicas.wanted(&self.conn).await else {
            return Ok((self.call(&call).await?, Ack::Enough));
        };
        // Owned only on this path: the task outlives the caller's borrow.
        let call = call.into_owned();
        let held = Arc::clone(in_flight).lock_owned().await;
        let inner = Arc::clone(self);
        let what = call.what;
        tokio::spawn(async move {
            let answer = inner.send_replicated(&call, wrote, wanted).await;
            drop(held);
            answer
        })
        .await
        .map_err(|e| {
            dlock_core::Error::backend_failed(
                BACKEND,
                format!("{what}: the call's task failed: {e}"),
                true,
            )
        })?
    }

    /// Sends `call` on a connection of its own, then `WAIT`s for `wanted` replicas there if
    /// `wrote` says its reply wrote something.
    async fn send_replicated(
        &self,
        call: &Call<'_>,
        wrote: impl Fn(&Value) -> bool,
        wanted: u32,
    ) -> Result<(Value, Ack)> {
        let calls = std::slice::from_ref(call);
        let wrote = |replies: &[redis::RedisResult<Value>]| {
            replies.iter().any(|r| r.as_ref().is_ok_and(&wrote))
        };
        let (mut replies, ack) = self
            .replicas
            .send(&self.conn, call.what, calls, wrote, wanted)
            .await?;
        let reply = replies
            .pop()
            .ok_or_else(|| crate::error::unexpected(call.what, "no reply"))?;
        let reply = reply.map_err(|e| from_redis_on(self.conn.reach(), call.what, e))?;
        Ok((reply, ack))
    }
}

/// The most renewals one pipeline carries: the server runs a pipeline's scripts one after
/// the other before the connection's next command, so a longer one would hold up the
/// provider's acquires and releases (and other clients) for longer.
const RENEW_AT_ONCE: usize = 5_000;

/// Sends a batch of renewals (see [`Inner::renewals`]) in pipelines of [`RENEW_AT_ONCE`],
/// each followed by `WAIT` when the replicas must acknowledge them: each renewal's reply, or
/// its error. A renewal the replicas did not acknowledge fails (retryable), as one sent alone
/// does.
async fn renew_all(
    conn: Conn,
    replicas: Arc<Replicas>,
    calls: Vec<Call<'static>>,
) -> Vec<Result<Value>> {
    let mut answers = Vec::with_capacity(calls.len());
    for chunk in calls.chunks(RENEW_AT_ONCE) {
        answers.extend(renew_chunk(&conn, &replicas, chunk).await);
    }
    answers
}

/// One pipeline of [`renew_all`].
async fn renew_chunk(
    conn: &Conn,
    replicas: &Replicas,
    calls: &[Call<'static>],
) -> Vec<Result<Value>> {
    let renewed = |replies: &[redis::RedisResult<Value>]| {
        replies
            .iter()
            .any(|r| matches!(r, Ok(Value::Int(n)) if *n > 0))
    };
    let sent = match replicas.wanted(conn).await {
        None => conn
            .pipeline("renew", calls)
            .await
            .map(|replies| (replies, Ack::Enough)),
        Some(wanted) => replicas.send(conn, "renew", calls, renewed, wanted).await,
    };
    let (replies, ack) = match sent {
        Ok(answer) => answer,
        Err(e) => return calls.iter().map(|_| Err(e.duplicate())).collect(),
    };
    let reach = conn.reach();
    replies
        .into_iter()
        .map(|reply| {
            let reply = reply.map_err(|e| from_redis_on(reach, "renew", e))?;
            // Only a renewal that renewed waited for the replicas: one that found its hold
            // gone says so at once.
            match ack.error(format_args!("renew")) {
                Some(e) if reply == Value::Int(1) => Err(e),
                _ => Ok(reply),
            }
        })
        .collect()
}

/// Checks the provider's holds after every disconnection, and every [`CHECK_EVERY`] those no
/// renewal asks about as often, until the provider is dropped. While holds are live, the
/// subscription connection is also pinged every [`CHECK_EVERY`]: a connection that broke with
/// nothing to send would otherwise stay broken (the manager reconnects only when used) and
/// report no further disconnection.
pub(crate) async fn watch_disconnects(inner: Weak<Inner>, disconnects: Arc<Notify>) {
    loop {
        let told = tokio::time::timeout(CHECK_EVERY, disconnects.notified()).await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.holds.is_empty() {
            continue;
        }
        let which = if told.is_ok() || inner.subs.ping().await.is_err() {
            Which::All
        } else {
            Which::NotRenewedOften
        };
        check_holds(&inner.conn, &inner.holds, which).await;
    }
}
