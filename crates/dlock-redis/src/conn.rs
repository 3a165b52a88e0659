//! The two connections of a provider: one multiplexed connection for commands and scripts,
//! and one RESP3 connection for subscriptions. Both reconnect by themselves.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::Mutex;
use dlock_core::{Error, Result, TlsFiles};
use redis::aio::{AsyncPushSender, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Client, ConnectionAddr, ErrorKind, FromRedisValue, IntoConnectionInfo, ProtocolVersion,
    PushInfo, PushKind, RedisError, ScriptInvocation, ServerErrorKind, Value,
};
use redis::{ClientTlsConfig, TlsCertificates};
use tokio::time::Instant;

use crate::call::{Call, ms};
use crate::config::{PubSubMode, RedisConfig, SentinelConfig};
use crate::error::{Reach, from_redis, from_redis_on};

/// One connection, to a single server, to a cluster, or to the master Sentinel names.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    /// A cluster connection, and whether it uses sharded pub/sub.
    Cluster(ClusterConnection, bool),
    Sentinel(Arc<Sentinelled>),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "Conn::Single",
            Self::Cluster(..) => "Conn::Cluster",
            Self::Sentinel(_) => "Conn::Sentinel",
        })
    }
}

/// Runs one command on whichever connection `conn` is: `$single` with `$c` bound to a single
/// server's connection manager (for Sentinel, the current master's, relocated after an error
/// that says the master may have moved), `$cluster` with `$c` bound to the cluster connection.
macro_rules! on_conn {
    ($conn:expr, |$c:ident| $single:expr, |$cc:ident| $cluster:expr) => {
        match $conn.clone() {
            Conn::Single(mut $c) => $single,
            Conn::Cluster(mut $cc, _) => $cluster,
            Conn::Sentinel(s) => {
                let (generation, mut $c) = s.current();
                let result = $single;
                if let Err(e) = &result {
                    s.after_error(e, generation).await;
                }
                result
            }
        }
    };
}

/// The connection to a master found through Redis Sentinel. redis-rs's connection manager
/// reconnects to one fixed address; after a failover that address is a replica or gone, so
/// on an error that says so the Sentinels are asked again and, if the master moved, a new
/// manager to the new master replaces the old one.
pub(crate) struct Sentinelled {
    resolver: tokio::sync::Mutex<Resolver>,
    /// The current master's manager, and how many times the master moved.
    current: Mutex<(u64, ConnectionManager)>,
    manager: ConnectionManagerConfig,
    timeout: Duration,
    /// Told when the master moved (the subscription connection: its waiters re-subscribe and
    /// the provider checks its holds, as after any disconnection).
    on_move: Option<Arc<dyn AsyncPushSender>>,
}

struct Resolver {
    client: SentinelClient,
    /// The master's address, as the Sentinels last gave it.
    master: String,
    /// When the Sentinels were last asked (asked at most every [`RELOOKUP`]).
    asked: Instant,
}

/// The shortest time between two lookups of the master.
const RELOOKUP: Duration = Duration::from_millis(100);

