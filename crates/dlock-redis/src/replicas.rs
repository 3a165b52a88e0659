//! Replica acknowledgement: how many replicas a write waits for ([`WaitReplicas`]), whether
//! the master has a replica to wait for, and the connections the waits run on.
//!
//! `WAIT` counts the writes of the connection it is sent on, and the server reads nothing
//! more from that connection until it answers. So a write that must be acknowledged goes,
//! with its `WAIT`, on a connection of its own, taken from a small pool: a slow replica holds
//! up that write alone, never the provider's other calls. And the `WAIT` follows only a
//! write: an attempt that found the lock busy, or a renewal that found the hold gone, sends
//! none.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::backend::Mutex;
use dlock_core::{Error, Result};
use redis::aio::MultiplexedConnection;
use redis::{RedisError, RedisResult, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::call::{Call, ms};
use crate::config::{WAIT_TIMEOUT, WaitReplicas};
use crate::conn::{Conn, no_script, scripts_of, scripts_pipeline};
use crate::consts::BACKEND;
use crate::error::{from_redis_on, unexpected};

/// The most writes that wait for their replicas at once, each on its own connection; more
/// wait for one of these connections. As many are kept open between waits: a provider
/// busy enough to use them would otherwise open and close a connection per write.
const MAX_WAITING: usize = 32;

/// How long a connection may stay idle and still be used: past it (a server's idle
/// `timeout`, a restart, a `CLIENT KILL` may have closed it meanwhile) it is closed instead.
const MAX_IDLE_FOR: Duration = Duration::from_secs(30);

/// How often `Auto` asks the master about its replicas (`INFO replication`), as Redisson
/// scans its topology, in the background while writes come.
const REPLICAS_EVERY: Duration = Duration::from_secs(1);

/// How old an answer about the replicas may be for a write to go by it: an older one (the
/// provider was idle) is asked again before the write.
const REPLICAS_STALE: Duration = Duration::from_secs(3);

/// The longest since a replica's last acknowledgement of the replication stream (`lag`, in
/// whole seconds; replicas acknowledge every second) for `Auto` to count it in step. A replica
/// that stopped (a pause, a stall) drops out within this long, so waits stop holding up
/// grants and renewals long before the master gives the replica up (`repl-timeout`).
const MAX_LAG_S: u64 = 2;

/// What the replicas said of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ack {
    /// Nothing was to be waited for, or enough replicas acknowledged it.
    Enough,
    /// Fewer than `wanted` replicas acknowledged it within `within`.
    Short {
        acked: u32,
        wanted: u32,
        within: Duration,
    },
}

impl Ack {
    /// The retryable error of a write `what` (of `name`) its replicas did not acknowledge.
    /// `what` is formatted only then: most writes are acknowledged.
    pub(crate) fn error(self, what: fmt::Arguments<'_>) -> Option<Error> {
        match self {
            Self::Enough => None,
            Self::Short {
                acked,
                wanted,
                within,
            } => Some(Error::backend_failed(
                BACKEND,
                format!(
                    "{what}: only {acked} of {wanted} replicas acknowledged it within {within:?}"
                ),
                true,
            )),
        }
    }
}

/// The replica waits of one provider.
pub(crate) struct Replicas {
    policy: WaitReplicas,
    /// How long one `WAIT` waits.
    timeout: Duration,
    /// The response timeout of the connections of its own.
    response_timeout: Duration,
    /// Connections of their own, idle: the master's generation they were opened at, when
    /// they were last used, and the connection.
    idle: Mutex<Vec<(u64, Instant, MultiplexedConnection)>>,
    /// Bounds the connections in use at once.
    in_use: Semaphore,
    /// For `Auto`: whether the master has a replica in step, and when it was last asked.
    in_step: Arc<InStep>,
}

#[derive(Default)]
struct InStep {
    /// Whether the master has a replica in step, as last asked.
    any: AtomicBool,
    /// When the master was last asked.
    asked: Mutex<Option<Instant>>,
    /// Whether a background ask is under way.
    asking: AtomicBool,
    /// Whether the master refused `INFO` or `WAIT`: `Auto` then waits for nothing, for good.
    refused: AtomicBool,
}

/// Clears [`InStep::asking`] however the background ask ends (a runtime shutting down drops
/// it half way).
struct Asking(Arc<InStep>);

impl Drop for Asking {
    fn drop(&mut self) {
        self.0.asking.store(false, Ordering::Release);
    }
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("policy", &self.policy)
            .field("in_step", &self.in_step.any.load(Ordering::Relaxed))
            .finish()
    }
}

