//! `redis://` and `rediss://` URLs and the builder.

use std::time::Duration;

use dlock_core::backend::{parse_host_list, percent_decode};
use dlock_core::{Error, RedactedUrl, Result, TlsFiles};

/// How to reach Redis. Build it from a URL with [`RedisConfig::from_url`] or field by field;
/// `Debug` and `Display` never show the password.
///
/// URL: `redis[s]://[[user]:password@]host[:port][/db][?cluster=true&timeout_ms=N]`, or for a
/// master watched by Redis Sentinel,
/// `redis+sentinel://[[user]:password@]sentinel[:port][,sentinel[:port]...]/master-name[/db][?...]`
/// (Sentinels default to port 26379; the credentials and the database are the master's;
/// Sentinels that require a password of their own get it from `sentinel_password` and, for an
/// ACL user, `sentinel_username`).
///
/// | query parameter | meaning | default |
/// | --- | --- | --- |
/// | `cluster` | `true`: the host is a seed of a Redis Cluster | `false` |
/// | `timeout_ms` | response timeout of each server call, in milliseconds | `5000` |
/// | `fair_wait_ms` | how long a queued fair waiter that stopped looking keeps its turn (Redisson's `fairLockWaitTimeout`, which Redisson peers of one queue must share; at least 1 s and twice `timeout_ms`) | `300000` |
/// | `wait_replicas` | replicas that must acknowledge a grant or a renewal (`WAIT`): `auto` (at least one while the master has a replica in step, as Redisson), a number (at least that many; not on a cluster), or `0` (none); see [`WaitReplicas`] | `auto` |
/// | `sentinel_username`, `sentinel_password` | credentials for the Sentinels themselves (`redis+sentinel://` only; the URL's own are the master's) | none |
/// | `ca_file`, `cert_file`, `key_file` | `rediss://` only: the authority to trust instead of the system's roots, and a client certificate and key; PEM files, read on connect ([`TlsFiles`], the policy of every backend) | none |
/// | `pubsub` | a cluster's wake-up messages: `sharded` (SPUBLISH/SSUBSCRIBE, Redis 7+), `classic` (PUBLISH/SUBSCRIBE) or `auto` (sharded where the cluster has it); see [`PubSubMode`] | `auto` |
/// | `nodelay` | `true`: set `TCP_NODELAY` on dlock's connections, so that a command goes out at once even while an earlier one on the shared connection is unanswered; `false`: leave Nagle's algorithm on, so that the commands written meanwhile go out together once that one is answered (less CPU a command with the server on the same host, up to a round trip more for them on a network); see [`nodelay`](Self::nodelay) | `true` |
/// | `key_prefix` | put before every lock name, so that applications sharing one server keep apart (`key_prefix=billing:` keeps lock `nightly` at key `billing:nightly`); as a Redisson `NameMapper` that prefixes names; no `{` or `}` | none |
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The server URL as given, less dlock's own query parameters.
    pub url: RedactedUrl,
    /// Whether the URL names a seed node of a Redis Cluster.
    pub cluster: bool,
    /// Response timeout of each server call.
    pub response_timeout: Duration,
    /// How long a queued fair waiter has to take its turn (Redisson's `fairLockWaitTimeout`).
    pub fair_wait: Duration,
    /// Replicas that must acknowledge a grant before `acquire` returns it, and a renewal
    /// before it extends the hold (see [`WaitReplicas`]). The default, `Auto`, waits for one
    /// replica while the master has one in step, and for nothing on a master without.
    pub wait_replicas: WaitReplicas,
    /// How a cluster carries wake-up messages; a single server (and Sentinel) always uses
    /// PUBLISH/SUBSCRIBE, as Redisson does.
    pub pubsub: PubSubMode,
    /// The Sentinels to ask for the master, from a `redis+sentinel://` URL; `None` for a
    /// plain server or a cluster.
    pub sentinel: Option<SentinelConfig>,
    /// For `rediss://`: the authority to trust instead of the operating system's roots, and
    /// the client's certificate (`ca_file`, `cert_file`, `key_file`); empty: the system's
    /// roots, no client certificate.
    pub tls: TlsFiles,
    /// Put before every lock name (`key_prefix`): lock `nightly` lives at key
    /// `billing:nightly` with the prefix `billing:`, as a Redisson client with a `NameMapper`
    /// that adds it keeps it. Empty: none.
    pub key_prefix: String,
    /// Whether dlock's connections set `TCP_NODELAY` (`nodelay`); on by default. With it, a
    /// command goes out as soon as a task writes it. Without it (Nagle's algorithm), a
    /// command written while an earlier one on the provider's shared connection is
    /// unanswered waits for that answer and goes out with every other command written
    /// meanwhile: on a network that holds each such command back by up to a round trip;
    /// with the server on the same host it saves a write and the server's read per command
    /// (the loopback's round trip is nearly free). Redis answers each command as it runs it,
    /// and `WAIT` runs on connections of its own, so a command of dlock's that fits in a
    /// segment never waits for the server's delayed ACK either way. On with
    /// [`from_client`](Self::from_client) too, whatever the client's own setting.
    pub nodelay: bool,
    /// The application's own client, from [`RedisConfig::from_client`]: its address,
    /// credentials and TLS settings are used instead of the URL's.
    pub(crate) client: Option<ClientInfo>,
}