impl Sentinelled {
    async fn connect(
        config: &RedisConfig,
        sentinel: &SentinelConfig,
        tcp: TcpSettings,
        manager: ConnectionManagerConfig,
        push: Option<Arc<dyn AsyncPushSender>>,
    ) -> Result<Self> {
        let what = format!("connect to {}", config.store_id());
        let err = |e| from_redis(&what, e);
        let mut addrs = Vec::new();
        for s in &sentinel.sentinels {
            // `host:port` from parse_host_list; a [v6] host keeps its brackets.
            let (host, port) = s.rsplit_once(':').unwrap_or((s.as_str(), "26379"));
            let host = host.trim_start_matches('[').trim_end_matches(']');
            addrs.push(ConnectionAddr::Tcp(
                host.to_owned(),
                port.parse().unwrap_or(crate::config::DEFAULT_SENTINEL_PORT),
            ));
        }
        let info = config
            .url
            .expose()
            .clone()
            .into_connection_info()
            .map_err(err)?;
        let redis = info.redis_settings();
        let mut builder =
            SentinelClientBuilder::new(addrs, &sentinel.master, SentinelServerType::Master)
                .map_err(err)?
                .set_client_to_redis_db(redis.db())
                .set_client_to_redis_tcp_settings(tcp.clone())
                .set_client_to_sentinel_tcp_settings(tcp);
        if let Some(user) = redis.username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = redis.password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if push.is_some() {
            builder = builder.set_client_to_redis_protocol(ProtocolVersion::RESP3);
        }
        if let Some(auth) = &sentinel.auth {
            if let Some(user) = &auth.username {
                builder = builder.set_client_to_sentinel_username(user);
            }
            builder = builder.set_client_to_sentinel_password(&auth.password);
        }
        let mut client = builder.build().map_err(err)?;
        let timeout = config.response_timeout;
        let found = tokio::time::timeout(timeout.saturating_mul(2), client.async_get_client())
            .await
            .map_err(|_| {
                dlock_core::Error::connection(
                    crate::consts::BACKEND,
                    format!("{what}: no Sentinel named the master within {timeout:?}"),
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                )
            })?
            .map_err(err)?;
        let master = found.get_connection_info().addr().to_string();
        let conn = found
            .get_connection_manager_with_config(manager.clone())
            .await
            .map_err(err)?;
        Ok(Self {
            resolver: tokio::sync::Mutex::new(Resolver {
                client,
                master,
                asked: Instant::now(),
            }),
            current: Mutex::new((0, conn)),
            manager,
            timeout,
            on_move: push,
        })
    }

    fn current(&self) -> (u64, ConnectionManager) {
        self.current.lock().clone()
    }

    /// After a failed command: if the error says the master may have moved (the connection
    /// failed, or the server is now a replica), asks the Sentinels, within the response
    /// timeout. The command itself is not retried here; its caller decides.
    async fn after_error(&self, e: &RedisError, generation: u64) {
        let moved = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if moved {
            let _ = tokio::time::timeout(self.timeout, self.relocate(generation)).await;
        }
    }

    /// Asks the Sentinels where the master is; if it moved since `generation`, switches to
    /// it. Cancel safe: the switch is one assignment, after the new manager is connected.
    async fn relocate(&self, generation: u64) {
        let mut resolver = self.resolver.lock().await;
        if self.current().0 != generation || resolver.asked.elapsed() < RELOOKUP {
            return;
        }
        resolver.asked = Instant::now();
        let client = match resolver.client.async_get_client().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "redis sentinel: no master named");
                return;
            }
        };
        let master = client.get_connection_info().addr().to_string();
        if master == resolver.master {
            return;
        }
        let conn = match client
            .get_connection_manager_with_config(self.manager.clone())
            .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(%master, error = %e, "redis sentinel: new master not reachable");
                return;
            }
        };
        tracing::warn!(from = %resolver.master, to = %master, "redis sentinel: the master moved");
        resolver.master = master;
        *self.current.lock() = (generation + 1, conn);
        if let Some(tell) = &self.on_move {
            let _ = tell.send(PushInfo {
                kind: PushKind::Disconnection,
                data: Vec::new(),
            });
        }
    }
}

