#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

//! # Feature flags
//!
//! | feature | backend | schemes |
//! | --- | --- | --- |
//! | `memory` (default) | [`memory`]: in-process reference backend | `memory://` |
//! | `redis` | [`redis`]: Redisson-compatible locks on Redis, Redis Cluster or a master behind Sentinel | `redis://`, `rediss://`, `redis+sentinel://` |
//! | `zookeeper` | [`zookeeper`]: Curator-compatible locks on ZooKeeper | `zk://` |
//! | `mysql` | [`sql`]: MySQL / MariaDB (unique-insert, optimistic, for-update, get-lock) | `mysql://`, `mariadb://` |
//! | `sqlite` (default) | [`sql`]: embedded SQLite, the default store, its C source compiled in | `sqlite://` |
//! | `sqlite-unbundled` | [`sql`]: embedded SQLite linked to the system's `libsqlite3` (needs libclang to build; turn the default features off) | `sqlite://` |
//! | `postgres` | [`sql`]: PostgreSQL (unique-insert, optimistic, for-update, advisory) | `postgres://`, `postgresql://` |
//! | `etcd` | [`etcd`]: locks on etcd, compatible with `etcdctl lock` (needs `protoc` to build) | `etcd://`, `etcds://` |
//! | `sql-native-roots` | MySQL and PostgreSQL over TLS trust the operating system's certificate store, not the built-in Mozilla roots | |
//! | `all-backends` | every backend below, for CI and docs | |
//!
//! # Guards and release
//!
//! [`LockGuard::release`] releases and tells you whether it worked. A guard dropped without
//! `release` is released in a background task when a tokio runtime exists: release on drop is
//! **not immediate**. Watch [`LockGuard::lost`] while you work.

use std::fmt;
#[cfg(any(
    feature = "memory",
    feature = "redis",
    feature = "zookeeper",
    feature = "mysql",
    feature = "_sqlite",
    feature = "postgres",
    feature = "etcd"
))]
use std::sync::Arc;
use std::time::Duration;

pub use dlock_core::{
    BoxError, Capabilities, Closed, DistributedElection, DistributedLock, DistributedLockExt,
    DistributedReadWriteLock, DistributedSemaphore, DynElection, DynLock, DynLockProvider,
    DynReadWriteLock, DynSemaphore, Error, FencingToken, HoldState, Leader, Leadership, Lease,
    LockGuard, LockKind, LockName, LockOptions, LockProvider, LockStatus, LossReason, Member,
    MultiGuard, MultiLock, Observer, Result, redact,
};

/// How long [`Locks::close`] gives the releases and clean-ups of a shutdown.
pub const CLOSE_WITHIN: Duration = Duration::from_secs(10);

/// What backend authors need (the generic handles, `Hold`, `Deadline` and the time helpers);
/// see [`dlock_core::backend`].
pub use dlock_core::backend;

/// The in-process reference backend (`memory://`), with its test hooks.
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub mod memory {
    pub use dlock_memory::*;
}

/// Locks on etcd (`etcd://`), compatible with etcd's own lock (`etcdctl lock`).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd {
    pub use dlock_etcd::*;
}

/// Redisson-compatible locks on Redis (`redis://`, `rediss://`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    pub use dlock_redis::*;
}

/// Curator-compatible locks on ZooKeeper (`zk://`).
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub mod zookeeper {
    pub use dlock_zookeeper::*;
}

/// SQL locks: MySQL / MariaDB (`mysql://`) and embedded SQLite (`sqlite://`).
#[cfg(any(feature = "mysql", feature = "_sqlite", feature = "postgres"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "mysql", feature = "_sqlite", feature = "postgres")))
)]
pub mod sql {
    pub use dlock_sql::*;
}

/// The project's documents, as they are in the repository's `docs/` directory: what every
/// backend guarantees (generated from the conformance results), how each held up under
/// `dlock torture`, and the benchmark figures.
pub mod docs {
    /// What every backend guarantees, promise by promise, and under failure.
    pub mod guarantees {
        #![doc = include_str!("../docs/guarantees.md")]
    }
    /// `dlock torture` runs per backend: faults injected, violations (none), report delays.
    pub mod reliability {
        #![doc = include_str!("../docs/reliability.md")]
    }
    /// `dlock bench` figures, each set against its floor measured in the same run.
    pub mod benchmarks {
        #![doc = include_str!("../docs/benchmarks.md")]
    }
    /// The `dlock bench` runs of 2026-11-22 to 2026-11-28, as written on their day.
    pub mod benchmarks_history {
        #![doc = include_str!("../docs/benchmarks-history.md")]
    }
}

