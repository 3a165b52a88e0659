//! The two connections of a provider: one multiplexed connection for commands and scripts,
//! and one RESP3 connection for subscriptions. Both reconnect by themselves.

use std::fmt;
use std::time::Duration;

use dlock_core::Result;
use redis::aio::{AsyncPushSender, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, FromRedisValue, IntoConnectionInfo, ProtocolVersion, ScriptInvocation, ToRedisArgs,
};

use crate::config::RedisConfig;
use crate::error::from_redis;

/// One connection, to a single server or to a cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "Conn::Single",
            Self::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl Conn {
    /// Connects; with `push`, the connection speaks RESP3 and hands pushed messages to it.
    pub(crate) async fn connect(
        config: &RedisConfig,
        push: Option<impl AsyncPushSender + Clone>,
    ) -> Result<Self> {
        let what = format!("connect to {}", config.url);
        let mut info = config
            .url
            .expose()
            .clone()
            .into_connection_info()
            .map_err(|e| from_redis(&what, e))?;
        // Dead peers are noticed even on a connection that only listens (the subscription
        // connection): keepalive probes after 15 s of silence, and on Linux a connection whose
        // data stays unacknowledged past twice the response timeout is dropped, so the
        // connection manager reconnects (review H4: a half-open connection used to be trusted
        // for good).
        let tcp = info.tcp_settings().clone().set_keepalive(
            socket2::TcpKeepalive::new()
                .with_time(std::time::Duration::from_secs(15))
                .with_interval(std::time::Duration::from_secs(5)),
        );
        #[cfg(target_os = "linux")]
        let tcp = tcp.set_user_timeout(config.response_timeout.saturating_mul(2));
        info = info.set_tcp_settings(tcp.clone());
        if push.is_some() {
            let redis = info
                .redis_settings()
                .clone()
                .set_protocol(ProtocolVersion::RESP3);
            info = info.set_redis_settings(redis);
        }
        if config.cluster {
            let mut builder = ClusterClientBuilder::new(vec![info])
                .tcp_settings(tcp)
                .response_timeout(config.response_timeout)
                .connection_timeout(config.response_timeout)
                .retries(3);
            if let Some(push) = push {
                builder = builder
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(push);
            }
            let client = builder.build().map_err(|e| from_redis(&what, e))?;
            let conn = client
                .get_async_connection()
                .await
                .map_err(|e| from_redis(&what, e))?;
            Ok(Self::Cluster(conn))
        } else {
            let client = Client::open(info).map_err(|e| from_redis(&what, e))?;
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
        let result = match self.clone() {
            Self::Single(mut c) => invocation.invoke_async(&mut c).await,
            Self::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        };
        result.map_err(|e| from_redis(what, e))
    }

    /// Whether this is a cluster connection; a cluster uses sharded pub/sub (SPUBLISH and
    /// SSUBSCRIBE), as Redisson does on Redis 7.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// `WAIT replicas timeout`: how many replicas acknowledged every write sent on this
    /// connection so far (on a multiplexed connection, everyone's writes: a superset of ours).
    pub(crate) async fn wait_replicas(&self, replicas: u32, timeout: Duration) -> Result<u32> {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let result: redis::RedisResult<u32> = match self.clone() {
            Self::Single(mut c) => {
                redis::cmd("WAIT")
                    .arg(replicas)
                    .arg(ms)
                    .query_async(&mut c)
                    .await
            }
            Self::Cluster(_) => {
                return Err(dlock_core::Error::unsupported(
                    crate::BACKEND,
                    "wait_replicas on a Redis Cluster",
                ));
            }
        };
        result.map_err(|e| from_redis("wait for replicas", e))
    }

    /// A PING on this connection.
    pub(crate) async fn ping(&self) -> Result<()> {
        let result: redis::RedisResult<String> = match self.clone() {
            Self::Single(mut c) => redis::cmd("PING").query_async(&mut c).await,
            Self::Cluster(mut c) => redis::cmd("PING").query_async(&mut c).await,
        };
        result.map(|_| ()).map_err(|e| from_redis("ping", e))
    }

    pub(crate) async fn subscribe(&self, channel: impl ToRedisArgs) -> Result<()> {
        let result = match self.clone() {
            Self::Single(mut c) => c.subscribe(channel).await,
            Self::Cluster(mut c) => c.ssubscribe(channel).await,
        };
        result.map_err(|e| from_redis("subscribe", e))
    }

    pub(crate) async fn unsubscribe(&self, channel: impl ToRedisArgs) -> Result<()> {
        let result = match self.clone() {
            Self::Single(mut c) => c.unsubscribe(channel).await,
            Self::Cluster(mut c) => c.sunsubscribe(channel).await,
        };
        result.map_err(|e| from_redis("unsubscribe", e))
    }
}