/// How a Redis Cluster carries the wake-up messages of releases (the `pubsub` URL parameter).
///
/// Waiters and releasers must agree, Java ones included: Redisson (3.22 and later) uses
/// sharded pub/sub on a cluster that has it (`shardedSubscriptionMode` AUTO, the default), and
/// classic pub/sub on older servers, older Redisson or `shardedSubscriptionMode=OFF`. A
/// mismatch costs no safety, only speed: a waiter that misses a message wakes at the
/// holder's expiry or at its own recheck (at most 5 s).
///
/// | mode | commands | for |
/// | --- | --- | --- |
/// | `Auto` | sharded if the cluster answers `PUBSUB SHARDNUMSUB`, classic if not | the default, as Redisson |
/// | `Sharded` | SPUBLISH / SSUBSCRIBE (Redis 7+) | a Redis 7 cluster shared with Redisson 3.22+ |
/// | `Classic` | PUBLISH / SUBSCRIBE (broadcast to every node) | Redis 6 clusters, or Java clients with `shardedSubscriptionMode=OFF` |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PubSubMode {
    /// Sharded where the cluster supports it (Redis 7+), classic where it does not.
    #[default]
    Auto,
    /// SPUBLISH and SSUBSCRIBE.
    Sharded,
    /// PUBLISH and SUBSCRIBE.
    Classic,
}

impl std::str::FromStr for PubSubMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "sharded" => Ok(Self::Sharded),
            "classic" => Ok(Self::Classic),
            other => Err(Error::config(format!(
                "pubsub={other:?}: expected auto, sharded or classic"
            ))),
        }
    }
}

/// How many replicas must acknowledge a write before dlock counts on it (the `wait_replicas`
/// URL parameter: `auto`, or a number).
///
/// A grant the replicas have not seen can be lost in a failover, and the promoted replica
/// then hands the lock (and an equal fencing token) to someone else while its first holder
/// still works. dlock sends `WAIT` after each grant and each renewal that wrote: a grant
/// fewer replicas acknowledged is given back and tried again (until the acquire's deadline),
/// and a renewal they did not acknowledge does not extend the hold. The wait is bounded by
/// half the response timeout (and for `Auto` by [`WAIT_TIMEOUT`]), and runs on a connection
/// of its own, so a slow replica never holds up the calls on the provider's command
/// connection.
///
/// | setting | waits for | promises |
/// | --- | --- | --- |
/// | `Auto` (default) | one replica, while the master has one online that acknowledged its stream within the last 2 s (`INFO replication`, asked every second while writes come, and before a write if the last answer is over 3 s old); nothing on a master without such a replica, on one that refuses `INFO` or `WAIT` (with a warning), and on a cluster | as Redisson's `checkLockSyncedSlaves`: a failover to a replica in step keeps every grant; a grant made while no replica was in step, or before the provider learnt of a new one, can still be lost. A replica that is alive but behind stays in step by this measure: grants wait for it (and are tried again) until it catches up or the master drops it |
/// | `AtLeast(n)` | `n` replicas; a grant or renewal fewer acknowledged fails until they do | a failover to any of the `n` keeps every grant; one slow replica stalls grants and lets holds end at their lease. Single server or Sentinel only: refused on a cluster |
/// | `AtLeast(0)` | nothing | a failover can lose any grant of the last replication lag |
///
/// `WAIT` is not `WAITAOF`: a master that restarts from its own disk with `appendfsync
/// everysec` can still lose the last second of grants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitReplicas {
    /// One replica, while the master has one in step; nothing otherwise.
    #[default]
    Auto,
    /// At least this many replicas (`0`: never wait).
    AtLeast(u32),
}

