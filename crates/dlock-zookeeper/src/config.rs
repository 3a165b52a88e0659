//! `zk://` URLs and the configuration they parse into.

use std::fmt;
use std::time::Duration;

use dlock_core::backend::HostListUrl;
use dlock_core::{Error, Result, redact};

use crate::nodes;

/// The session timeout asked of the server when the URL does not say
/// (the server clamps it to its `minSessionTimeout..=maxSessionTimeout`).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The port of a host given without one.
pub const DEFAULT_PORT: u16 = 2181;

/// How to reach a ZooKeeper ensemble. Build it from a URL with [`ZkConfig::from_url`];
/// `Debug` and `Display` never show the password.
///
/// URL: `zk://[user:password@]host[:port][,host[:port]...][/chroot][?session_timeout_ms=N&connection_timeout_ms=N]`
///
/// | part | meaning | default |
/// | --- | --- | --- |
/// | `host:port,...` | the ensemble's client addresses; IPv6 as `[::1]:2181` | port `2181` |
/// | `/chroot` | the base path every lock lives under | `/` |
/// | `user:password@` | `digest` authentication (percent-decoded) sent on every connection | none |
/// | `session_timeout_ms` | session timeout asked of the server | `10000` |
/// | `connection_timeout_ms` | idle time after which a connection counts as lost | 2/5 of the session timeout |
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkConfig {
    /// `host:port` of every server, in the order given.
    pub hosts: Vec<String>,
    /// The base path: `""` for the root, otherwise `/a/b` (no trailing `/`).
    pub chroot: String,
    /// Session timeout asked of the server.
    pub session_timeout: Duration,
    /// Connection (idle) timeout; `None` lets the client pick 2/5 of the session timeout.
    pub connection_timeout: Option<Duration>,
    /// `digest` credentials `user:password`, never shown.
    digest: Option<String>,
    /// The application's own connector ([`ZkConfig::with_connector`]).
    connector: Option<OwnConnector>,
}

/// An application's connector, shared by the clones of a config (two configs are equal only
/// when they share it).
#[derive(Clone)]
struct OwnConnector(std::sync::Arc<zookeeper_client::Connector>);

impl PartialEq for OwnConnector {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for OwnConnector {}

#[cfg(feature = "serde")]
dlock_core::backend::deserialize_from_url!(ZkConfig);

impl ZkConfig {
    /// Parses a `zk://` URL.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for another scheme, a missing or malformed host list, a chroot
    /// ZooKeeper cannot represent, or an unknown or malformed query parameter. The message
    /// never contains the password.
    pub fn from_url(url: &str) -> Result<Self> {
        let shown = redact(url);
        let bad = |why: &str| Error::config(format!("{shown:?}: {why}"));
        let Some(rest) = url.strip_prefix("zk://") else {
            let scheme = url.split("://").next().unwrap_or("");
            return Err(if url.contains("://") {
                Error::config(format!(
                    "the zookeeper backend takes zk:// URLs, not {scheme}://"
                ))
            } else {
                bad("not a URL; expected zk://host:port[,host:port...][/chroot]")
            });
        };
        let parts = HostListUrl::parse(rest, DEFAULT_PORT, "a zk URL").map_err(|why| bad(&why))?;
        let digest = parts
            .credentials
            .as_ref()
            .map(|(user, password)| format!("{user}:{password}"));
        let chroot = parse_chroot(parts.path).map_err(|why| bad(&why))?;
        let mut session_timeout = DEFAULT_SESSION_TIMEOUT;
        let mut connection_timeout = None;
        for (key, value) in parts.params() {
            match key {
                "session_timeout_ms" => session_timeout = positive_ms(key, value)?,
                "connection_timeout_ms" => connection_timeout = Some(positive_ms(key, value)?),
                other => {
                    return Err(bad(&format!(
                        "unknown query parameter {other:?} (known: session_timeout_ms, \
                         connection_timeout_ms)"
                    )));
                }
            }
        }
        Ok(Self {
            hosts: parts.hosts,
            chroot,
            session_timeout,
            connection_timeout,
            digest,
            connector: None,
        })
    }

    /// Sets the session timeout (checked at connect: see [`check`](Self::check)).
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Checks what the setters cannot: the session and connection timeouts are positive whole
    /// milliseconds up to `i32::MAX` (the protocol's count; a longer one would wrap).
    /// [`ZkProvider::connect_with`](crate::ZkProvider::connect_with) calls it.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the timeout out of range.
    pub fn check(&self) -> Result<()> {
        let timeouts = [
            ("session_timeout", Some(self.session_timeout)),
            ("connection_timeout", self.connection_timeout),
        ];
        for (key, timeout) in timeouts {
            if let Some(t) = timeout.filter(|t| !fits_the_wire(*t)) {
                return Err(out_of_range(key, &format!("{t:?}")));
            }
        }
        Ok(())
    }

