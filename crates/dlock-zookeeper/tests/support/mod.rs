//! What the ZooKeeper tests share: providers and a client of their own on the server at
//! `DLOCK_ZK_URL`, views of the nodes on the server, its four-letter words, and the rigs that
//! drive faults ([`proxy`]), a private server ([`server`]), a Curator peer ([`curator`]) and
//! the ensemble of `scripts/services` ([`ensemble`]).

// Each test binary uses a part of what is here.
#![allow(dead_code)]

pub(crate) mod curator;
pub(crate) mod ensemble;
pub(crate) mod proxy;
pub(crate) mod server;

use std::path::PathBuf;
use std::time::Duration;

use dlock_conformance::{eventually, service_url};
use dlock_core::{LockGuard, LockOptions, LockProvider};
use dlock_zookeeper::zookeeper_client as zk;
use dlock_zookeeper::{ZkConfig, ZkProvider, is_recipe_node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a step of a test may take.
pub(crate) const LIMIT: Duration = Duration::from_secs(10);
pub(crate) const ZERO: Duration = Duration::ZERO;

/// ZooKeeper stores container nodes with a special ephemeral owner (`EphemeralType.CONTAINER`)
/// but reports 0 to clients, as for persistent nodes: a client can only see that a parent is
/// not ephemeral. (dlock creates parents with `CreateMode::Container`, like Curator's
/// `creatingParentContainersIfNeeded`.)
pub(crate) const CONTAINER_OWNER: i64 = 0;

/// The server the tests run against, `None` (skip) when `DLOCK_ZK_URL` is unset.
pub(crate) fn url() -> Option<String> {
    service_url("DLOCK_ZK_URL")
}

/// A provider on `url`.
pub(crate) async fn provider(url: &str) -> ZkProvider {
    ZkProvider::connect(url).await.unwrap()
}

/// A mutex on `name` of `p`, with the default options, acquired.
pub(crate) async fn hold(p: &ZkProvider, name: &str) -> LockGuard {
    p.lock(name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap()
}

/// A session of the test's own on the server of `url`, for its own calls.
pub(crate) async fn admin(url: &str) -> zk::Client {
    let config = ZkConfig::from_url(url).unwrap();
    zk::Client::connect(&config.connect_string()).await.unwrap()
}

/// The contender nodes under `path` (names only).
pub(crate) async fn recipe_children(admin: &zk::Client, path: &str) -> Vec<String> {
    match admin.list_children(path).await {
        Ok(c) => c.into_iter().filter(|c| is_recipe_node(c)).collect(),
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {path}: {e}"),
    }
}

/// Waits until `path` has `n` contender nodes.
pub(crate) async fn await_nodes(admin: &zk::Client, path: &str, n: usize, what: &str) {
    eventually(LIMIT, what, || async {
        let found = recipe_children(admin, path).await.len();
        if found == n { Ok(()) } else { Err(found) }
    })
    .await;
}

/// Whether `node` is a protected node of Curator's form: `_c_{uuid}-{marker}{10 digits}`.
pub(crate) fn is_protected(node: &str, marker: &str) -> bool {
    let Some(rest) = node.strip_prefix("_c_") else {
        return false;
    };
    let (uuid, tail) = rest.split_at(36.min(rest.len()));
    uuid.len() == 36
        && uuid
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c) || c == '-')
        && tail
            .strip_prefix('-')
            .and_then(|t| t.strip_prefix(marker))
            .is_some_and(|seq| seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()))
}

/// Ends `p`'s session on the server, as an expiry does: another client takes the session
/// over and closes it.
pub(crate) async fn close_session(p: &ZkProvider, config: &ZkConfig) {
    let thief = zk::Client::connector()
        .with_session(p.client().session().clone())
        .connect(&config.connect_string())
        .await
        .unwrap();
    drop(thief);
}

/// Waits until `p` runs on a session other than `old` (it reopened after an expiry).
pub(crate) async fn a_new_session(p: &ZkProvider, old: i64) {
    eventually(LIMIT, "a new session", || async {
        if p.session_id() != old {
            Ok(())
        } else {
            Err("old session")
        }
    })
    .await;
}

/// Sends a four-letter word to the server at `host` and returns its answer; `None` if the
/// server refuses the connection or does not answer within `within`.
pub(crate) async fn four_letter(host: &str, word: &str, within: Duration) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    stream.write_all(word.as_bytes()).await.ok()?;
    let mut out = String::new();
    tokio::time::timeout(within, stream.read_to_string(&mut out))
        .await
        .ok()?
        .ok()?;
    Some(out)
}

/// The answer of the first server of `url` to a four-letter word.
pub(crate) async fn ask(url: &str, word: &str) -> String {
    let config = ZkConfig::from_url(url).unwrap();
    four_letter(&config.hosts[0], word, LIMIT)
        .await
        .unwrap_or_else(|| panic!("{} did not answer {word}", config.hosts[0]))
}

/// The last client xid the server processed for `session` (from `cons`): it grows by one per
/// request and pings do not move it.
pub(crate) async fn last_cxid(url: &str, session: i64) -> u64 {
    let cons = ask(url, "cons").await;
    let sid = format!("sid={:#x},", session);
    let line = cons
        .lines()
        .find(|l| l.contains(&sid))
        .unwrap_or_else(|| panic!("session {sid} not in cons output:\n{cons}"));
    let lcxid = line
        .split([',', '(', ')'])
        .find_map(|f| f.strip_prefix("lcxid="))
        .unwrap_or_else(|| panic!("no lcxid in {line}"));
    u64::from_str_radix(lcxid.trim_start_matches("0x"), 16).unwrap()
}

/// Skips a test that cannot run here, unless `DLOCK_TEST_REQUIRE` is `all` or names `what`
/// (then it fails).
pub(crate) fn skip(why: &str, what: &str) {
    let require = std::env::var("DLOCK_TEST_REQUIRE").unwrap_or_default();
    if !killing_servers_compose_started(why)
        && require
            .split(',')
            .any(|r| r.trim() == "all" || r.trim().eq_ignore_ascii_case(what))
    {
        panic!("{why}, but DLOCK_TEST_REQUIRE={require} forbids skipping");
    }
    eprintln!("skipped: {why}");
}

/// Whether `why` is that a server is not this machine's `scripts/services`' to kill while the
/// servers came from compose (`DLOCK_SERVICES=compose scripts/test`): such a test skips.
fn killing_servers_compose_started(why: &str) -> bool {
    std::env::var("DLOCK_TEST_SERVERS").as_deref() == Ok("compose")
        && why.contains("not started by scripts/services")
}

/// Where the ZooKeeper and Curator jars are (`DLOCK_JAVA_DIR`, Debian's `/usr/share/java` by
/// default).
pub(crate) fn java_dir() -> PathBuf {
    PathBuf::from(std::env::var("DLOCK_JAVA_DIR").unwrap_or_else(|_| "/usr/share/java".into()))
}
