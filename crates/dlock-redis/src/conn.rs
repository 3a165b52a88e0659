//! The two connections of a provider: one multiplexed connection for commands and scripts,
//! and one RESP3 connection for subscriptions. Both reconnect by themselves.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, Result, TlsFiles};
use redis::aio::{
    AsyncPushSender, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::io::tcp::TcpSettings;
use redis::{
    AsyncConnectionConfig, Client, ErrorKind, IntoConnectionInfo, ProtocolVersion, RedisError,
    ServerErrorKind, Value,
};
use redis::{ClientTlsConfig, TlsCertificates};

use crate::call::Call;
use crate::config::{PubSubMode, RedisConfig};
use crate::error::{Reach, from_redis, from_redis_on};
use crate::sentinel::Sentinelled;

/// One connection, to a single server, to a cluster, or to the master Sentinel names.
#[derive(Clone)]
pub(crate) enum Conn {
    /// A single server's connection manager, and the client it came from.
    Single(ConnectionManager, Arc<Client>),
    /// A cluster connection, and whether it uses sharded pub/sub.
    Cluster(ClusterConnection, bool),
    Sentinel(Arc<Sentinelled>),
}

/// One pipeline of the `EVALSHA`s of `calls`, each answered on its own (an error in one does
/// not fail the others).
pub(crate) fn scripts_pipeline(calls: &[Call<'_>]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for call in calls {
        pipe.add_command(evalsha(call));
    }
    pipe
}

/// The scripts of `calls`, each once.
pub(crate) fn scripts_of<'a>(calls: &[Call<'a>]) -> Vec<&'static redis::Script> {
    let mut scripts: Vec<&'static redis::Script> = Vec::new();
    for call in calls {
        if !scripts
            .iter()
            .any(|s| s.get_hash() == call.script.get_hash())
        {
            scripts.push(call.script);
        }
    }
    scripts
}