    /// Sets the connection timeout.
    pub fn with_connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = Some(timeout);
        self
    }

    /// Sets (or clears) the `digest` credentials `user:password`.
    pub fn with_digest(mut self, credentials: Option<String>) -> Self {
        self.digest = credentials;
        self
    }

    /// Opens every session (the first, and each after an expiry) with the application's own
    /// connector: its TLS, SASL, authentication and read-only settings. dlock sets on a copy
    /// what the lock recipes need: this config's session timeout (and connection timeout and
    /// digest, when set) and failing eagerly instead of retrying inside the client. Leave
    /// `with_session` unset (dlock opens a new session after an expiry) and `with_readonly`
    /// off (a read-only server refuses the nodes a lock creates).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> dlock_core::Result<()> {
    /// use dlock_zookeeper::{ZkConfig, ZkProvider};
    ///
    /// let connector = dlock_zookeeper::zookeeper_client::Client::connector()
    ///     .with_auth("digest", b"app:secret");
    /// let config = ZkConfig::from_url("zk://10.0.0.1:2181,10.0.0.2:2181/locks")?
    ///     .with_connector(connector);
    /// let zk = ZkProvider::connect_with(config).await?;
    /// # Ok(()) }
    /// ```
    pub fn with_connector(mut self, connector: zookeeper_client::Connector) -> Self {
        self.connector = Some(OwnConnector(std::sync::Arc::new(connector)));
        self
    }

    /// A connector for a new session: the application's, or the client's default.
    pub(crate) fn connector(&self) -> zookeeper_client::Connector {
        self.connector
            .as_ref()
            .map_or_else(zookeeper_client::Client::connector, |c| (*c.0).clone())
    }

    /// The connect string for the client: `host:port,host:port` (no chroot: dlock prefixes
    /// paths itself, so what the server sees is exactly what a Curator peer uses).
    pub fn connect_string(&self) -> String {
        self.hosts.join(",")
    }

    /// The store id: `zk://hosts/chroot`, without credentials or query, with the hosts
    /// sorted, so that two spellings of one ensemble are one store (MultiLock orders its
    /// members by store).
    pub fn store_id(&self) -> String {
        let mut hosts = self.hosts.clone();
        hosts.sort();
        format!("zk://{}{}", hosts.join(","), self.chroot)
    }

    /// The znode path the lock `name` lives at on the server (under the chroot); see the
    /// crate docs for the mapping.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] if `name` is not a valid [`LockName`](dlock_core::LockName).
    pub fn lock_path(&self, name: &str) -> Result<String> {
        let name = dlock_core::LockName::new(name)?;
        Ok(nodes::lock_path(&self.chroot, &name))
    }

    pub(crate) fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }
}

impl fmt::Display for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(digest) = &self.digest {
            let user = digest.split(':').next().unwrap_or("");
            write!(
                f,
                "zk://{user}:***@{}{}",
                self.connect_string(),
                self.chroot
            )
        } else {
            f.write_str(&self.store_id())
        }
    }
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("url", &self.to_string())
            .field("session_timeout", &self.session_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .finish()
    }
}

fn parse_chroot(path: &str) -> std::result::Result<String, String> {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    for (i, segment) in trimmed[1..].split('/').enumerate() {
        // Below another node, a segment that lock's recipe would read as its own (its
        // semaphore directories, a contender node) would put every lock of this chroot inside
        // that lock of a provider with a shorter chroot.
        if i > 0
            && (segment == nodes::LOCKS
                || segment == nodes::LEASES
                || nodes::is_recipe_node(segment))
        {
            return Err(format!(
                "chroot {path:?}: {segment:?} below another node is what the lock there keeps \
                 its internals in, for providers with a shorter chroot; choose another path"
            ));
        }
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(format!(
                "chroot {path:?} has an empty, . or .. segment, which ZooKeeper cannot represent"
            ));
        }
        if let Some(c) = segment.chars().find(|c| nodes::forbidden_char(*c)) {
            return Err(format!(
                "chroot {path:?} contains U+{:04X}, which ZooKeeper does not allow in paths",
                u32::from(c)
            ));
        }
    }
    Ok(trimmed.to_owned())
}

/// A positive number of milliseconds that fits the protocol's 32-bit field (a larger one
/// would wrap).
fn positive_ms(key: &str, value: &str) -> Result<Duration> {
    value
        .parse::<u64>()
        .ok()
        .map(Duration::from_millis)
        .filter(|d| fits_the_wire(*d))
        .ok_or_else(|| out_of_range(key, value))
}

