//! `etcd://` URLs and the configuration they parse into.

use std::fmt;
use std::time::Duration;

use dlock_core::backend::{HostListUrl, percent_decode};
use dlock_core::{Error, LockName, Result, TlsFiles, redact};

/// The port an `etcd://` host without one is reached on (etcd's client port).
pub const DEFAULT_PORT: u16 = 2379;

/// The time-to-live of the provider's lease when the URL does not set `ttl_s`: a client that
/// stops talking to etcd (dead, paused, cut off) loses its holds this long after its last
/// keep-alive, and the next waiter gets the lock.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// The shortest lease time-to-live: etcd rounds shorter ones up to about one and a half
/// election timeouts (1.5 s with its defaults), and counts in whole seconds.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// The longest lease time-to-live etcd grants (its `MaxLeaseTTL`, 9e9 seconds).
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(9_000_000_000);

/// The key prefix when the URL has no path.
pub const DEFAULT_PREFIX: &str = "dlock/";

/// How an etcd provider connects and where its keys live.
///
/// ```
/// use std::time::Duration;
/// use dlock_etcd::EtcdConfig;
///
/// let c = EtcdConfig::from_url("etcd://10.0.0.1,10.0.0.2:2479/locks?ttl_s=5").unwrap();
/// assert_eq!(c.endpoints, ["10.0.0.1:2379", "10.0.0.2:2479"]);
/// assert_eq!(c.prefix, "locks/");
/// assert_eq!(c.lease_ttl, Duration::from_secs(5));
/// // Lock "jobs/nightly" is etcd's lock name "locks/jobs%2Fnightly": `etcdctl lock` on that
/// // name and dlock exclude each other.
/// assert_eq!(c.etcd_lock_name("jobs/nightly").unwrap(), "locks/jobs%2Fnightly");
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// `host:port` of each member the client may talk to.
    pub endpoints: Vec<String>,
    /// Prepended to every lock's etcd name: the URL's path as one segment (`%` and `/`
    /// escaped as in names) with a `/` at its end, [`DEFAULT_PREFIX`] without a path. Never
    /// empty, so no prefix's keys lie inside another prefix's lock.
    pub prefix: String,
    /// The time-to-live of the provider's lease (whole seconds, at least [`MIN_LEASE_TTL`]).
    pub lease_ttl: Duration,
    /// How long connecting may take.
    pub connect_timeout: Option<Duration>,
    /// TLS (`etcds://`): `None` for plain `etcd://`.
    pub tls: Option<EtcdTls>,
    user: Option<(String, String)>,
}

/// TLS to etcd (`etcds://`): whom to trust, and the client's own certificate if the members
/// ask for one (`--client-cert-auth`); the policy of every backend ([`TlsFiles`]).
pub type EtcdTls = TlsFiles;

#[cfg(feature = "serde")]
dlock_core::backend::deserialize_from_url!(EtcdConfig);

/// A configuration error of a part, said of the whole URL.
fn rephrase(e: Error, bad: &impl Fn(&str) -> Error) -> Error {
    match e {
        Error::Config { message, .. } => bad(&message),
        other => other,
    }
}