impl Replicas {
    /// The replica waits of `policy`, each `WAIT` within half `response_timeout`, and for
    /// `Auto` within [`WAIT_TIMEOUT`] too.
    pub(crate) fn new(policy: WaitReplicas, response_timeout: Duration) -> Self {
        let half = response_timeout / 2;
        Self {
            policy,
            timeout: match policy {
                WaitReplicas::Auto => WAIT_TIMEOUT.min(half),
                WaitReplicas::AtLeast(_) => half,
            },
            response_timeout,
            idle: Mutex::new(Vec::new()),
            in_use: Semaphore::new(MAX_WAITING),
            in_step: Arc::new(InStep::default()),
        }
    }

    /// For `Auto`, asks the master about its replicas now (when the provider connects), so
    /// the first grants wait as later ones do.
    pub(crate) async fn ask(&self, conn: &Conn) {
        if self.policy == WaitReplicas::Auto && !conn.is_cluster() {
            ask_in_step(conn, &self.in_step).await;
        }
    }

    /// How many replicas a write must have acknowledged now; `None`: send no `WAIT`.
    pub(crate) async fn wanted(&self, conn: &Conn) -> Option<u32> {
        match self.policy {
            WaitReplicas::AtLeast(0) => None,
            WaitReplicas::AtLeast(n) => Some(n),
            WaitReplicas::Auto if conn.is_cluster() => None,
            WaitReplicas::Auto => {
                if self.in_step.refused.load(Ordering::Relaxed) {
                    return None;
                }
                self.refresh(conn).await;
                self.in_step.any.load(Ordering::Relaxed).then_some(1)
            }
        }
    }

    /// For `Auto`: asks the master about its replicas again once [`REPLICAS_EVERY`] has
    /// passed since it was last asked: in the background, or first, if the last answer is
    /// older than [`REPLICAS_STALE`].
    async fn refresh(&self, conn: &Conn) {
        let age = self.in_step.asked.lock().map(|at| at.elapsed());
        if age.is_some_and(|age| age < REPLICAS_EVERY) {
            return;
        }
        if age.is_none_or(|age| age >= REPLICAS_STALE) {
            // Boxed: asked about once a period, and this future is part of every grant's.
            Box::pin(ask_in_step(conn, &self.in_step)).await;
            return;
        }
        if self.in_step.asking.swap(true, Ordering::AcqRel) {
            return;
        }
        let asking = Asking(Arc::clone(&self.in_step));
        let conn = conn.clone();
        tokio::spawn(async move {
            ask_in_step(&conn, &asking.0).await;
            drop(asking);
        });
    }

    /// Sends `calls` in one pipeline on a connection of their own, then, if `wrote` says the
    /// replies wrote something, `WAIT` for `wanted` replicas on the same connection (see
    /// [`wanted`](Self::wanted)). Returns each call's reply, and what the replicas said.
    pub(crate) async fn send(
        &self,
        conn: &Conn,
        what: &str,
        calls: &[Call<'_>],
        wrote: impl Fn(&[RedisResult<Value>]) -> bool,
        wanted: u32,
    ) -> Result<(Vec<RedisResult<Value>>, Ack)> {
        let _permit = self
            .in_use
            .acquire()
            .await
            .map_err(|_| unexpected(what, "the replica waits were closed"))?;
        let (generation, mut own, reused) = self.take(conn).await?;
        let mut sent = self.send_on(&mut own, what, calls, &wrote, wanted).await;
        // A kept connection the server closed while it was idle fails at once: once more on
        // a new one (the scripts are safe to send again: a grant found again is answered as
        // repeated and given back).
        if reused && sent.as_ref().is_err_and(RedisError::is_unrecoverable_error) {
            self.idle.lock().clear();
            let (_, fresh) = conn.open_own(self.response_timeout).await?;
            own = fresh;
            sent = self.send_on(&mut own, what, calls, &wrote, wanted).await;
        }
        match sent {
            Ok(answer) => {
                self.put_back(conn, generation, own);
                Ok(answer)
            }
            // `Auto` cannot wait where the master refuses WAIT (an ACL, a server without it):
            // it waits for nothing from then on, as where it cannot ask about replicas.
            Err(e) if self.policy == WaitReplicas::Auto && refused(&e) => {
                self.in_step.refuse("WAIT", &e);
                Err(from_redis_on(conn.reach(), what, e))
            }
            // The connection is not trusted again: a reply may still be on its way.
            Err(e) => {
                conn.after_own_error(&e, generation).await;
                Err(from_redis_on(conn.reach(), what, e))
            }
        }
    }

    async fn send_on(
        &self,
        own: &mut MultiplexedConnection,
        what: &str,
        calls: &[Call<'_>],
        wrote: &impl Fn(&[RedisResult<Value>]) -> bool,
        wanted: u32,
    ) -> RedisResult<(Vec<RedisResult<Value>>, Ack)> {
        let pipe = scripts_pipeline(calls);
        let mut replies: Vec<RedisResult<Value>> = pipe.query_async(own).await?;
        if replies.iter().any(no_script) {
            for script in scripts_of(calls) {
                script.prepare_invoke().load_async(own).await?;
            }
            replies = pipe.query_async(own).await?;
        }
        if replies.len() != calls.len() {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a pipeline's replies",
                format!("{what}: {} replies to {} calls", replies.len(), calls.len()),
            )));
        }
        if !wrote(&replies) {
            return Ok((replies, Ack::Enough));
        }
        let acked: i64 = redis::cmd("WAIT")
            .arg(wanted)
            .arg(ms(self.timeout))
            .query_async(own)
            .await?;
        let acked = u32::try_from(acked).unwrap_or(0);
        let ack = if acked >= wanted {
            Ack::Enough
        } else {
            Ack::Short {
                acked,
                wanted,
                within: self.timeout,
            }
        };
        Ok((replies, ack))
    }

    /// An idle connection of the current master (and `true`), or a new one.
    async fn take(&self, conn: &Conn) -> Result<(u64, MultiplexedConnection, bool)> {
        let current = conn.generation();
        loop {
            let Some((generation, used, own)) = self.idle.lock().pop() else {
                break;
            };
            if generation == current && used.elapsed() < MAX_IDLE_FOR {
                return Ok((generation, own, true));
            }
        }
        let (generation, own) = conn.open_own(self.response_timeout).await?;
        Ok((generation, own, false))
    }

    fn put_back(&self, conn: &Conn, generation: u64, own: MultiplexedConnection) {
        let mut idle = self.idle.lock();
        if generation == conn.generation() && idle.len() < MAX_WAITING {
            idle.push((generation, Instant::now(), own));
        }
    }
}

