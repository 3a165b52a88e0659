//! The connection to a master found through Redis Sentinel: resolved when it connects,
//! asked for again after an error that says the master moved and every second besides, and
//! moved, both of its connections, when the master did.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Result;
use dlock_core::backend::Mutex;
use redis::aio::{AsyncPushSender, ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Client, ConnectionAddr, ErrorKind, IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind,
    RedisError, ServerErrorKind,
};
use tokio::time::Instant;

use crate::config::{RedisConfig, SentinelConfig};
use crate::error::from_redis;

/// The connection to a master found through Redis Sentinel. redis-rs's connection manager
/// reconnects to one fixed address; after a failover that address is a replica or gone, so
/// the Sentinels are asked again on an error that says so, and every [`SENTINEL_POLL`]
/// besides; if the master moved, a new manager to the new master replaces the old one.
pub(crate) struct Sentinelled {
    resolver: tokio::sync::Mutex<Resolver>,
    /// The current master's manager, and how many times the master moved.
    current: Mutex<(u64, ConnectionManager)>,
    /// A client of the current master, with the generation it belongs to: the replica
    /// waits' connections are opened from it.
    client: Mutex<(u64, Client)>,
    /// The current master's address.
    pub(crate) master: Mutex<String>,
    /// A connection of its own to the Sentinels, for the cheap question of the poll.
    asker: tokio::sync::Mutex<Asker>,
    manager: ConnectionManagerConfig,
    timeout: Duration,
    /// Told when the master moved (the subscription connection: its waiters re-subscribe and
    /// the provider checks its holds, as after any disconnection).
    on_move: Option<Arc<dyn AsyncPushSender>>,
}

/// Asks the Sentinels for the master's address alone (`GET-MASTER-ADDR-BY-NAME`) over one
/// kept connection: the poll's question, cheap enough to ask every second. Only a changed
/// answer makes the resolver ask again the way it connects (every master checked by `ROLE`
/// over a new connection).
struct Asker {
    /// One client per Sentinel, in the URL's order.
    sentinels: Vec<Client>,
    /// The master's name.
    master: String,
    /// The connection kept, and to which Sentinel.
    conn: Option<(usize, redis::aio::MultiplexedConnection)>,
}

impl Asker {
    /// The master's `host:port` as the first Sentinel that answers names it; `None` if none
    /// does within `timeout` each.
    async fn master(&mut self, timeout: Duration) -> Option<String> {
        let start = self.conn.as_ref().map_or(0, |(i, _)| *i);
        for k in 0..self.sentinels.len() {
            let i = (start + k) % self.sentinels.len();
            let conn = match self.conn.take() {
                Some((j, c)) if j == i => c,
                _ => {
                    let client = self.sentinels.get(i)?;
                    match tokio::time::timeout(timeout, client.get_multiplexed_async_connection())
                        .await
                    {
                        Ok(Ok(c)) => c,
                        _ => continue,
                    }
                }
            };
            let mut ask = redis::cmd("SENTINEL");
            ask.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.master);
            let mut c = conn.clone();
            let answer =
                tokio::time::timeout(timeout, ask.query_async::<Vec<String>>(&mut c)).await;
            if let Ok(Ok(addr)) = answer
                && let [host, port] = addr.as_slice()
            {
                self.conn = Some((i, conn));
                return Some(format!("{host}:{port}"));
            }
        }
        None
    }
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

/// How often the Sentinels are asked where the master is when no call failed: an old master
/// that stalled past `down-after` (a fork, swap, a paused VM) and resumed answers over its
/// old connections as if nothing happened, granting locks the new master also grants until
/// the Sentinels turn it into a replica; only the Sentinels can say it was replaced. Redisson
/// asks them as often.
const SENTINEL_POLL: Duration = Duration::from_secs(1);

impl Sentinelled {
    pub(crate) async fn connect(
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
            SentinelClientBuilder::new(addrs.clone(), &sentinel.master, SentinelServerType::Master)
                .map_err(err)?
                .set_client_to_redis_db(redis.db())
                .set_client_to_redis_tcp_settings(tcp.clone())
                .set_client_to_sentinel_tcp_settings(tcp.clone());
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
        let mut sentinels = Vec::new();
        for addr in &addrs {
            let mut redis = redis::RedisConnectionInfo::default();
            if let Some(auth) = &sentinel.auth {
                if let Some(user) = &auth.username {
                    redis = redis.set_username(user);
                }
                redis = redis.set_password(&auth.password);
            }
            // The poll's connections to the Sentinels have the provider's TCP settings too
            // (keepalive, the user timeout, `nodelay`).
            let info = addr
                .clone()
                .into_connection_info()
                .map_err(err)?
                .set_redis_settings(redis)
                .set_tcp_settings(tcp.clone());
            sentinels.push(Client::open(info).map_err(err)?);
        }
        let asker = Asker {
            sentinels,
            master: sentinel.master.clone(),
            conn: None,
        };
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
                master: master.clone(),
                asked: Instant::now(),
            }),
            current: Mutex::new((0, conn)),
            client: Mutex::new((0, found)),
            master: Mutex::new(master),
            asker: tokio::sync::Mutex::new(asker),
            manager,
            timeout,
            on_move: push,
        })
    }

    pub(crate) fn current(&self) -> (u64, ConnectionManager) {
        self.current.lock().clone()
    }

    /// A client of the current master, and the master's generation.
    pub(crate) fn client(&self) -> (u64, Client) {
        self.client.lock().clone()
    }

    /// Asks the Sentinels where the master is every [`SENTINEL_POLL`], for as long as the
    /// connection lives, on the runtime that connected it; moves if the answer changed.
    pub(crate) fn poll(this: &Arc<Self>) {
        let weak = Arc::downgrade(this);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SENTINEL_POLL).await;
                let Some(s) = weak.upgrade() else {
                    return;
                };
                let generation = s.current().0;
                let named = s.asker.lock().await.master(s.timeout).await;
                if named.is_some_and(|named| named != *s.master.lock()) {
                    let _ = tokio::time::timeout(s.timeout, s.relocate(generation)).await;
                }
            }
        });
    }

    /// After a failed command: if the error says the master may have moved (the connection
    /// failed, or the server is now a replica), asks the Sentinels, within the response
    /// timeout. The command itself is not retried here; its caller decides.
    pub(crate) async fn after_error(&self, e: &RedisError, generation: u64) {
        let moved = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if moved {
            // Boxed: the relocation (a connection to the Sentinels, then to the master) is
            // rare and its future large, and this one is part of every call's future.
            let relocate = Box::pin(self.relocate(generation));
            let _ = tokio::time::timeout(self.timeout, relocate).await;
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
        resolver.master.clone_from(&master);
        *self.current.lock() = (generation + 1, conn);
        *self.client.lock() = (generation + 1, client);
        *self.master.lock() = master;
        if let Some(tell) = &self.on_move {
            let _ = tell.send(PushInfo {
                kind: PushKind::Disconnection,
                data: Vec::new(),
            });
        }
    }
}