impl EtcdConfig {
    /// Parses `etcd://[user:password@]host[:port][,host[:port]...][/prefix][?ttl_s=N&connect_timeout_ms=N]`,
    /// and `etcds://` for TLS, which also takes `ca_file=PATH`, `cert_file=PATH` and
    /// `key_file=PATH` (see [`EtcdTls`]).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming what is wrong (never the password): another scheme, no host,
    /// a bad port, an unknown query parameter, a lease time-to-live under two seconds, TLS
    /// parameters on `etcd://`, a certificate without its key.
    pub fn from_url(url: &str) -> Result<Self> {
        let shown = redact(url);
        let bad = |why: &str| Error::config(format!("{shown:?}: {why}"));
        let (rest, tls) = match (url.strip_prefix("etcd://"), url.strip_prefix("etcds://")) {
            (Some(rest), _) => (Some(rest), None),
            (None, Some(rest)) => (Some(rest), Some(EtcdTls::default())),
            (None, None) => (None, None),
        };
        let mut tls = tls;
        let Some(rest) = rest else {
            let scheme = url.split("://").next().unwrap_or("");
            return Err(if url.contains("://") {
                Error::config(format!(
                    "the etcd backend takes etcd:// and etcds:// URLs, not {scheme}://"
                ))
            } else {
                bad("not a URL; expected etcd[s]://host:port[,host:port...][/prefix]")
            });
        };
        let parts =
            HostListUrl::parse(rest, DEFAULT_PORT, "an etcd URL").map_err(|why| bad(&why))?;
        // The prefix is one key segment, escaped as a name is, and never empty: the keys of
        // lock `n` under prefix `p/` are `p/n/…`, so a prefix with a `/` inside (`p/x/`), or
        // locks with none (`x/` is the range of lock `x`), would put one prefix's keys inside
        // another's lock.
        let prefix = match parts.path.strip_prefix('/') {
            None => DEFAULT_PREFIX.to_owned(),
            Some(p) => {
                let p = percent_decode(p).ok_or_else(|| bad("malformed %-escape in the path"))?;
                let trimmed = p.trim_end_matches('/');
                if trimmed.is_empty() {
                    return Err(bad(
                        "an empty prefix: its locks' keys would hold every other prefix's \
                         (name one, or leave the path out for dlock/)",
                    ));
                }
                let mut prefix = escape_segment(trimmed);
                prefix.push('/');
                prefix
            }
        };
        let mut lease_ttl = DEFAULT_LEASE_TTL;
        let mut connect_timeout = None;
        for (key, value) in parts.params() {
            match key {
                "ttl_s" => {
                    lease_ttl = value
                        .parse::<u32>()
                        .ok()
                        .map(|s| Duration::from_secs(u64::from(s)))
                        .filter(|ttl| *ttl >= MIN_LEASE_TTL)
                        .ok_or_else(|| {
                            bad(&format!(
                                "ttl_s={value:?}: expected whole seconds from {} up to {}",
                                MIN_LEASE_TTL.as_secs(),
                                u32::MAX
                            ))
                        })?;
                }
                "connect_timeout_ms" => {
                    connect_timeout = Some(
                        value
                            .parse::<u32>()
                            .ok()
                            .filter(|ms| *ms > 0)
                            .map(|ms| Duration::from_millis(u64::from(ms)))
                            .ok_or_else(|| {
                                bad(&format!(
                                    "connect_timeout_ms={value:?}: expected a positive number \
                                     of milliseconds"
                                ))
                            })?,
                    );
                }
                key if TlsFiles::PARAMS.contains(&key) => {
                    let Some(tls) = tls.as_mut() else {
                        return Err(bad(&format!("{key}= is for TLS: use etcds://")));
                    };
                    let value = percent_decode(value).ok_or_else(|| bad("malformed %-escape"))?;
                    tls.take_param(key, &value).map_err(|e| rephrase(e, &bad))?;
                }
                other => {
                    return Err(bad(&format!(
                        "unknown query parameter {other:?} (known: ttl_s, connect_timeout_ms; \
                         with etcds:// also ca_file, cert_file, key_file)"
                    )));
                }
            }
        }
        let tls = tls
            .map(TlsFiles::checked)
            .transpose()
            .map_err(|e| rephrase(e, &bad))?;
        Ok(Self {
            endpoints: parts.hosts,
            prefix,
            lease_ttl,
            connect_timeout,
            tls,
            user: parts.credentials,
        })
    }