/// The URL schemes this build of `dlock` can connect to (depends on the enabled features).
pub const SCHEMES: &[&str] = &[
    #[cfg(feature = "memory")]
    "memory",
    #[cfg(feature = "redis")]
    "redis",
    #[cfg(feature = "redis")]
    "rediss",
    #[cfg(feature = "redis")]
    "redis+sentinel",
    #[cfg(feature = "zookeeper")]
    "zk",
    #[cfg(feature = "mysql")]
    "mysql",
    #[cfg(feature = "mysql")]
    "mariadb",
    #[cfg(feature = "_sqlite")]
    "sqlite",
    #[cfg(feature = "postgres")]
    "postgres",
    #[cfg(feature = "postgres")]
    "postgresql",
    #[cfg(feature = "etcd")]
    "etcd",
    #[cfg(feature = "etcd")]
    "etcds",
];

/// Every scheme dlock knows, with the feature that enables it.
const KNOWN: &[(&str, &str)] = &[
    ("memory", "memory"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+sentinel", "redis"),
    ("zk", "zookeeper"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("sqlite", "sqlite"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("etcd", "etcd"),
    ("etcds", "etcd"),
];

/// Connects to the store a URL names and returns a client for it.
///
/// | scheme | backend | feature |
/// | --- | --- | --- |
/// | `memory://`, `memory://NAME` | in-process store (private, or shared by name) | `memory` |
/// | `redis://host[:port][/db]`, `rediss://…` (`?cluster=true` for a cluster seed), `redis+sentinel://s1,s2,s3/master` | Redis, Redisson-compatible | `redis` |
/// | `zk://host:port[,host:port…][/chroot][?session_timeout_ms=N]` | ZooKeeper, Curator-compatible | `zookeeper` |
/// | `mysql://user:pass@host/db[?strategy=unique-insert\|optimistic\|for-update\|get-lock]` (or `mariadb://`) | MySQL / MariaDB | `mysql` |
/// | `sqlite://path/to/locks.db[?strategy=unique-insert\|optimistic]` | embedded SQLite (file created if missing) | `sqlite` or `sqlite-unbundled` |
/// | `postgres://user:pass@host/db[?strategy=unique-insert\|optimistic\|for-update\|advisory]` (or `postgresql://`) | PostgreSQL | `postgres` |
/// | `etcd://host:port[,host:port…][/prefix][?ttl_s=N]`, `etcds://…?ca_file=…` (TLS) | etcd, compatible with `etcdctl lock` | `etcd` |
///
/// Swapping backends is a URL change: the returned [`Locks`] behaves the same everywhere,
/// within the [`Capabilities`] each backend declares.
///
/// # Errors
///
/// [`Error::Config`] for a malformed URL, an unknown scheme, or a scheme whose feature is not
/// enabled (the message names the schemes compiled in); the backend's connection errors.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://").await?;
/// let guard = locks.lock("orders/42")?.acquire().await?;
/// println!("token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
// Without any backend feature every URL is refused, and the code after the match is dead.
#[cfg_attr(
    not(any(
        feature = "memory",
        feature = "redis",
        feature = "zookeeper",
        feature = "mysql",
        feature = "_sqlite",
        feature = "postgres",
        feature = "etcd"
    )),
    allow(unreachable_code, unused_variables)
)]
pub async fn connect(url: &str) -> Result<Locks> {
    let scheme = match url.split_once("://") {
        Some((scheme, _)) if !scheme.is_empty() => scheme.to_ascii_lowercase(),
        _ => {
            return Err(Error::config(format!(
                "{:?} is not a URL: expected scheme://..., one of {}",
                dlock_core::redact(url),
                schemes_list()
            )));
        }
    };
    let provider: DynLockProvider = match scheme.as_str() {
        #[cfg(feature = "memory")]
        "memory" => Arc::new(dlock_memory::MemoryProvider::connect(url)?),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" => {
            Arc::new(dlock_redis::RedisProvider::connect(url).await?)
        }
        #[cfg(feature = "zookeeper")]
        "zk" => Arc::new(dlock_zookeeper::ZkProvider::connect(url).await?),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Arc::new(dlock_sql::SqlProvider::connect(url).await?),
        #[cfg(feature = "_sqlite")]
        "sqlite" => Arc::new(dlock_sql::SqlProvider::connect(url).await?),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Arc::new(dlock_sql::SqlProvider::connect(url).await?),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Arc::new(dlock_etcd::EtcdProvider::connect(url).await?),
        other => {
            return Err(match KNOWN.iter().find(|(s, _)| *s == other) {
                Some((_, feature)) => Error::config(format!(
                    "the scheme {other}:// needs the `{feature}` feature of dlock, which this \
                     build does not enable; compiled in: {}",
                    schemes_list()
                )),
                None => Error::config(format!(
                    "unknown scheme {other}://; compiled in: {}",
                    schemes_list()
                )),
            });
        }
    };
    Ok(Locks::new(provider))
}

