//! What the handles of one provider share: its two connections, its live holds and its
//! client id; how a call goes through them; and the watcher that checks the live holds after
//! every disconnection.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Batcher, ProviderMeta};
use dlock_core::{Error, LockName, Result};
use redis::Value;
use tokio::sync::Notify;

use crate::call::Call;
use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::consts::BACKEND;
use crate::error::from_redis_on;
use crate::holds::{Holds, check_holds};
use crate::pubsub::Subscriptions;

/// What the handles of one provider share.
pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) subs: Arc<Subscriptions>,
    /// Redisson's client id: a fresh v4 UUID per client.
    pub(crate) client_id: String,
    pub(crate) meta: ProviderMeta,
    pub(crate) fair_wait: Duration,
    /// Replicas that must acknowledge a grant (`?wait_replicas=`), and how long to wait.
    pub(crate) wait_replicas: u32,
    pub(crate) wait_timeout: Duration,
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
        Self {
            subs,
            client_id: uuid::Uuid::new_v4().to_string(),
            meta,
            fair_wait: config.fair_wait,
            wait_replicas: config.wait_replicas,
            wait_timeout: config.response_timeout / 2,
            latch_ms: crate::call::ms(
                config
                    .response_timeout
                    .saturating_mul(4)
                    .saturating_add(Duration::from_secs(10)),
            ),
            holds: Holds::new(),
            renewals: (!conn.is_cluster()).then(|| {
                let wait = (config.wait_replicas > 0)
                    .then_some((config.wait_replicas, config.response_timeout / 2));
                let conn = conn.clone();
                Batcher::new(BACKEND, move |calls| renew_all(conn.clone(), calls, wait))
            }),
            conn,
            hold_ids: AtomicU64::new(0),
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
        self.conn.script(call.what, &call.invocation()).await
    }

    /// Sends a call; with `?wait_replicas=N`, in one pipeline with `WAIT`. Returns the reply
    /// and how many replicas acknowledged it (0 when not waiting).
    pub(crate) async fn call_then_wait(&self, call: &Call<'_>) -> Result<(Value, u32)> {
        let want = self.wait_replicas;
        if want == 0 {
            return Ok((self.call(call).await?, 0));
        }
        self.conn
            .call_then_wait(call, want, self.wait_timeout)
            .await
    }

    /// Sends a call whose writes must reach the replicas: with `?wait_replicas=N` it fails
    /// (retryable) unless N replicas acknowledged it. A lease the replicas have not seen
    /// extended is not extended, so a failover cannot cut a hold shorter than its holder
    /// believes; a holder whose replicas stay away is lost at its lease end.
    pub(crate) async fn call_replicated(&self, call: &Call<'_>, name: &LockName) -> Result<Value> {
        let want = self.wait_replicas;
        let (reply, acked) = self.call_then_wait(call).await?;
        if acked < want {
            return Err(Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{} of {name:?}: only {acked} of {want} replicas acknowledged it within {:?}",
                    call.what, self.wait_timeout
                ),
                retryable: true,
                source: None,
            });
        }
        Ok(reply)
    }
}

/// The most renewals one pipeline carries: the server runs a pipeline's scripts one after
/// the other before the connection's next command, so a longer one would hold up the
/// provider's acquires and releases (and other clients) for longer.
const RENEW_AT_ONCE: usize = 5_000;

/// Sends a batch of renewals (see [`Inner::renewals`]) in pipelines of [`RENEW_AT_ONCE`],
/// each with `WAIT` after it for `?wait_replicas=`: each renewal's reply, or its error. A
/// renewal the replicas did not acknowledge fails (retryable), as one sent alone does.
async fn renew_all(
    conn: Conn,
    calls: Vec<Call<'static>>,
    wait: Option<(u32, Duration)>,
) -> Vec<Result<Value>> {
    let mut answers = Vec::with_capacity(calls.len());
    for chunk in calls.chunks(RENEW_AT_ONCE) {
        answers.extend(renew_chunk(&conn, chunk, wait).await);
    }
    answers
}

/// One pipeline of [`renew_all`].
async fn renew_chunk(
    conn: &Conn,
    calls: &[Call<'static>],
    wait: Option<(u32, Duration)>,
) -> Vec<Result<Value>> {
    let (replies, acked) = match conn.pipeline("renew", calls, wait).await {
        Ok(answer) => answer,
        Err(e) => return calls.iter().map(|_| Err(e.duplicate())).collect(),
    };
    let reach = conn.reach();
    replies
        .into_iter()
        .map(|reply| {
            let reply = reply.map_err(|e| from_redis_on(reach, "renew", e))?;
            match wait {
                Some((want, timeout)) if acked < want => Err(Error::Backend {
                    backend: BACKEND,
                    message: format!(
                        "renew: only {acked} of {want} replicas acknowledged it within {timeout:?}"
                    ),
                    retryable: true,
                    source: None,
                }),
                _ => Ok(reply),
            }
        })
        .collect()
}

/// How often the watcher wakes without being told of a disconnection: to notice a dropped
/// provider, and to ping the subscription connection while holds are live.
const PING_EVERY: Duration = Duration::from_secs(10);

/// Checks the provider's holds after every disconnection, until the provider is dropped.
/// While holds are live, the subscription connection is also pinged every [`PING_EVERY`]: a
/// connection that broke with nothing to send would otherwise stay broken (the manager
/// reconnects only when used) and report no further disconnection.
pub(crate) async fn watch_disconnects(inner: Weak<Inner>, disconnects: Arc<Notify>) {
    loop {
        let told = tokio::time::timeout(PING_EVERY, disconnects.notified()).await;
        let Some(inner) = inner.upgrade() else { return };
        if told.is_ok() || (!inner.holds.is_empty() && inner.subs.ping().await.is_err()) {
            check_holds(&inner.holds).await;
        }
    }
}