    /// The same configuration with another lease time-to-live (rounded up to whole seconds,
    /// and to [`MIN_LEASE_TTL`]).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        let secs = ttl
            .as_secs()
            .saturating_add(u64::from(ttl.subsec_nanos() > 0))
            .min(MAX_LEASE_TTL.as_secs());
        self.lease_ttl = Duration::from_secs(secs).max(MIN_LEASE_TTL);
        self
    }

    /// Checks what a caller may have set in the public fields: the time-to-live within
    /// [`MIN_LEASE_TTL`] and [`MAX_LEASE_TTL`], in whole seconds, and at least one endpoint.
    pub(crate) fn check(&self) -> Result<()> {
        let ttl = self.lease_ttl;
        if ttl < MIN_LEASE_TTL || ttl > MAX_LEASE_TTL || ttl.subsec_nanos() != 0 {
            return Err(Error::config(format!(
                "etcd: a lease time-to-live of {ttl:?}; it must be whole seconds from {} to {}",
                MIN_LEASE_TTL.as_secs(),
                MAX_LEASE_TTL.as_secs()
            )));
        }
        if self.endpoints.is_empty() {
            return Err(Error::config("etcd: no endpoint to connect to"));
        }
        Ok(())
    }

    /// The same configuration with credentials (`None`: none), beside the URL.
    pub fn with_user(mut self, user: Option<(String, String)>) -> Self {
        self.user = user;
        self
    }

    pub(crate) fn user(&self) -> Option<&(String, String)> {
        self.user.as_ref()
    }

    /// The lease time-to-live in etcd's unit (seconds).
    pub(crate) fn ttl_secs(&self) -> i64 {
        i64::try_from(self.lease_ttl.as_secs()).unwrap_or(i64::MAX)
    }

    /// Identifies the cluster and prefix, without credentials; the same for every spelling of
    /// one member list.
    pub fn store_id(&self) -> String {
        let mut hosts = self.endpoints.clone();
        hosts.sort();
        format!("{}://{}/{}", self.scheme(), hosts.join(","), self.prefix)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "etcds" } else { "etcd" }
    }

    /// The etcd lock name of dlock lock `name`: the prefix, then the name with `%` and `/`
    /// escaped (`%25`, `%2F`), so that no lock's keys lie under another's (`a` and `a/b` are
    /// `a/` and `a%2Fb/`). `etcdctl lock` on this name and dlock exclude each other.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that is not a valid [`LockName`].
    pub fn etcd_lock_name(&self, name: &str) -> Result<String> {
        let name = LockName::new(name)?;
        Ok(self.lock_name(&name))
    }

    pub(crate) fn lock_name(&self, name: &LockName) -> String {
        let mut out = self.prefix.clone();
        out.push_str(&escape_segment(name.as_str()));
        out
    }
}