/// Whether `d` is a positive whole number of milliseconds the protocol can carry (a signed
/// 32-bit count).
fn fits_the_wire(d: Duration) -> bool {
    !d.is_zero()
        && d.subsec_nanos().is_multiple_of(1_000_000)
        && d.as_millis() <= u128::from(i32::MAX.unsigned_abs())
}

fn out_of_range(key: &str, value: &str) -> Error {
    Error::config(format!(
        "{key}={value}: expected a positive number of milliseconds up to {}",
        i32::MAX
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chroot never lies inside another provider's lock internals: no segment below
    /// another node is a semaphore directory or a contender node.
    #[test]
    fn chroots_inside_lock_internals_are_refused() {
        for path in [
            "/x/locks",
            "/x/leases",
            "/a/lock-0000000001",
            "/a/b/_c_0-__WRIT__0000000002",
        ] {
            let url = format!("zk://h{path}");
            let e = ZkConfig::from_url(&url).unwrap_err();
            assert!(e.to_string().contains("internals"), "{path}: {e}");
        }
        for path in ["/locks", "/x/locksmith", "/lock-0000000001/x"] {
            assert!(
                ZkConfig::from_url(&format!("zk://h{path}")).is_ok(),
                "{path}"
            );
        }
    }

    #[test]
    fn parses_hosts_chroot_and_parameters() {
        let c = ZkConfig::from_url(
            "zk://a:1,b,[::1]:2183/dlock/base/?session_timeout_ms=4000&connection_timeout_ms=900",
        )
        .unwrap();
        assert_eq!(c.hosts, ["a:1", "b:2181", "[::1]:2183"]);
        assert_eq!(c.chroot, "/dlock/base");
        assert_eq!(c.session_timeout, Duration::from_secs(4));
        assert_eq!(c.connection_timeout, Some(Duration::from_millis(900)));
        assert_eq!(c.connect_string(), "a:1,b:2181,[::1]:2183");
        assert_eq!(c.store_id(), "zk://[::1]:2183,a:1,b:2181/dlock/base");
        let reordered = ZkConfig::from_url("zk://b,[::1]:2183,a:1/dlock/base").unwrap();
        assert_eq!(
            reordered.store_id(),
            c.store_id(),
            "one ensemble, two spellings"
        );
        assert!(ZkConfig::from_url("zk://h?session_timeout_ms=4294967296000").is_err());
        assert!(ZkConfig::from_url("zk://h?session_timeout_ms=2147483648").is_err());
        assert!(ZkConfig::from_url("zk://h?session_timeout_ms=2147483647").is_ok());
        assert_eq!(c.lock_path("orders/42").unwrap(), "/dlock/base/orders/42");
    }

    #[test]
    fn defaults() {
        let c = ZkConfig::from_url("zk://127.0.0.1:2181").unwrap();
        assert_eq!(c.chroot, "");
        assert_eq!(c.session_timeout, DEFAULT_SESSION_TIMEOUT);
        assert_eq!(c.connection_timeout, None);
        assert_eq!(c.digest(), None);
        assert_eq!(c.store_id(), "zk://127.0.0.1:2181");
        assert_eq!(
            ZkConfig::from_url("zk://h/").unwrap().store_id(),
            "zk://h:2181"
        );
    }

    #[test]
    fn digest_credentials_are_kept_but_never_shown() {
        let c = ZkConfig::from_url("zk://alice:s%40cret@h:2181/x").unwrap();
        assert_eq!(c.digest(), Some("alice:s@cret"));
        let shown = format!("{c} {c:?} {}", c.store_id());
        assert!(!shown.contains("cret"), "{shown}");
        assert!(shown.contains("alice:***@h:2181/x"), "{shown}");
    }

    #[test]
    fn rejects_bad_urls_without_leaking_the_password() {
        dlock_conformance::refuses_urls(
            ZkConfig::from_url,
            &[
                "redis://127.0.0.1",
                "127.0.0.1:2181",
                "zk://",
                "zk://u:secret@",
                "zk://u:secret@h:notaport",
                "zk://u:secret@h:0",
                "zk://u:secret@h:70000",
                "zk://u:secret@h,,k",
                "zk://u:secret@h//x",
                "zk://u:secret@h/a/../b",
                "zk://u:secret@h/a/./b",
                "zk://u:secret@h/\u{e000}",
                "zk://u:secret@h?session_timeout_ms=0",
                "zk://u:secret@h?session_timeout_ms=soon",
                "zk://u:secret@h?colour=blue",
                "zk://u:secret@h#frag",
                "zk://u:secret@[::1",
                "zk://nocolon@h",
                "zk://:secret@h",
                "zk://u:%zz@h",
            ],
        );
    }
}