impl From<u32> for WaitReplicas {
    fn from(n: u32) -> Self {
        Self::AtLeast(n)
    }
}

impl std::str::FromStr for WaitReplicas {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        s.parse().map(Self::AtLeast).map_err(|_| {
            Error::config(format!(
                "wait_replicas={s:?}: expected auto or a number of replicas"
            ))
        })
    }
}

/// The longest a grant or a renewal waits for its replicas with [`WaitReplicas::Auto`]
/// (Redisson's default `slavesSyncTimeout`); at most half the response timeout.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(1);

/// A client's connection settings, kept out of `Debug` (they hold the password).
#[derive(Clone)]
pub(crate) struct ClientInfo(pub(crate) redis::ConnectionInfo);

impl std::fmt::Debug for ClientInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientInfo({})", self.0.addr())
    }
}

/// Where a master watched by Redis Sentinel is found: the Sentinels and the master's name.
///
/// dlock asks the Sentinels for the master's address when it connects, and again whenever
/// the master stops answering or answers as a replica (after a failover); every hold of the
/// provider is then checked on the new master and the ones that did not survive are
/// reported lost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentinelConfig {
    /// The Sentinels, as `host:port`, asked in order.
    pub sentinels: Vec<String>,
    /// The master's name (`sentinel monitor <name> ...` in the Sentinels' configuration).
    pub master: String,
    /// The Sentinels' own credentials (`sentinel_username`, `sentinel_password`), if they
    /// require any.
    pub(crate) auth: Option<SentinelAuth>,
}

/// Credentials for the Sentinels; `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelAuth {
    pub(crate) username: Option<String>,
    pub(crate) password: String,
}

impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelAuth")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

/// The port Sentinels listen on unless the URL says otherwise.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// The default fair-lock wait, Redisson's `fairLockWaitTimeout`: how long a queued waiter
/// that stopped looking (it died without leaving the queue) keeps its turn once it heads the
/// queue. dlock's waiters look again at least every third of it and so keep their place
/// however long the lock is held. A queue shared with Redisson peers needs their value (each
/// grant takes the granted waiter's wait off every deadline); a dlock-only one can take a
/// short one (`fair_wait_ms=30000`) to bound what dead waiters cost.
pub const DEFAULT_FAIR_WAIT: Duration = Duration::from_secs(300);

/// The shortest fair-lock wait accepted (and twice the response timeout): a waiter looks
/// again every third of it.
const MIN_FAIR_WAIT: Duration = Duration::from_secs(1);

#[cfg(feature = "serde")]
dlock_core::backend::deserialize_from_url!(RedisConfig);