/// The embedded default store: a SQLite file in the user's state directory
/// (`$XDG_STATE_HOME/dlock/locks.db`, else `~/.local/state/dlock/locks.db`, else the temporary
/// directory), as a `sqlite://` URL. Processes of one user on one host share it.
///
/// `DLOCK_URL` is not consulted here; callers that honour it check it first.
pub fn default_url() -> String {
    let dir = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| std::path::PathBuf::from(h).join(".local").join("state"))
        })
        .unwrap_or_else(std::env::temp_dir)
        .join("dlock");
    format!("sqlite://{}", dir.join("locks.db").display())
}

/// Settings beside the URL, for [`connect_with`]: credentials that should not live in a URL
/// (a URL ends up in configuration files, process lists and logs), and query parameters set in
/// code. `Debug` never shows the password. With the `serde` feature it can be read from an
/// application's configuration (`username`, `password`, and a `params` table).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let options = dlock::ConnectOptions::new().param("strategy", "optimistic");
/// # let dir = std::env::temp_dir().join(format!("dlock-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).ok();
/// # let url = format!("sqlite://{}", dir.join("locks.db").display());
/// let locks = dlock::connect_with(&url, &options).await?;
/// // On a server: dlock::connect_with("mysql://app@db:3306/locks",
/// //     &dlock::ConnectOptions::new().password(std::env::var("DB_PASSWORD")?)).await?;
/// # drop(locks);
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
#[non_exhaustive]
pub struct ConnectOptions {
    /// The user, if not in the URL.
    #[cfg_attr(feature = "serde", serde(default))]
    pub username: Option<String>,
    /// The password, if not in the URL.
    #[cfg_attr(feature = "serde", serde(default))]
    pub password: Option<String>,
    /// Query parameters added to the URL's (each at most once in the two together).
    #[cfg_attr(feature = "serde", serde(default))]
    pub params: std::collections::BTreeMap<String, String>,
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field(
                "params",
                &self
                    .params
                    .iter()
                    .map(|(k, v)| {
                        let shown = if k.to_ascii_lowercase().contains("password") {
                            "***"
                        } else {
                            v.as_str()
                        };
                        (k.as_str(), shown)
                    })
                    .collect::<std::collections::BTreeMap<_, _>>(),
            )
            .finish()
    }
}

impl ConnectOptions {
    /// No settings beyond the URL.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the user.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// Sets the password.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Sets a query parameter of the backend (`strategy`, `timeout_ms`, ...).
    pub fn param(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.params.insert(key.into(), value.into());
        self
    }