impl InStep {
    /// The master refused `command`: `Auto` waits for nothing from now on, said once.
    fn refuse(&self, command: &str, e: &dyn std::fmt::Display) {
        self.any.store(false, Ordering::Relaxed);
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, "redis: the master refuses {command}; wait_replicas=auto waits for no replica (grants a failover can lose); allow it, or set wait_replicas=0 to say so");
        }
    }
}

/// Whether the server refused a command for good (an ACL, a command it does not have), as
/// opposed to failing to answer or refusing it for now (a master demoted to a replica
/// refuses `WAIT` too).
fn refused(e: &RedisError) -> bool {
    match e.kind() {
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => true,
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => e
            .detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("unknown command")),
        _ => false,
    }
}

/// Asks the master whether it has a replica in step (`INFO replication`) and records the
/// answer. A master that does not answer keeps the last answer; one that refuses `INFO` (an
/// ACL user without it) counts as having none: `Auto` cannot tell, and sends no `WAIT`.
async fn ask_in_step(conn: &Conn, in_step: &InStep) {
    *in_step.asked.lock() = Some(Instant::now());
    match conn.info("replication").await {
        Ok(info) => in_step.any.store(any_in_step(&info), Ordering::Relaxed),
        Err(e) if !e.is_retryable() => in_step.refuse("INFO replication", &e),
        Err(e) => tracing::debug!(error = %e, "INFO replication failed; asking again later"),
    }
}

/// Whether `INFO replication` names a replica that is online and acknowledged the stream
/// within [`MAX_LAG_S`] (`slaveN:ip=…,port=…,state=online,offset=…,lag=0`).
fn any_in_step(info: &str) -> bool {
    info.lines().any(|line| {
        let Some((key, fields)) = line.trim().split_once(':') else {
            return false;
        };
        let replica = key
            .strip_prefix("slave")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !replica {
            return false;
        }
        let field = |name: &str| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        };
        field("state") == Some("online")
            && field("lag")
                .and_then(|lag| lag.parse::<u64>().ok())
                .is_some_and(|lag| lag <= MAX_LAG_S)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_is_in_step_when_online_and_recently_heard() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
                    slave0:ip=127.0.0.1,port=6391,state=online,offset=1000,lag=7\r\n\
                    slave1:ip=127.0.0.1,port=6392,state=online,offset=1000,lag=1\r\n";
        assert!(any_in_step(info));
        assert!(!any_in_step(&info.replace("lag=1", "lag=3")));
        assert!(!any_in_step(&info.replace("lag=1", "lag=1x")));
        assert!(!any_in_step(&info.replace(
            "state=online,offset=1000,lag=1",
            "state=wait_bgsave,lag=0"
        )));
        assert!(!any_in_step(
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"
        ));
        assert!(!any_in_step(
            "slave_read_only:1\r\nslave_repl_offset:5\r\nslave0:state=online,lag=0x\r\n"
        ));
    }
}