impl RedisConfig {
    /// Parses a `redis://` or `rediss://` URL.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for another scheme, a missing host, or a bad or unknown query
    /// parameter. The message never contains the password.
    pub fn from_url(url: &str) -> Result<Self> {
        let (url, mut sentinel) = split_sentinel(url)?;
        let parsed = RedactedUrl::parse(&url)?;
        if !crate::consts::SCHEMES.contains(&parsed.scheme()) {
            return Err(Error::config(format!(
                "the redis backend takes redis://, rediss:// or redis+sentinel:// URLs, not {}://",
                parsed.scheme()
            )));
        }
        if parsed.expose().host_str().is_none_or(str::is_empty) {
            return Err(Error::config(format!("{parsed}: a redis URL needs a host")));
        }
        let mut cluster = false;
        let mut response_timeout = Duration::from_secs(5);
        let mut fair_wait = DEFAULT_FAIR_WAIT;
        let mut wait_replicas = WaitReplicas::Auto;
        let mut pubsub = PubSubMode::Auto;
        let mut sentinel_username = None;
        let mut sentinel_password = None;
        let mut tls = TlsFiles::default();
        let mut key_prefix = String::new();
        let mut nodelay = true;
        // File paths are read from the raw query with core's strict %-decoding (as etcds://
        // reads them): a `+` stays a `+`, and a malformed escape is refused.
        for part in parsed.expose().query().unwrap_or("").split('&') {
            let (key, value) = part.split_once('=').unwrap_or((part, ""));
            // The key decoded as the second loop decodes it, so that loop's skip of these
            // keys never drops one this loop did not take (`ca%5Ffile=`).
            let Some(key) = percent_decode(key) else {
                continue;
            };
            let key = key.as_str();
            if !TlsFiles::PARAMS.contains(&key) {
                continue;
            }
            if sentinel.is_some() {
                return Err(Error::config(format!(
                    "{key}=: TLS with Sentinel is not supported yet"
                )));
            }
            if parsed.scheme() != "rediss" {
                return Err(Error::config(format!("{key}= is for TLS: use rediss://")));
            }
            let value = percent_decode(value)
                .ok_or_else(|| Error::config(format!("{key}=: malformed %-escape")))?;
            tls.take_param(key, &value)?;
        }
        for (key, value) in parsed.query_pairs() {
            if TlsFiles::PARAMS.contains(&key.as_str()) {
                continue;
            }
            match key.as_str() {
                "cluster" => cluster = flag(&key, &value)?,
                "nodelay" => nodelay = flag(&key, &value)?,
                "timeout_ms" => response_timeout = positive_ms(&key, &value)?,
                "fair_wait_ms" => fair_wait = positive_ms(&key, &value)?,
                "wait_replicas" => wait_replicas = value.parse()?,
                "pubsub" => pubsub = value.parse()?,
                "sentinel_username" => sentinel_username = Some(value),
                "sentinel_password" => sentinel_password = Some(value),
                "key_prefix" => key_prefix = value,
                "protocol" => {
                    return Err(Error::config(
                        "protocol= is chosen by dlock (RESP3 for its subscriptions); remove it",
                    ));
                }
                other => {
                    // A typo (`clustr=true`) must not silently mean something else.
                    return Err(Error::config(format!(
                        "unknown query parameter {other:?} (known: cluster, timeout_ms, \
                         fair_wait_ms, wait_replicas, pubsub, sentinel_username, \
                         sentinel_password, key_prefix, nodelay; with rediss:// also ca_file, \
                         cert_file, key_file)"
                    )));
                }
            }
        }
        match (&mut sentinel, sentinel_username, sentinel_password) {
            (_, None, None) => {}
            (Some(s), username, Some(password)) => {
                s.auth = Some(SentinelAuth { username, password });
            }
            (Some(_), Some(_), None) => {
                return Err(Error::config(
                    "sentinel_username without sentinel_password: give both, or neither",
                ));
            }
            (None, ..) => {
                return Err(Error::config(
                    "sentinel_username and sentinel_password are for redis+sentinel:// URLs",
                ));
            }
        }
        let mut stripped = parsed.expose().clone();
        stripped.set_query(None);
        let url = RedactedUrl::parse(stripped.as_str())?;
        Self {
            url,
            cluster,
            response_timeout,
            fair_wait,
            wait_replicas,
            pubsub,
            sentinel,
            tls: tls.checked()?,
            key_prefix,
            nodelay,
            client: None,
        }
        .checked()
    }

