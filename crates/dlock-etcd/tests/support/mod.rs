//! The rigs the etcd tests share: providers behind proxies of their own, views of the keys on
//! the server, child processes (`etcdctl`, a frozen worker), and the servers a test starts or
//! disturbs: a private member ([`member`]), the cluster of `scripts/services` ([`cluster`])
//! and a private cluster whose members can be cut off from each other ([`switchboard`]).

// Each test binary uses a part of what is here.
#![allow(dead_code)]

pub(crate) mod cluster;
pub(crate) mod member;
pub(crate) mod switchboard;

use std::process::Stdio;
use std::time::Duration;

use dlock_conformance::{ProxyPartition, eventually, must};
use dlock_core::{LockGuard, LockOptions, LockProvider};
use dlock_etcd::etcd_client::{Client, GetOptions};
use dlock_etcd::{DEFAULT_PORT, EtcdConfig, EtcdProvider};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;

/// The tests that kill or stop processes, or are timed to the millisecond, run one at a
/// time.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The lease time-to-live of the providers a test freezes or cuts off: the server lets their
/// keys go this long after their last keep-alive.
pub(crate) const SHORT_TTL: Duration = Duration::from_secs(2);

/// `url` with the provider lease time-to-live `ttl`.
pub(crate) fn with_ttl(url: &str, ttl: Duration) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}ttl_s={}", ttl.as_secs())
}

/// The endpoints of an `etcd://` URL, for `etcdctl --endpoints`.
pub(crate) fn endpoints(url: &str) -> String {
    EtcdConfig::from_url(url).unwrap().endpoints.join(",")
}

/// Takes lock `name` of `p` with the default options.
pub(crate) async fn hold(p: &EtcdProvider, name: &str) -> LockGuard {
    p.lock(name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap()
}

/// The URL of `url`'s store (its prefix) reached at `addr` instead; `query` (`""` or `?…`)
/// is added to it.
pub(crate) fn reached_at(url: &str, addr: &str, query: &str) -> String {
    let prefix = EtcdConfig::from_url(url).unwrap().prefix;
    format!("etcd://{addr}/{}{query}", prefix.trim_end_matches('/'))
}

/// A provider whose connection to the first member of `url` goes through a proxy of its
/// own; `query` (`""` or `?…`) is added to its URL.
pub(crate) async fn proxied(url: &str, query: &str) -> (dlock_proxy::Proxy, EtcdProvider) {
    let config = EtcdConfig::from_url(url).unwrap();
    let proxy = dlock_proxy::Proxy::start(config.endpoints[0].clone())
        .await
        .unwrap();
    let p = EtcdProvider::connect(&reached_at(url, &proxy.addr().to_string(), query))
        .await
        .unwrap();
    (proxy, p)
}

/// A provider whose connection to the first member of `url` goes through a
/// [`ProxyPartition`] of its own; `query` (`""` or `?…`) is added to its URL.
pub(crate) async fn behind_partition(
    url: &str,
    query: &str,
) -> dlock_core::Result<(ProxyPartition, EtcdProvider)> {
    let first = format!("etcd://{}", EtcdConfig::from_url(url)?.endpoints[0]);
    let (cut, proxied) = ProxyPartition::start(&first, DEFAULT_PORT).await?;
    let addr = EtcdConfig::from_url(proxied.trim_end_matches('/'))?.endpoints[0].clone();
    let p = EtcdProvider::connect(&reached_at(url, &addr, query)).await?;
    Ok((cut, p))
}

/// The keys queued under lock name `lock_name`.
pub(crate) async fn queued(url: &str, lock_name: &str) -> i64 {
    let mut c = Client::connect(EtcdConfig::from_url(url).unwrap().endpoints, None)
        .await
        .unwrap();
    c.get(
        format!("{lock_name}/"),
        Some(GetOptions::new().with_prefix().with_count_only()),
    )
    .await
    .unwrap()
    .count()
}

/// Waits (5 s at most) until `n` keys are queued under lock name `lock_name`.
pub(crate) async fn await_queued(url: &str, lock_name: &str, n: i64, what: &str) {
    eventually(Duration::from_secs(5), what, || async {
        match queued(url, lock_name).await {
            k if k == n => Ok(()),
            k => Err(k),
        }
    })
    .await;
}

/// `later - earlier` with its sign, for messages.
pub(crate) fn signed(earlier: Instant, later: Instant) -> String {
    match later.checked_duration_since(earlier) {
        Some(d) => format!("+{d:?}"),
        None => format!("-{:?}", earlier - later),
    }
}

/// A child process killed (and reaped) when the test ends, however it ends.
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) lines: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    pub(crate) fn spawn(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    pub(crate) fn pid(&self) -> String {
        self.child.id().expect("the process runs").to_string()
    }

    /// The next line the process prints that `keep` accepts, within `limit`.
    pub(crate) async fn line(
        &mut self,
        limit: Duration,
        what: &str,
        keep: impl Fn(&str) -> bool,
    ) -> String {
        must(limit, what, async {
            loop {
                match self.lines.next_line().await.unwrap() {
                    Some(l) if keep(&l) => return l,
                    Some(_) => {}
                    None => panic!("{what}: the process ended first"),
                }
            }
        })
        .await
    }

    pub(crate) fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.pid()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} {}", self.pid());
    }
}

/// `etcdctl lock NAME` on the members of `url`: prints the key once it holds the lock and
/// keeps it until interrupted (its own session lease, 10 s by default).
pub(crate) fn etcdctl_lock(url: &str, lock_name: &str) -> Proc {
    etcdctl(url, &["lock", lock_name])
}

/// `etcdctl elect NAME PROPOSAL` on the members of `url`: campaigns, prints the key and the
/// proposal once it leads, and leads until interrupted (then it resigns).
pub(crate) fn etcdctl_elect(url: &str, name: &str, proposal: &str) -> Proc {
    etcdctl(url, &["elect", name, proposal])
}

/// `etcdctl elect -l NAME` on the members of `url`: prints the key and the value of each
/// leader of the election, as it comes.
pub(crate) fn etcdctl_observe(url: &str, name: &str) -> Proc {
    etcdctl(url, &["elect", "-l", name])
}

/// `etcdctl` (API 3) on the members of `url`, with `args`.
fn etcdctl(url: &str, args: &[&str]) -> Proc {
    Proc::spawn(
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints(url)))
            .args(args),
    )
}