    /// `url` with these settings written into it.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if `url` has no `scheme://`, or already sets the user, the password
    /// or one of the parameters these set.
    pub fn apply(&self, url: &str) -> Result<String> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(Error::config(format!(
                "{:?} is not a URL: expected scheme://...",
                dlock_core::redact(url)
            )));
        };
        let (rest, fragment) = match rest.split_once('#') {
            Some((r, f)) => (r, Some(f)),
            None => (rest, None),
        };
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let authority_end = before_query.find('/').unwrap_or(before_query.len());
        let (userinfo, after) = match before_query[..authority_end].rfind('@') {
            Some(at) => (Some(&before_query[..at]), &before_query[at + 1..]),
            None => (None, before_query),
        };
        let (url_user, url_password) = match userinfo {
            Some(info) => match info.split_once(':') {
                Some((user, password)) => (Some(user.to_owned()), Some(password.to_owned())),
                None => (Some(info.to_owned()), None),
            },
            None => (None, None),
        };
        let twice = |what: &str| {
            Error::config(format!(
                "{}: the {what} is in both the URL and the options; give it once",
                dlock_core::redact(url)
            ))
        };
        let user = match (url_user.filter(|u| !u.is_empty()), &self.username) {
            (Some(_), Some(_)) => return Err(twice("user")),
            (Some(u), None) => Some(u),
            (None, o) => o.as_deref().map(encode),
        };
        let password = match (url_password, &self.password) {
            (Some(_), Some(_)) => return Err(twice("password")),
            (Some(p), None) => Some(p),
            (None, o) => o.as_deref().map(encode),
        };
        let mut out = format!("{scheme}://");
        if self.username.is_none() && self.password.is_none() {
            // Nothing to add: the authority stays exactly as written.
            out.push_str(before_query);
        } else {
            out.push_str(user.as_deref().unwrap_or(""));
            if let Some(password) = password {
                out.push(':');
                out.push_str(&password);
            }
            out.push('@');
            out.push_str(after);
        }
        let mut pairs: Vec<String> = query
            .filter(|q| !q.is_empty())
            .map(|q| q.split('&').map(str::to_owned).collect())
            .unwrap_or_default();
        for (key, value) in &self.params {
            let taken = pairs
                .iter()
                .any(|p| decode(p.split('=').next().unwrap_or("")) == *key);
            if taken {
                return Err(Error::config(format!(
                    "{}: the parameter {key:?} is set in both the URL and the options",
                    dlock_core::redact(url)
                )));
            }
            pairs.push(format!("{}={}", encode(key), encode(value)));
        }
        if !pairs.is_empty() {
            out.push('?');
            out.push_str(&pairs.join("&"));
        }
        if let Some(fragment) = fragment {
            out.push('#');
            out.push_str(fragment);
        }
        Ok(out)
    }
}

/// Percent-decodes `text` (bytes that do not form a valid escape stay as they are).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// [`connect`] with settings beside the URL: credentials kept out of it, and query parameters
/// set in code (see [`ConnectOptions`]).
///
/// # Errors
///
/// As [`connect`]; and [`Error::Config`] when the URL and the options both set the
/// credentials or one parameter. No message shows the password.
pub async fn connect_with(url: &str, options: &ConnectOptions) -> Result<Locks> {
    connect(&options.apply(url)?).await
}