/// Whether a reply says the server did not know the script.
pub(crate) fn no_script(reply: &redis::RedisResult<Value>) -> bool {
    reply
        .as_ref()
        .is_err_and(|e| e.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
}

/// The `EVALSHA` command of a call.
fn evalsha(call: &Call<'_>) -> redis::Cmd {
    let args = 3 + call.keys.len() + call.args.len();
    // The keys and arguments, `EVALSHA`, the script's SHA1 (40 hex digits) and the key count.
    let bytes = call.keys.iter().map(|k| k.len()).sum::<usize>()
        + call.args.iter().map(|a| a.len()).sum::<usize>()
        + 7
        + 40
        + 20;
    let mut evalsha = redis::Cmd::with_capacity(args, bytes);
    evalsha.arg("EVALSHA");
    evalsha.arg(call.script.get_hash()).arg(call.keys.len());
    for key in &call.keys {
        evalsha.arg(key.as_ref());
    }
    for arg in &call.args {
        evalsha.arg(arg.as_ref());
    }
    evalsha
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Single(..) => "Conn::Single",
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
            Conn::Single(mut $c, _) => $single,
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
        let tcp = tcp_settings(config, info.tcp_settings());
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
            let conn = Arc::new(Sentinelled::connect(config, sentinel, tcp, manager, push).await?);
            Sentinelled::poll(&conn);
            return Ok(Self::Sentinel(conn));
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
                // Redisson's probe: a cluster that answers `PUBSUB SHARDNUMSUB` (Redis 7+)
                // has sharded pub/sub; one that refuses it (an unknown subcommand, a user the
                // ACL does not let run it, a service that disabled it) is used as Redisson
                // uses it then, with PUBLISH/SUBSCRIBE. No answer at all (a node away, a
                // timeout, a cluster still forming) fails the connect, to be tried again,
                // rather than fix the provider on classic for good.
                _ => {
                    // On one node: asked of all of them, the client merges the answers as
                    // maps and reports a node's refusal as a malformed answer instead.
                    let mut probe = redis::cmd("PUBSUB");
                    probe.arg("SHARDNUMSUB");
                    let one = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                    let probe = conn
                        .route_command(probe, one)
                        .await
                        .and_then(Value::extract_error);
                    match probe {
                        Ok(_) => true,
                        Err(e) if refused(&e) => {
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
                Some(certs) => Client::build_with_tls(info, certs).map_err(|e| {
                    Error::config_caused(format!("{what}: the TLS files of the URL: {e}"), e)
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
            Ok(Self::Single(conn, Arc::new(client)))
        }
    }

    /// Runs a call's script: `EVALSHA`, and on `NOSCRIPT` (a server that restarted, or whose
    /// scripts were flushed) `SCRIPT LOAD` and the `EVALSHA` again. The command is built once
    /// per call, straight from its keys and arguments, and reused for the resend.
    pub(crate) async fn script(&self, call: &Call<'_>) -> Result<Value> {
        let evalsha = evalsha(call);
        let send = || async {
            let result: redis::RedisResult<Value> =
                on_conn!(self, |c| evalsha.query_async(&mut c).await, |c| {
                    evalsha.query_async(&mut c).await
                });
            result
        };
        let mut result = send().await;
        if no_script(&result) {
            self.load(call.what, call.script).await?;
            result = send().await;
        }
        result.map_err(|e| from_redis_on(self.reach(), call.what, e))
    }

    /// Loads `script` (`SCRIPT LOAD`; on a cluster, on every node), for a call `what` that
    /// met `NOSCRIPT`.
    async fn load(&self, what: &str, script: &redis::Script) -> Result<()> {
        let invocation = script.prepare_invoke();
        let load: redis::RedisResult<String> =
            on_conn!(self, |c| invocation.load_async(&mut c).await, |c| {
                invocation.load_async(&mut c).await
            });
        load.map(drop)
            .map_err(|e| from_redis_on(self.reach(), what, e))
    }

    /// What this connection reaches, for the meaning of a `READONLY` answer.
    pub(crate) fn reach(&self) -> Reach {
        match self {
            Self::Single(..) => Reach::Single,
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

    /// The address (`host:port`) of the master the Sentinels named last; `None` without
    /// Sentinel.
    pub(crate) fn sentinel_master(&self) -> Option<String> {
        match self {
            Self::Sentinel(s) => Some(s.master.lock().clone()),
            _ => None,
        }
    }

    /// Sends `calls` in one pipeline: the reply of each call, or the error it met. If the
    /// server did not know a script, the scripts are loaded and the whole pipeline is sent
    /// once more: the calls must be safe to repeat (renewals and checks are).
    pub(crate) async fn pipeline(
        &self,
        what: &str,
        calls: &[Call<'_>],
    ) -> Result<Vec<redis::RedisResult<Value>>> {
        if self.is_cluster() {
            return Err(dlock_core::Error::unsupported(
                crate::consts::BACKEND,
                "pipelines of scripts on a Redis Cluster (keys in many slots)",
            ));
        }
        let pipe = scripts_pipeline(calls);
        let mut loaded = false;
        loop {
            let replies = self
                .query_pipeline(&pipe)
                .await
                .map_err(|e| from_redis_on(self.reach(), what, e))?;
            if !loaded && replies.iter().any(no_script) {
                loaded = true;
                for script in scripts_of(calls) {
                    self.load(what, script).await?;
                }
                continue;
            }
            if replies.len() != calls.len() {
                return Err(crate::error::unexpected(
                    what,
                    format!("{} replies to {} calls", replies.len(), calls.len()),
                ));
            }
            return Ok(replies);
        }
    }

    /// Opens a connection of its own to the server (with Sentinel, to the current master, and
    /// the master's generation): for writes whose `WAIT` must not hold up the provider's other
    /// calls. Refused on a cluster.
    pub(crate) async fn open_own(&self, timeout: Duration) -> Result<(u64, MultiplexedConnection)> {
        let (generation, client) = match self {
            Self::Single(_, client) => (0, Client::clone(client)),
            Self::Sentinel(s) => s.client(),
            Self::Cluster(..) => {
                return Err(dlock_core::Error::unsupported(
                    crate::consts::BACKEND,
                    "a connection of its own on a Redis Cluster",
                ));
            }
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| from_redis_on(self.reach(), "connect for WAIT", e))?;
        Ok((generation, conn))
    }

    /// After a failed call on a connection of its own, opened at `generation`: with Sentinel,
    /// as after a failed call on the provider's connection (the master may have moved).
    pub(crate) async fn after_own_error(&self, e: &RedisError, generation: u64) {
        if let Self::Sentinel(s) = self {
            s.after_error(e, generation).await;
        }
    }

    /// Sends `pipe` (whose commands' errors come back one by one). With Sentinel, an error
    /// of the whole pipeline, or a `READONLY` answer to one of its commands, makes the
    /// connection ask where the master is now.
    async fn query_pipeline(
        &self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
        match self.clone() {
            Self::Single(mut c, _) => pipe.query_async(&mut c).await,
            Self::Cluster(mut c, _) => pipe.query_async(&mut c).await,
            Self::Sentinel(s) => {
                let (generation, mut c) = s.current();
                let result: redis::RedisResult<Vec<redis::RedisResult<Value>>> =
                    pipe.query_async(&mut c).await;
                let read_only = |r: &redis::RedisResult<Value>| {
                    r.as_ref()
                        .is_err_and(|e| e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly))
                };
                match &result {
                    Err(e) => s.after_error(e, generation).await,
                    Ok(replies) => {
                        if let Some(Err(e)) = replies.iter().find(|r| read_only(r)) {
                            s.after_error(e, generation).await;
                        }
                    }
                }
                result
            }
        }
    }

    /// How many times the master moved (Sentinel); 0 for a single server.
    pub(crate) fn generation(&self) -> u64 {
        match self {
            Self::Sentinel(s) => s.current().0,
            _ => 0,
        }
    }

    /// The server's `INFO section` (on a single server, or the current master).
    pub(crate) async fn info(&self, section: &str) -> Result<String> {
        let result: redis::RedisResult<String> = on_conn!(
            self,
            |c| redis::cmd("INFO").arg(section).query_async(&mut c).await,
            |c| redis::cmd("INFO").arg(section).query_async(&mut c).await
        );
        result.map_err(|e| from_redis_on(self.reach(), "INFO", e))
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

    /// Refuses a server older than [`MIN_REDIS`] (on a cluster, any primary that is), asking
    /// `INFO server` once. A server that refuses INFO (an ACL user without it, a service that
    /// disabled it) is not checked: its version is unknown, not old.
    pub(crate) async fn check_version(&self, store: &str) -> Result<()> {
        let info: redis::RedisResult<Value> = on_conn!(
            self,
            |c| redis::cmd("INFO").arg("server").query_async(&mut c).await,
            |c| redis::cmd("INFO")
                .arg("server")
                .query_async::<Value>(&mut c)
                .await
                .and_then(Value::extract_error)
        );
        match info {
            Ok(info) => version_supported(&info, store),
            Err(e) if refused(&e) => {
                tracing::debug!(store, error = %e, "INFO refused: the server's version is not checked");
                Ok(())
            }
            Err(e) => Err(from_redis(&format!("connect to {store}"), e)),
        }
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

/// The oldest Redis dlock runs on, as (major, minor): the subscription connection speaks
/// RESP3 (`HELLO 3`, Redis 6), and the scripts write after reading `TIME`, which needs
/// replication of a script's effects rather than its text (the default since Redis 5).
pub(crate) const MIN_REDIS: (u64, u64) = (6, 0);

/// Whether the server answered `e` to refuse the command itself (unknown, not allowed for
/// this user, disabled), as opposed to not answering, or answering "not now" (a cluster
/// forming, a dataset loading): asking again will get the same refusal.
fn refused(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::NoPerm | ServerErrorKind::ResponseError)
            | ErrorKind::Extension
    )
}

/// `Ok` unless an `INFO server` answer names a `redis_version` older than [`MIN_REDIS`]: then
/// an [`Error::Unsupported`] naming the version found and the minimum (upgrading the server is
/// the only cure, so it is not retryable). A cluster answers one text per primary; the oldest
/// counts. An answer that names no version (a server that is not Redis but speaks its
/// protocol) is let through.
fn version_supported(info: &Value, store: &str) -> Result<()> {
    let mut texts = Vec::new();
    collect_texts(info, &mut texts);
    let oldest = texts
        .iter()
        .filter_map(|t| {
            t.lines()
                .find_map(|l| l.trim().strip_prefix("redis_version:"))
                .map(str::trim)
        })
        .filter_map(|v| Some((parse_version(v)?, v)))
        .min_by_key(|(parsed, _)| *parsed);
    match oldest {
        Some((found, text)) if found < MIN_REDIS => Err(Error::unsupported(
            crate::consts::BACKEND,
            format!(
                "Redis {text} at {store}: dlock needs Redis {}.{} or newer (RESP3 \
                 subscriptions, and scripts whose effects are replicated)",
                MIN_REDIS.0, MIN_REDIS.1
            ),
        )),
        _ => Ok(()),
    }
}

/// Every text in `value` (a string, or the strings of a map or array, as a cluster answers).
fn collect_texts(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::BulkString(b) => into.push(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => into.push(s.clone()),
        Value::VerbatimString { text, .. } => into.push(text.clone()),
        Value::Array(items) | Value::Set(items) => {
            items.iter().for_each(|v| collect_texts(v, into));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| collect_texts(v, into)),
        _ => {}
    }
}

/// The major and minor number of a version such as `7.2.4` or `8.0-m01`; `None` if it does
/// not start with two numbers.
fn parse_version(text: &str) -> Option<(u64, u64)> {
    let mut parts = text.split('.');
    let number = |part: Option<&str>| -> Option<u64> {
        let part = part?;
        let digits = part
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(part.len());
        part.get(..digits)?.parse().ok()
    };
    Some((number(parts.next())?, number(parts.next())?))
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

/// The TCP settings of dlock's connections, from `own` (the application's client's, or
/// redis-rs's defaults).
///
/// Dead peers are noticed even on a connection that only listens (the subscription
/// connection): keepalive probes after 15 s of silence, and on Linux a connection whose data
/// stays unacknowledged past twice the response timeout is dropped, so the connection manager
/// reconnects instead of trusting a half-open connection; a client that set either keeps its
/// own. `TCP_NODELAY` as [`RedisConfig::nodelay`] says (on by default): a multiplexed
/// connection under concurrency must not hold a command back until the answer to the one
/// before it.
fn tcp_settings(config: &RedisConfig, own: &TcpSettings) -> TcpSettings {
    let mut tcp = own.clone().set_nodelay(config.nodelay);
    if own.keepalive().is_none() {
        tcp = tcp.set_keepalive(
            socket2::TcpKeepalive::new()
                .with_time(Duration::from_secs(15))
                .with_interval(Duration::from_secs(5)),
        );
    }
    #[cfg(target_os = "linux")]
    if own.user_timeout().is_none() {
        tcp = tcp.set_user_timeout(config.response_timeout.saturating_mul(2));
    }
    tcp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(version: &str) -> Value {
        Value::BulkString(
            format!("# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n")
                .into_bytes(),
        )
    }

    /// `TCP_NODELAY` is set unless `nodelay=false` turns it off, whatever the client's (or
    /// redis-rs's) default; keepalive is added where the client set none.
    #[test]
    fn tcp_nodelay_follows_the_config() {
        let on = RedisConfig::from_url("redis://h").unwrap();
        let off = RedisConfig::from_url("redis://h?nodelay=false").unwrap();
        for own in [false, true] {
            let own = TcpSettings::default().set_nodelay(own);
            let tcp = tcp_settings(&on, &own);
            assert!(tcp.nodelay());
            assert!(tcp.keepalive().is_some());
            assert!(!tcp_settings(&off, &own).nodelay());
        }
    }

    #[test]
    fn versions_parse_by_major_and_minor() {
        assert_eq!(parse_version("7.2.4"), Some((7, 2)));
        assert_eq!(parse_version("6.0.0"), Some((6, 0)));
        assert_eq!(parse_version("8.0-m01"), Some((8, 0)));
        assert_eq!(parse_version("255.255.255"), Some((255, 255)));
        assert_eq!(parse_version("5"), None);
        assert_eq!(parse_version("x.y"), None);
        assert_eq!(parse_version(""), None);
    }

    /// A server older than the minimum is refused, for good, with both versions named.
    #[test]
    fn an_old_server_is_refused_naming_its_version_and_the_minimum() {
        for old in ["5.0.14", "4.0.9", "3.2.12", "2.8.24"] {
            let err = version_supported(&info(old), "redis://h:1").unwrap_err();
            assert!(matches!(err, Error::Unsupported { .. }), "{old}: {err:?}");
            assert!(!err.is_retryable(), "{old}: an upgrade is the only cure");
            let text = err.to_string();
            assert!(text.contains(old) && text.contains("6.0"), "{text}");
            assert!(text.contains("redis://h:1"), "{text}");
        }
    }

    #[test]
    fn a_supported_or_unknown_server_passes() {
        for new in ["6.0.0", "6.2.14", "7.0.15", "7.2.4", "8.0.2"] {
            assert!(version_supported(&info(new), "s").is_ok(), "{new}");
        }
        // RESP3 answers INFO with a verbatim string.
        let verbatim = Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: "redis_version:7.4.1\r\n".to_owned(),
        };
        assert!(version_supported(&verbatim, "s").is_ok());
        // No version named (a server that only speaks the protocol): not refused.
        let none = Value::BulkString(b"# Server\r\nsome_server:1.0\r\n".to_vec());
        assert!(version_supported(&none, "s").is_ok());
        assert!(version_supported(&Value::Nil, "s").is_ok());
    }

    /// A cluster answers one text per primary: one old primary is enough to refuse.
    #[test]
    fn the_oldest_primary_of_a_cluster_counts() {
        let node = |n: &str| Value::SimpleString(n.to_owned());
        let cluster = Value::Map(vec![
            (node("a:1"), info("7.2.4")),
            (node("b:2"), info("5.0.7")),
            (node("c:3"), info("7.0.0")),
        ]);
        let err = version_supported(&cluster, "s").unwrap_err();
        assert!(err.to_string().contains("5.0.7"), "{err}");
        let fine = Value::Map(vec![
            (node("a:1"), info("7.2.4")),
            (node("b:2"), info("6.2.0")),
        ]);
        assert!(version_supported(&fine, "s").is_ok());
    }

    /// Only a refusal of the command itself says "not available"; no answer, or "not now",
    /// says nothing about the server.
    #[test]
    fn refusals_are_told_from_failures_to_answer() {
        let server = |kind: ServerErrorKind| RedisError::from((ErrorKind::Server(kind), "x"));
        assert!(refused(&server(ServerErrorKind::NoPerm)));
        assert!(refused(&server(ServerErrorKind::ResponseError)));
        assert!(refused(&redis::make_extension_error(
            "DISABLED".to_owned(),
            None
        )));
        assert!(!refused(&server(ServerErrorKind::ClusterDown)));
        assert!(!refused(&server(ServerErrorKind::TryAgain)));
        assert!(!refused(&server(ServerErrorKind::BusyLoading)));
        assert!(!refused(&RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
        assert!(!refused(&RedisError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut
        ))));
    }
}