impl Conn {
    /// Connects; with `push`, the connection speaks RESP3 and hands pushed messages to it.
    pub(crate) async fn connect(
        config: &RedisConfig,
        push: Option<impl AsyncPushSender + Clone>,
    ) -> Result<Self> {
        let what = format!("connect to {}", config.url);
        let mut info = match &config.client {
            Some(client) => client.0.clone(),
            None => config
                .url
                .expose()
                .clone()
                .into_connection_info()
                .map_err(|e| from_redis(&what, e))?,
        };
        // Dead peers are noticed even on a connection that only listens (the subscription
        // connection): keepalive probes after 15 s of silence, and on Linux a connection whose
        // data stays unacknowledged past twice the response timeout is dropped, so the
        // connection manager reconnects instead of trusting a half-open connection.
        // TCP_NODELAY: a multiplexed connection under concurrency must not wait for delayed
        // ACKs (redis-rs leaves Nagle on).
        // An application's own client keeps its keepalive and user timeout if it set them.
        let own = info.tcp_settings().clone();
        let mut tcp = own.clone().set_nodelay(true);
        if own.keepalive().is_none() {
            tcp = tcp.set_keepalive(
                socket2::TcpKeepalive::new()
                    .with_time(std::time::Duration::from_secs(15))
                    .with_interval(std::time::Duration::from_secs(5)),
            );
        }
        #[cfg(target_os = "linux")]
        if own.user_timeout().is_none() {
            tcp = tcp.set_user_timeout(config.response_timeout.saturating_mul(2));
        }
        info = info.set_tcp_settings(tcp.clone());
        if push.is_some() {
            let redis = info
                .redis_settings()
                .clone()
                .set_protocol(ProtocolVersion::RESP3);
            info = info.set_redis_settings(redis);
        }
        if let Some(sentinel) = &config.sentinel {
            let mut manager = ConnectionManagerConfig::new()
                .set_response_timeout(Some(config.response_timeout))
                .set_connection_timeout(Some(config.response_timeout))
                .set_number_of_retries(2);
            let push: Option<Arc<dyn AsyncPushSender>> = match push {
                Some(push) => {
                    manager = manager
                        .set_push_sender(push.clone())
                        .set_automatic_resubscription();
                    Some(Arc::new(push))
                }
                None => None,
            };
            let conn = Sentinelled::connect(config, sentinel, tcp, manager, push).await?;
            return Ok(Self::Sentinel(Arc::new(conn)));
        }
        let certs = tls_certificates(&config.tls)?;
        if config.cluster {
            let mut builder = ClusterClientBuilder::new(vec![info])
                .tcp_settings(tcp)
                .response_timeout(config.response_timeout)
                .connection_timeout(config.response_timeout)
                .retries(3);
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            if let Some(push) = push {
                builder = builder
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(push);
            }
            let client = builder.build().map_err(|e| from_redis(&what, e))?;
            let mut conn = client
                .get_async_connection()
                .await
                .map_err(|e| from_redis(&what, e))?;
            let sharded = match config.pubsub {
                PubSubMode::Sharded => true,
                PubSubMode::Classic => false,
                // Redisson's probe: a cluster that knows `PUBSUB SHARDNUMSUB` (Redis 7+) has
                // sharded pub/sub. Any error (an unknown subcommand) means it has not.
                // Only a server that does not know the subcommand means classic; any other
                // error (a node away, a timeout) fails the connect, to be tried again, rather
                // than fix the provider on classic for good.
                _ => {
                    let probe: redis::RedisResult<Value> = redis::cmd("PUBSUB")
                        .arg("SHARDNUMSUB")
                        .query_async(&mut conn)
                        .await;
                    match probe {
                        Ok(_) => true,
                        Err(e) if e.to_string().to_ascii_lowercase().contains("unknown") => {
                            tracing::debug!(error = %e, "no sharded pub/sub: using PUBLISH/SUBSCRIBE");
                            false
                        }
                        Err(e) => return Err(from_redis(&what, e)),
                    }
                }
            };
            Ok(Self::Cluster(conn, sharded))
        } else {
            let client = match certs {
                // The files were read; what the client library refuses in them (a PEM it
                // cannot decode) is the configuration's fault, not the network's.
                Some(certs) => Client::build_with_tls(info, certs).map_err(|e| Error::Config {
                    message: format!("{what}: the TLS files of the URL: {e}"),
                    source: Some(Box::new(e)),
                })?,
                None => Client::open(info).map_err(|e| from_redis(&what, e))?,
            };
            let mut manager = ConnectionManagerConfig::new()
                .set_response_timeout(Some(config.response_timeout))
                .set_connection_timeout(Some(config.response_timeout))
                .set_number_of_retries(2);
            if let Some(push) = push {
                manager = manager.set_push_sender(push).set_automatic_resubscription();
            }
            let conn = client
                .get_connection_manager_with_config(manager)
                .await
                .map_err(|e| from_redis(&what, e))?;
            Ok(Self::Single(conn))
        }
    }