/// `text` as one key segment: `%` and `/` escaped (`%25`, `%2F`).
fn escape_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.user {
            Some((user, _)) => write!(
                f,
                "{}://{user}:***@{}/{}",
                self.scheme(),
                self.endpoints.join(","),
                self.prefix
            ),
            None => f.write_str(&self.store_id()),
        }
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("url", &self.to_string())
            .field("lease_ttl", &self.lease_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A time-to-live out of etcd's range is clamped by `with_lease_ttl` (without overflow,
    /// however long) and refused by `check` when set in the public field.
    #[test]
    fn lease_ttls_out_of_range_are_clamped_or_refused() {
        let c = EtcdConfig::from_url("etcd://h").unwrap();
        assert_eq!(
            c.clone().with_lease_ttl(Duration::MAX).lease_ttl,
            MAX_LEASE_TTL
        );
        assert_eq!(
            c.clone()
                .with_lease_ttl(Duration::from_millis(2500))
                .lease_ttl,
            Duration::from_secs(3)
        );
        assert_eq!(
            c.clone().with_lease_ttl(Duration::ZERO).lease_ttl,
            MIN_LEASE_TTL
        );
        assert!(c.check().is_ok());
        for bad in [
            Duration::ZERO,
            Duration::from_millis(2500),
            MAX_LEASE_TTL + Duration::from_secs(1),
        ] {
            let mut c = c.clone();
            c.lease_ttl = bad;
            assert!(matches!(c.check(), Err(Error::Config { .. })), "{bad:?}");
        }
        let mut c = c;
        c.endpoints.clear();
        assert!(matches!(c.check(), Err(Error::Config { .. })));
    }

    #[test]
    fn parses_hosts_prefix_and_parameters() {
        let c = EtcdConfig::from_url(
            "etcd://u:p%40ss@a:1,b,[::1]:2381/base/x/?ttl_s=4&connect_timeout_ms=900",
        )
        .unwrap();
        assert_eq!(c.endpoints, ["a:1", "b:2379", "[::1]:2381"]);
        assert_eq!(c.prefix, "base%2Fx/");
        assert_eq!(c.lease_ttl, Duration::from_secs(4));
        assert_eq!(c.connect_timeout, Some(Duration::from_millis(900)));
        assert_eq!(c.user(), Some(&("u".to_owned(), "p@ss".to_owned())));
        assert!(!format!("{c} {c:?}").contains("p@ss"));
        let same = EtcdConfig::from_url("etcd://[::1]:2381,b:2379,a:1/base/x").unwrap();
        assert_eq!(same.store_id(), c.store_id(), "one cluster, two spellings");
        assert_eq!(EtcdConfig::from_url("etcd://h").unwrap().prefix, "dlock/");
    }

    /// No prefix's keys lie inside another prefix's lock: a prefix is one escaped segment,
    /// never empty. Under the default prefix lock `x` is the range `dlock/x/`, which prefix
    /// `dlock/x` would have shared.
    #[test]
    fn prefixes_never_nest_in_locks() {
        let default = EtcdConfig::from_url("etcd://h").unwrap();
        let lock_x = format!("{}/", default.etcd_lock_name("x").unwrap());
        for url in [
            "etcd://h/dlock/x",
            "etcd://h/dlock%2Fx",
            "etcd://h/dlock/x/",
        ] {
            let c = EtcdConfig::from_url(url).unwrap();
            let keys = format!("{}/", c.etcd_lock_name("y").unwrap());
            assert!(
                !keys.starts_with(&lock_x),
                "{url}: {keys} is inside {lock_x}"
            );
            assert_eq!(c.prefix, "dlock%2Fx/");
        }
        for url in ["etcd://h/", "etcd://h//"] {
            let e = EtcdConfig::from_url(url).unwrap_err();
            assert!(e.to_string().contains("empty prefix"), "{url}: {e}");
        }
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        for (url, says) in [
            ("redis://h", "not redis://"),
            ("etcd://", "at least one host"),
            ("etcd://h:0", "h:0"),
            ("etcd://h?ttl_s=1", "ttl_s"),
            ("etcd://h?ttl_s=-3", "ttl_s"),
            ("etcd://h?ttl=5", "unknown query parameter \"ttl\""),
            ("etcd://h?connect_timeout_ms=0", "connect_timeout_ms"),
            ("etcd://:secret@h", "user name"),
            ("etcd://h#x", "fragment"),
            ("etcd://h/%zz", "%-escape"),
        ] {
            let e = EtcdConfig::from_url(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("secret"), "{url}: {e}");
        }
        for (url, says) in [
            ("etcd://h?ca_file=/x.pem", "use etcds://"),
            ("etcds://h?cert_file=/c.pem", "go together"),
            ("etcds://h?ca_file=", "file path"),
        ] {
            let e = EtcdConfig::from_url(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn etcds_takes_its_files() {
        let c = EtcdConfig::from_url("etcds://h").unwrap();
        assert_eq!(c.tls, Some(EtcdTls::default()));
        assert_eq!(c.store_id(), "etcds://h:2379/dlock/");
        let c = EtcdConfig::from_url(
            "etcds://u:p@h:1?ca_file=/etc/ca.pem&cert_file=/c%20d.pem&key_file=/k.pem",
        )
        .unwrap();
        let tls = c.tls.clone().unwrap();
        assert_eq!(tls.ca_file, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(
            tls.identity,
            Some((PathBuf::from("/c d.pem"), PathBuf::from("/k.pem")))
        );
        assert_eq!(c.to_string(), "etcds://u:***@h:1/dlock/");
        assert_eq!(EtcdConfig::from_url("etcd://h").unwrap().tls, None);
    }

    /// Escaping only `%` and `/` is injective and leaves no `/` in a name: no lock's key
    /// range holds another's keys.
    #[test]
    fn lock_names_never_nest() {
        let c = EtcdConfig::from_url("etcd://h").unwrap();
        let names = ["a", "a/b", "a%2Fb", "a%b", "%", "/", "%2F", "a/", "a//"];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            let mapped = c.etcd_lock_name(n).unwrap();
            assert!(!mapped["dlock/".len()..].contains('/'), "{n} -> {mapped}");
            assert!(seen.insert(mapped.clone()), "{n} collides as {mapped}");
        }
        assert_eq!(c.etcd_lock_name("jobs").unwrap(), "dlock/jobs");
    }
}