    /// A configuration for a client the application already built: its address, database,
    /// credentials, TLS settings (a custom CA, client certificates) and TCP settings are used
    /// as they are, and dlock adds only what it needs: RESP3 on its subscription connection,
    /// `TCP_NODELAY` whatever the client's own setting (see [`nodelay`](Self::nodelay);
    /// `with_nodelay(false)` turns it off), and keepalive and, on Linux, a user timeout when
    /// the client sets none. The other fields take their
    /// defaults; change them with the `with_*` methods. A single server only: a cluster or a
    /// Sentinel group is reached through its URL.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> dlock_core::Result<()> {
    /// use dlock_redis::{RedisConfig, RedisProvider};
    ///
    /// let client = redis::Client::open("redis://127.0.0.1:6379/").expect("a valid URL");
    /// let config = RedisConfig::from_client(&client)?.with_wait_replicas(0);
    /// let redis = RedisProvider::connect_with(config).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the client's address cannot be written as a URL (the store id).
    pub fn from_client(client: &redis::Client) -> Result<Self> {
        let info = client.get_connection_info().clone();
        let scheme = match info.addr() {
            redis::ConnectionAddr::TcpTls { .. } => "rediss",
            _ => "redis",
        };
        let db = info.redis_settings().db();
        // The address without credentials: the store id and what messages show.
        let shown = match info.addr() {
            redis::ConnectionAddr::Unix(path) => format!("redis+unix://{}", path.display()),
            addr => format!("{scheme}://{addr}/{db}"),
        };
        let url = RedactedUrl::parse(&shown)?;
        Ok(Self {
            url,
            cluster: false,
            response_timeout: Duration::from_secs(5),
            fair_wait: DEFAULT_FAIR_WAIT,
            wait_replicas: WaitReplicas::Auto,
            pubsub: PubSubMode::Auto,
            sentinel: None,
            tls: TlsFiles::default(),
            key_prefix: String::new(),
            nodelay: true,
            client: Some(ClientInfo(info)),
        })
    }

    /// Refuses combinations dlock cannot keep.
    pub(crate) fn checked(self) -> Result<Self> {
        // A lock's keys share the name's hash tag (its `{...}`, or the whole name): braces in
        // the prefix would make the prefix the tag of every name, or split a name's keys.
        if self.key_prefix.contains(['{', '}']) {
            return Err(Error::config(format!(
                "key_prefix={:?}: no `{{` or `}}` (a lock's keys take their hash tag from its \
                 name)",
                self.key_prefix
            )));
        }
        // A fair waiter looks every third of the wait, and a look may take the response
        // timeout: it must land before the wait is up.
        let least = MIN_FAIR_WAIT.max(self.response_timeout.saturating_mul(2));
        if self.fair_wait < least {
            return Err(Error::config(format!(
                "fair_wait_ms={}: at least {} (1 s, and twice timeout_ms: a fair waiter looks \
                 again every third of it, and a look may take timeout_ms)",
                self.fair_wait.as_millis(),
                least.as_millis()
            )));
        }
        if !self.tls.is_empty() {
            if self.sentinel.is_some() {
                return Err(Error::config(
                    "ca_file, cert_file and key_file: TLS with Sentinel is not supported yet",
                ));
            }
            if self.client.is_some() {
                return Err(Error::config(
                    "ca_file, cert_file and key_file are for a URL; a client from \
                     RedisConfig::from_client brings its own TLS settings",
                ));
            }
            if self.url.scheme() != "rediss" {
                return Err(Error::config(
                    "ca_file, cert_file and key_file are for TLS: use rediss://",
                ));
            }
        }
        if self.cluster && self.sentinel.is_some() {
            return Err(Error::config(
                "cluster=true and a redis+sentinel:// URL: a Redis Cluster has no Sentinels",
            ));
        }
        if self.cluster && matches!(self.wait_replicas, WaitReplicas::AtLeast(n) if n > 0) {
            return Err(Error::config(
                "wait_replicas=N is not supported on a Redis Cluster yet (WAIT must reach each \
                 key's master); use auto or 0, or a single server and its replicas",
            ));
        }
        if !self.cluster && self.pubsub == PubSubMode::Sharded {
            return Err(Error::config(
                "pubsub=sharded is for a Redis Cluster (cluster=true); a single server uses \
                 PUBLISH/SUBSCRIBE, as Redisson does",
            ));
        }
        Ok(self)
    }

    dlock_core::setters! {
        /// Sets how a cluster carries wake-up messages.
        with_pubsub => pubsub: PubSubMode;
        /// Sets whether the URL names a cluster seed.
        with_cluster => cluster: bool;
        /// Sets the response timeout.
        with_response_timeout => response_timeout: Duration;
        /// Sets the fair-lock wait.
        with_fair_wait => fair_wait: Duration;
        /// Sets whether dlock's connections set `TCP_NODELAY` (see [`nodelay`](Self::nodelay)).
        with_nodelay => nodelay: bool;
    }