    /// Runs a script (EVALSHA, loading it on NOSCRIPT).
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        what: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let result = on_conn!(self, |c| invocation.invoke_async(&mut c).await, |c| {
            invocation.invoke_async(&mut c).await
        });
        result.map_err(|e| from_redis_on(self.reach(), what, e))
    }

    /// What this connection reaches, for the meaning of a `READONLY` answer.
    fn reach(&self) -> Reach {
        match self {
            Self::Single(_) => Reach::Single,
            Self::Cluster(..) | Self::Sentinel(_) => Reach::FollowsFailovers,
        }
    }

    /// Whether this is a cluster connection.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(..))
    }

    /// Whether wake-ups use sharded pub/sub (SPUBLISH and SSUBSCRIBE): a cluster that has it,
    /// unless told otherwise ([`PubSubMode`]), as Redisson does.
    pub(crate) fn sharded(&self) -> bool {
        matches!(self, Self::Cluster(_, true))
    }

    /// Sends a call and `WAIT replicas timeout` in one pipeline: the reply, and how many
    /// replicas acknowledged the call's writes. One pipeline is one write on one connection,
    /// so a reconnect (or, with Sentinel, a move to a new master) cannot fall between the two
    /// and make `WAIT` count a fresh connection's writes (none) instead of the call's.
    pub(crate) async fn call_then_wait(
        &self,
        call: &Call<'_>,
        replicas: u32,
        timeout: Duration,
    ) -> Result<(Value, u32)> {
        if self.is_cluster() {
            return Err(dlock_core::Error::unsupported(
                crate::consts::BACKEND,
                "wait_replicas on a Redis Cluster",
            ));
        }
        let what = call.what;
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(call.script.get_hash()).arg(call.keys.len());
        for key in &call.keys {
            evalsha.arg(key.as_ref());
        }
        for arg in &call.args {
            evalsha.arg(arg.as_ref());
        }
        let mut pipe = redis::pipe();
        pipe.add_command(evalsha)
            .cmd("WAIT")
            .arg(replicas)
            .arg(ms(timeout));
        let mut loaded = false;
        loop {
            let result: redis::RedisResult<(Value, u32)> =
                on_conn!(self, |c| pipe.query_async(&mut c).await, |c| pipe
                    .query_async(&mut c)
                    .await);
            match result {
                // The script did not run (the server does not know it yet): load it, once.
                Err(e) if !loaded && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    loaded = true;
                    let invocation = call.script.prepare_invoke();
                    let load: redis::RedisResult<String> =
                        on_conn!(self, |c| invocation.load_async(&mut c).await, |c| {
                            invocation.load_async(&mut c).await
                        });
                    load.map_err(|e| from_redis_on(self.reach(), what, e))?;
                }
                other => return other.map_err(|e| from_redis_on(self.reach(), what, e)),
            }
        }
    }

    /// A PING on this connection.
    pub(crate) async fn ping(&self) -> Result<()> {
        let result: redis::RedisResult<String> = on_conn!(
            self,
            |c| redis::cmd("PING").query_async(&mut c).await,
            |c| redis::cmd("PING").query_async(&mut c).await
        );
        result.map(|_| ()).map_err(|e| from_redis("ping", e))
    }

    /// Subscribes to `channel` (SSUBSCRIBE where wake-ups use sharded pub/sub).
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<()> {
        self.subscription(channel, true).await
    }

    /// Unsubscribes from `channel` (SUNSUBSCRIBE where wake-ups use sharded pub/sub).
    pub(crate) async fn unsubscribe(&self, channel: &str) -> Result<()> {
        self.subscription(channel, false).await
    }

    async fn subscription(&self, channel: &str, subscribe: bool) -> Result<()> {
        let sharded = self.sharded();
        let result = on_conn!(
            self,
            |c| if subscribe {
                c.subscribe(channel).await
            } else {
                c.unsubscribe(channel).await
            },
            |c| match (subscribe, sharded) {
                (true, true) => c.ssubscribe(channel).await,
                (true, false) => c.subscribe(channel).await,
                (false, true) => c.sunsubscribe(channel).await,
                (false, false) => c.unsubscribe(channel).await,
            }
        );
        let what = if subscribe {
            "subscribe"
        } else {
            "unsubscribe"
        };
        result.map_err(|e| from_redis(what, e))
    }
}

/// The certificates of a `rediss://` URL's `ca_file`, `cert_file` and `key_file`, read now so a
/// missing file is an [`Error::Config`] naming it; `None` when it names none (the system's
/// roots, no client certificate).
fn tls_certificates(tls: &TlsFiles) -> Result<Option<TlsCertificates>> {
    if tls.is_empty() {
        return Ok(None);
    }
    Ok(Some(TlsCertificates {
        client_tls: tls
            .read_identity()?
            .map(|(client_cert, client_key)| ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: tls.read_ca()?,
    }))
}