fn schemes_list() -> String {
    if SCHEMES.is_empty() {
        return "none (enable a backend feature)".into();
    }
    SCHEMES
        .iter()
        .map(|s| format!("{s}://"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A client of one lock store: a cheap `Clone` handle over the backend's provider.
///
/// Connect once per store and clone the handle wherever it is needed (application state,
/// each task): every [`connect`] opens the backend's own pools, sessions or leases, and the
/// clones share them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let locks = dlock::connect("memory://").await?;
///
/// let rw = locks.read_write_lock("config")?;
/// let r = rw.read().await?;
/// r.release().await?;
///
/// let pool = locks.semaphore("gpu-slots", 3)?;
/// let permit = pool.acquire().await?;
/// permit.release().await?;
///
/// let a = locks.lock("a")?;
/// let b = locks.lock("b")?;
/// let both = dlock::MultiLock::new(vec![a, b])?.acquire().await?;
/// both.release().await?;
///
/// if let Some(g) = locks.lock("orders/42")?.try_acquire(Duration::from_secs(2)).await? {
///     g.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locks {
    provider: DynLockProvider,
}

impl Locks {
    /// Wraps any provider, e.g. one built with a backend crate's builder.
    pub fn new(provider: DynLockProvider) -> Self {
        Self { provider }
    }

    /// The provider behind this client.
    pub fn provider(&self) -> &DynLockProvider {
        &self.provider
    }

    /// What the backend can do.
    pub fn capabilities(&self) -> Capabilities {
        self.provider.capabilities()
    }

    /// The store's id (never with credentials).
    pub fn store_id(&self) -> &str {
        self.provider.store_id()
    }

    /// A mutex with the default options: a 30 s watchdog lease, not reentrant. Share the
    /// handle among tasks as you would a `tokio::sync::Mutex`: they exclude each other (see
    /// [`DistributedLock`] for who owns a hold).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name.
    pub fn lock(&self, name: &str) -> Result<DynLock> {
        self.provider.lock(name, LockOptions::default())
    }

    /// What the store records about `name` right now: who holds it and how, for how long,
    /// and the last fencing token. It never takes the lock.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], connection and backend errors.
    pub async fn describe(&self, name: &str) -> Result<LockStatus> {
        self.provider.describe(name).await
    }

    /// Closes the client for a clean shutdown, within [`CLOSE_WITHIN`] (10 s): releases
    /// every hold it handed out and still has, waits for the releases and undos that dropped
    /// guards and cancelled acquisitions left to background tasks, and refuses acquisitions
    /// from then on ([`Error::Closed`]). Call it before `main` returns: a runtime that shuts
    /// down drops those tasks unfinished, and what they were to undo (a queued fair waiter,
    /// a hold) stays on the store until its lease or session ends. Clones of this client
    /// share its provider, and are closed with it. See [`LockProvider::close`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://").await?;
    /// let report = locks.lock("jobs/report")?;
    /// let guard = report.acquire().await?;
    /// let closed = locks.close().await;
    /// assert!(closed.is_clean() && closed.released == 1);
    /// assert!(!guard.is_held());
    /// assert!(matches!(report.acquire().await, Err(dlock::Error::Closed { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) -> Closed {
        self.provider.close(CLOSE_WITHIN).await
    }

    /// [`close`](Self::close) within `within`.
    pub async fn close_within(&self, within: Duration) -> Closed {
        self.provider.close(within).await
    }

    /// A mutex with the given options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::InvalidArgument`] for a bad lease, and
    /// [`Error::Unsupported`] for options the backend cannot honour.
    pub fn lock_with(&self, name: &str, options: LockOptions) -> Result<DynLock> {
        self.provider.lock(name, options)
    }

    /// A read-write lock with the default options.
    ///
    /// # Errors
    ///
    /// As [`lock_with`](Self::lock_with), and `Unsupported` if the backend has none.
    pub fn read_write_lock(&self, name: &str) -> Result<DynReadWriteLock> {
        self.provider.read_write_lock(name, LockOptions::default())
    }

    /// A read-write lock with the given options.
    ///
    /// # Errors
    ///
    /// As [`lock_with`](Self::lock_with), and `Unsupported` if the backend has none.
    pub fn read_write_lock_with(
        &self,
        name: &str,
        options: LockOptions,
    ) -> Result<DynReadWriteLock> {
        self.provider.read_write_lock(name, options)
    }

    /// A semaphore with `permits` permits and the default options.
    ///
    /// # Errors
    ///
    /// As [`lock_with`](Self::lock_with), `InvalidArgument` for zero permits, and
    /// `Unsupported` if the backend has none.
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<DynSemaphore> {
        self.provider
            .semaphore(name, permits, LockOptions::default())
    }

    /// A semaphore with the given options.
    ///
    /// # Errors
    ///
    /// As [`semaphore`](Self::semaphore).
    pub fn semaphore_with(
        &self,
        name: &str,
        permits: u32,
        options: LockOptions,
    ) -> Result<DynSemaphore> {
        self.provider.semaphore(name, permits, options)
    }

    /// A leader election with the default options (a 30 s watchdog lease): one campaigner at
    /// a time leads, with a proposal the others read ([`DistributedElection::leader`]) and
    /// watch ([`DistributedElection::observe`]), in a term (the leadership's fencing token)
    /// that grows with every new leader. On etcd it is `concurrency.Election` (`etcdctl
    /// elect`), on ZooKeeper Curator's `LeaderLatch`; elsewhere the mutex of the name with
    /// the proposal beside it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://").await?;
    /// let election = locks.election("scheduler")?;
    /// let leadership = election.campaign(b"host-a:8080").await?;
    /// let leader = election.leader().await?.expect("someone leads");
    /// assert_eq!((leader.term, leader.proposal_str()), (leadership.term(), Some("host-a:8080")));
    /// tokio::select! {
    ///     () = leadership.lost() => { /* deposed: stop acting as the leader */ }
    ///     () = async { /* lead, passing leadership.term() with every write */ } => {}
    /// }
    /// leadership.resign().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], and [`Error::Unsupported`] on a backend without elections
    /// (every backend of dlock has them).
    pub fn election(&self, name: &str) -> Result<DynElection> {
        self.provider.election(name, LockOptions::default())
    }

    /// A leader election with the given options (the lease and drift allowance of its
    /// leaderships).
    ///
    /// # Errors
    ///
    /// As [`election`](Self::election), and as [`lock_with`](Self::lock_with) for the options.
    pub fn election_with(&self, name: &str, options: LockOptions) -> Result<DynElection> {
        self.provider.election(name, options)
    }
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("store", &self.provider.store_id())
            .finish()
    }
}