    /// Sets how many replicas must acknowledge a grant or a renewal: [`WaitReplicas::Auto`],
    /// or a number (`0`: none).
    #[must_use]
    pub fn with_wait_replicas(mut self, wait: impl Into<WaitReplicas>) -> Self {
        self.wait_replicas = wait.into();
        self
    }

    /// Sets the prefix put before every lock name (see [`key_prefix`](Self::key_prefix)).
    #[must_use]
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The store id: the URL without credentials or query; for Sentinel, the Sentinels and
    /// the master's name (whichever server is master now); with a key prefix, the prefix
    /// after `#` (its locks are another set than the same names' without it).
    pub(crate) fn store_id(&self) -> String {
        let id = self.server_id();
        if self.key_prefix.is_empty() {
            id
        } else {
            format!("{id}#{}", self.key_prefix)
        }
    }

    /// The server's part of [`store_id`](Self::store_id).
    fn server_id(&self) -> String {
        match &self.sentinel {
            // Database 0 is the default: `redis://h/0` and `redis://h` are one store.
            None => {
                let id = self.url.store_id();
                match id.strip_suffix("/0") {
                    Some(bare) => bare.to_owned(),
                    None => id,
                }
            }
            Some(s) => {
                let db = self.url.expose().path().trim_matches('/');
                let db = if db.is_empty() || db == "0" {
                    String::new()
                } else {
                    format!("/{db}")
                };
                format!(
                    "redis+sentinel://{}/{}{db}",
                    s.sentinels.join(",").to_ascii_lowercase(),
                    s.master
                )
            }
        }
    }
}

/// Splits a `redis+sentinel://` URL into a plain `redis://` URL of the first Sentinel (with
/// the master's credentials, database and the query, so they parse as for any server) and the
/// Sentinel part; other URLs pass through.
fn split_sentinel(url: &str) -> Result<(String, Option<SentinelConfig>)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok((url.to_owned(), None));
    };
    match scheme {
        "redis+sentinel" => {}
        "rediss+sentinel" => {
            return Err(Error::config(
                "rediss+sentinel://: TLS with Sentinel is not supported yet; use \
                 redis+sentinel:// on a trusted network, or rediss:// to one server",
            ));
        }
        _ => return Ok((url.to_owned(), None)),
    }
    let bad = |why: &str| {
        Error::config(format!(
            "{}: {why}; expected redis+sentinel://[user:password@]host[:port][,host[:port]...]\
             /master-name[/db]",
            dlock_core::redact(url)
        ))
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (&authority[..=i], &authority[i + 1..]),
        None => ("", authority),
    };
    let sentinels = parse_host_list(hosts, DEFAULT_SENTINEL_PORT).map_err(|why| bad(&why))?;
    let mut segments = path.trim_start_matches('/').splitn(2, '/');
    let master = segments.next().unwrap_or_default();
    if master.is_empty() {
        return Err(bad("the master's name is missing"));
    }
    if master.contains('%') || master.chars().any(char::is_whitespace) {
        return Err(bad(
            "the master's name must be plain (no spaces or %-escapes)",
        ));
    }
    let db = segments.next().unwrap_or_default();
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(bad(&format!("database {db:?} is not a number")));
    }
    let first = sentinels.first().map_or("", String::as_str);
    let mut plain = format!("redis://{userinfo}{first}/{db}");
    if let Some(q) = query {
        plain.push('?');
        plain.push_str(q);
    }
    Ok((
        plain,
        Some(SentinelConfig {
            sentinels,
            master: master.to_owned(),
            auth: None,
        }),
    ))
}

/// A yes/no query parameter (`true`, `1`, `yes`; `false`, `0`, `no`).
fn flag(key: &str, value: &str) -> Result<bool> {
    match value {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        other => Err(Error::config(format!(
            "{key}={other:?}: expected true or false"
        ))),
    }
}

fn positive_ms(key: &str, value: &str) -> Result<Duration> {
    value
        .parse::<u64>()
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| Error::config(format!("{key}={value:?}: expected a positive integer")))
}

#[cfg(test)]
mod tests;
