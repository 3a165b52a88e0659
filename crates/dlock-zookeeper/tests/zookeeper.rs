//! ZooKeeper-specific tests against the server at `DLOCK_ZK_URL`: Curator's layout, session
//! expiry, silent networks and the session's horizon, kinds sharing a name, cancellation,
//! round trips, no herd, and interop with a real Curator 5.4 peer.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dlock_conformance::{Names, Partition, ProxyPartition, eventually, must, service_url};
use dlock_core::backend::CALL_GRACE;
use dlock_core::{Error, LockGuard, LockOptions, LockProvider, LossReason};
use dlock_zookeeper::zookeeper_client as zk;
use dlock_zookeeper::{
    DEFAULT_PORT, DEFAULT_SESSION_TIMEOUT, ZkConfig, ZkProvider, is_recipe_node,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(10);
const ZERO: Duration = Duration::ZERO;

// ------------------------------------------------------------------ helpers

fn url() -> Option<String> {
    service_url("DLOCK_ZK_URL")
}

async fn provider(url: &str) -> ZkProvider {
    ZkProvider::connect(url).await.unwrap()
}

async fn admin(url: &str) -> zk::Client {
    let config = ZkConfig::from_url(url).unwrap();
    zk::Client::connect(&config.connect_string()).await.unwrap()
}

/// Ends `p`'s session on the server, as an expiry does: another client takes the session
/// over and closes it.
async fn close_session(p: &ZkProvider, config: &ZkConfig) {
    let thief = zk::Client::connector()
        .with_session(p.client().session().clone())
        .connect(&config.connect_string())
        .await
        .unwrap();
    drop(thief);
}

/// Waits until `p` runs on a session other than `old` (it reopened after an expiry).
async fn a_new_session(p: &ZkProvider, old: i64) {
    eventually(LIMIT, "a new session", || async {
        if p.session_id() != old {
            Ok(())
        } else {
            Err("old session")
        }
    })
    .await;
}

/// The contender nodes under `path` (names only).
async fn recipe_children(admin: &zk::Client, path: &str) -> Vec<String> {
    match admin.list_children(path).await {
        Ok(c) => c.into_iter().filter(|c| is_recipe_node(c)).collect(),
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {path}: {e}"),
    }
}

/// ZooKeeper stores container nodes with a special ephemeral owner (`EphemeralType.CONTAINER`)
/// but reports 0 to clients, as for persistent nodes: a client can only see that a parent is
/// not ephemeral. (dlock creates parents with `CreateMode::Container`, like Curator's
/// `creatingParentContainersIfNeeded`.)
const CONTAINER_OWNER: i64 = 0;

fn is_protected(node: &str, marker: &str) -> bool {
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

/// Sends a four-letter word to the first server of `url` and returns the answer.
async fn four_letter(url: &str, word: &str) -> String {
    let config = ZkConfig::from_url(url).unwrap();
    let mut stream = tokio::net::TcpStream::connect(&config.hosts[0])
        .await
        .unwrap();
    stream.write_all(word.as_bytes()).await.unwrap();
    let mut out = String::new();
    must(LIMIT, word, stream.read_to_string(&mut out))
        .await
        .unwrap();
    out
}

/// The last client xid the server processed for `session` (from `cons`): it grows by one per
/// request and pings do not move it.
async fn last_cxid(url: &str, session: i64) -> u64 {
    let cons = four_letter(url, "cons").await;
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

// ------------------------------------------------------------------ layout

/// A hold is exactly one EPHEMERAL_SEQUENTIAL `_c_<uuid>-lock-<10 digits>` node owned by the
/// provider's session, under CONTAINER parents, and its token is the node's czxid.
#[tokio::test(flavor = "multi_thread")]
async fn mutex_layout_is_curators() {
    let Some(url) = url() else { return };
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("orders/42");
    let path = p.lock_path(&name).unwrap();
    assert!(path.ends_with("/orders/42"), "{path}");
    let g = p
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let children = admin.list_children(&path).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let node = &children[0];
    assert!(is_protected(node, "lock-"), "{node}");
    let (_, stat) = admin.get_data(&format!("{path}/{node}")).await.unwrap();
    assert_eq!(stat.ephemeral_owner, p.session_id(), "owned by our session");
    assert_eq!(stat.data_length, 0);
    assert_eq!(g.fencing_token().get(), u64::try_from(stat.czxid).unwrap());
    // Every ancestor we created is a (container, i.e. non-ephemeral) node.
    let mut parent = path.as_str();
    while let Some(i) = parent.rfind('/').filter(|i| *i > 0) {
        let (_, stat) = admin.get_data(parent).await.unwrap();
        assert_eq!(
            stat.ephemeral_owner, CONTAINER_OWNER,
            "{parent} is not ephemeral"
        );
        parent = &parent[..i];
    }
    g.release().await.unwrap();
    assert!(admin.list_children(&path).await.unwrap().is_empty());
}

/// Read-write and semaphore layouts: `__READ__`/`__WRIT__` directly under the path, and
/// `locks` + `leases/_c_<uuid>-lease-<seq>` for semaphores; a non-reentrant mutex is a
/// `lock-` node like a reentrant one.
#[tokio::test(flavor = "multi_thread")]
async fn rw_and_semaphore_layouts_are_curators() {
    let Some(url) = url() else { return };
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let names = Names::new();

    let rw_name = names.name("rw");
    let rw_path = p.lock_path(&rw_name).unwrap();
    let rw = p.read_write_lock(&rw_name, LockOptions::default()).unwrap();
    let w = rw.write().await.unwrap();
    let r = rw.read().await.unwrap(); // downgrade
    let mut nodes = admin.list_children(&rw_path).await.unwrap();
    nodes.sort_by_key(|n| n.contains("__READ__"));
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert!(is_protected(&nodes[0], "__WRIT__"), "{nodes:?}");
    assert!(is_protected(&nodes[1], "__READ__"), "{nodes:?}");
    // The downgraded reader sorts at its writer's place: same sequence, plain EPHEMERAL.
    assert_eq!(
        nodes[0][nodes[0].len() - 10..],
        nodes[1][nodes[1].len() - 10..]
    );
    let (_, stat) = admin
        .get_data(&format!("{rw_path}/{}", nodes[0]))
        .await
        .unwrap();
    assert_eq!(w.fencing_token().get(), u64::try_from(stat.czxid).unwrap());
    w.release().await.unwrap();
    r.release().await.unwrap();
    assert!(recipe_children(&admin, &rw_path).await.is_empty());

    let sem_name = names.name("sem");
    let sem_path = p.lock_path(&sem_name).unwrap();
    let sem = p.semaphore(&sem_name, 2, LockOptions::default()).unwrap();
    let g = sem.acquire().await.unwrap();
    let leases = admin
        .list_children(&format!("{sem_path}/leases"))
        .await
        .unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert!(is_protected(&leases[0], "lease-"), "{leases:?}");
    let (_, stat) = admin
        .get_data(&format!("{sem_path}/leases/{}", leases[0]))
        .await
        .unwrap();
    assert_eq!(g.fencing_token().get(), u64::try_from(stat.czxid).unwrap());
    // The internal mutex was released once the lease was taken.
    assert!(
        admin
            .list_children(&format!("{sem_path}/locks"))
            .await
            .unwrap()
            .is_empty()
    );
    for dir in [
        sem_path.clone(),
        format!("{sem_path}/locks"),
        format!("{sem_path}/leases"),
    ] {
        let (_, stat) = admin.get_data(&dir).await.unwrap();
        assert_eq!(
            stat.ephemeral_owner, CONTAINER_OWNER,
            "{dir} is not ephemeral"
        );
    }
    g.release().await.unwrap();

    let nr_name = names.name("nr");
    let nr_path = p.lock_path(&nr_name).unwrap();
    let nr = p
        .lock(&nr_name, LockOptions::new().with_reentrant(false))
        .unwrap();
    let g = nr.acquire().await.unwrap();
    let nodes = admin.list_children(&nr_path).await.unwrap();
    assert_eq!(nodes.len(), 1, "InterProcessMutex layout: {nodes:?}");
    assert!(is_protected(&nodes[0], "lock-"), "{nodes:?}");
    g.release().await.unwrap();
}

// ------------------------------------------------------------------ faults

/// A TCP proxy to a ZooKeeper server that the test can cut: while blocked, every connection
/// through it is dropped and new ones are refused, so a client behind it cannot reconnect.
struct Proxy {
    port: u16,
    blocked: Arc<AtomicBool>,
    /// Connections accepted, refused ones included: each is a client's attempt.
    attempts: Arc<std::sync::atomic::AtomicUsize>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let blocked = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let attempts: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let accept = {
            let (blocked, conns) = (Arc::clone(&blocked), Arc::clone(&conns));
            let attempts = Arc::clone(&attempts);
            tokio::spawn(async move {
                loop {
                    let Ok((mut down, _)) = listener.accept().await else {
                        return;
                    };
                    attempts.fetch_add(1, Ordering::SeqCst);
                    if blocked.load(Ordering::SeqCst) {
                        continue; // dropped: refused
                    }
                    let upstream = upstream.clone();
                    conns.lock().unwrap().push(tokio::spawn(async move {
                        if let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                        }
                    }));
                }
            })
        };
        Self {
            port,
            blocked,
            attempts,
            conns,
            accept,
        }
    }

    fn block(&self) {
        self.blocked.store(true, Ordering::SeqCst);
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
    }

    fn unblock(&self) {
        self.blocked.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.block();
    }
}

/// Review L2: a release whose delete the server applied but whose answer was lost still
/// succeeds. The reply is held back by a proxy until the node is gone on the server, then the
/// connection is cut; the client reconnects within its session and tries the delete again,
/// and that NoNode is the first delete's own. (The old code answered `LockLost`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_release_whose_answer_was_lost_succeeds() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = dlock_proxy::Proxy::start(config.hosts[0].clone())
        .await
        .unwrap();
    let proxied = format!("zk://{}{}", proxy.addr(), config.chroot);
    let (p, admin) = (provider(&proxied).await, admin(&url).await);
    let name = Names::new().name("lost-answer");
    let path = p.lock_path(&name).unwrap();
    let g = p
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert_eq!(recipe_children(&admin, &path).await.len(), 1);

    proxy.set_fault(dlock_proxy::Fault::Downstream);
    let release = tokio::spawn(g.release());
    eventually(LIMIT, "the server deleted the node", || async {
        let n = recipe_children(&admin, &path).await.len();
        if n == 0 { Ok(()) } else { Err(n) }
    })
    .await;
    let session = p.session_id();
    proxy.reset();
    proxy.set_fault(dlock_proxy::Fault::None);
    let released = must(LIMIT, "the release", release).await.unwrap();
    assert!(
        released.is_ok(),
        "the release whose answer was lost: {released:?}"
    );
    assert_eq!(p.session_id(), session, "the same session throughout");
}

/// The session expires under a hold: while the holder is cut off (through a proxy), another
/// connection takes its session over and closes it. `lost()` fires once the holder learns of
/// it, another client acquires, and the provider goes on with a new session.
#[tokio::test(flavor = "multi_thread")]
async fn session_expiry_reports_loss() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = Proxy::start(config.hosts[0].clone()).await;
    let proxied = format!("zk://127.0.0.1:{}{}", proxy.port, config.chroot);
    let (a, b, admin) = (
        provider(&proxied).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("expire");
    let path = a.lock_path(&name).unwrap();
    let g = a
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(g.is_held());
    let old_session = a.session_id();

    proxy.block();
    eventually(LIMIT, "the hold is suspended", || async {
        match g.state() {
            dlock_core::HoldState::Suspended => Ok(()),
            other => Err(other),
        }
    })
    .await;
    close_session(&a, &config).await;
    eventually(LIMIT, "the session's node is gone", || async {
        let n = recipe_children(&admin, &path).await.len();
        if n == 0 { Ok(()) } else { Err(n) }
    })
    .await;
    assert!(!g.is_held());
    proxy.unblock();
    must(LIMIT, "lost() after session expiry", g.lost()).await;

    let lb = b.lock(&name, LockOptions::default()).unwrap();
    let g2 = must(LIMIT, "acquire after expiry", lb.acquire())
        .await
        .unwrap();
    let err = g.release().await.unwrap_err();
    assert!(matches!(err, dlock_core::Error::LockLost { .. }), "{err:?}");
    // The provider recovers with a new session.
    a_new_session(&a, old_session).await;
    let other = Names::new().name("after-expiry");
    let g3 = must(
        LIMIT,
        "acquire on the new session",
        a.lock(&other, LockOptions::default()).unwrap().acquire(),
    )
    .await
    .unwrap();
    g3.release().await.unwrap();
    g2.release().await.unwrap();
}

/// An unbounded `acquire()` waits out the expiry of its session: a waiter queued behind a
/// holder loses its session (cut off, taken over and closed), and instead of returning the
/// retryable error it queues again on the provider's new session and gets the lock once the
/// holder releases it. Before, the expiry ended the `acquire()` with that error.
#[tokio::test(flavor = "multi_thread")]
async fn an_unbounded_acquire_outlives_its_sessions_expiry() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = Proxy::start(config.hosts[0].clone()).await;
    let proxied = format!("zk://127.0.0.1:{}{}", proxy.port, config.chroot);
    let (a, b, admin) = (
        provider(&proxied).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("acquire-outlives-expiry");
    let path = a.lock_path(&name).unwrap();
    let held = b
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let l = a.lock(&name, LockOptions::default()).unwrap();
        tokio::spawn(async move { l.acquire().await })
    };
    let queued = |owner: i64| {
        let (admin, path) = (&admin, &path);
        async move {
            let nodes = recipe_children(admin, path).await;
            let mut owners = Vec::new();
            for node in &nodes {
                if let Ok((_, stat)) = admin.get_data(&format!("{path}/{node}")).await {
                    owners.push(stat.ephemeral_owner);
                }
            }
            if nodes.len() == 2 && owners.contains(&owner) {
                Ok(())
            } else {
                Err(owners)
            }
        }
    };
    let old = a.session_id();
    eventually(LIMIT, "the waiter queued", || queued(old)).await;
    proxy.block();
    close_session(&a, &config).await;
    proxy.unblock();
    a_new_session(&a, old).await;
    let new = a.session_id();
    eventually(LIMIT, "the waiter queued on the new session", || {
        queued(new)
    })
    .await;
    assert!(!waiter.is_finished(), "the waiter ended: {waiter:?}");
    held.release().await.unwrap();
    let g = must(LIMIT, "the waiter after the release", waiter)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the unbounded acquire ended with {e}"));
    g.release().await.unwrap();
}

/// Issue 16 item 3: a provider on the application's own connector. Its `digest` credentials
/// open a chroot only they may write, for the first session and for the one dlock opens after
/// the first expired; without them the same chroot is refused (`NoAuth`).
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_on_the_applications_connector() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let secret: &[u8] = b"alice:s3cret";
    let alice = zk::Client::connector()
        .with_auth("digest", secret)
        .connect(&config.connect_string())
        .await
        .unwrap();
    let root = format!(
        "/dlock-acl-{}",
        Names::new().prefix().trim_matches('/').replace('/', "-")
    );
    alice
        .create(
            &root,
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all()),
        )
        .await
        .unwrap();
    let chrooted = ZkConfig::from_url(&format!("zk://{}{root}", config.connect_string())).unwrap();
    // The provider behind a proxy, so that it cannot take its session back while the test
    // closes it.
    let proxy = Proxy::start(config.hosts[0].clone()).await;
    let proxied = ZkConfig::from_url(&format!("zk://127.0.0.1:{}{root}", proxy.port)).unwrap();
    let own = ZkProvider::connect_with(
        proxied.with_connector(zk::Client::connector().with_auth("digest", secret)),
    )
    .await
    .unwrap();
    let take = |p: &ZkProvider, name: &str| {
        let lock = p.lock(name, LockOptions::default()).unwrap();
        async move { must(LIMIT, "acquire", lock.acquire()).await }
    };
    take(&own, "x").await.unwrap().release().await.unwrap();
    let plain = ZkProvider::connect_with(chrooted).await.unwrap();
    let refused = take(&plain, "y").await.unwrap_err();
    assert!(
        format!("{refused}").contains("NoAuth") || format!("{refused:?}").contains("NoAuth"),
        "{refused:?}"
    );

    // The session expires (taken over and closed): the next one is opened with the
    // application's connector too.
    let old = own.session_id();
    proxy.block();
    close_session(&own, &config).await;
    proxy.unblock();
    a_new_session(&own, old).await;
    take(&own, "z").await.unwrap().release().await.unwrap();

    // Clean up what only alice may delete.
    let mut stack = vec![root.clone()];
    let mut all = Vec::new();
    while let Some(path) = stack.pop() {
        for child in alice.list_children(&path).await.unwrap_or_default() {
            stack.push(format!("{path}/{child}"));
        }
        all.push(path);
    }
    for path in all.iter().rev() {
        let _ = alice.delete(path, None).await;
    }
}

/// Issue 13 item 4 (review L3): 1000 holds on one provider and a forced session expiry. Every
/// guard reports `SessionExpired` within the session timeout, the provider opens exactly one
/// new session, and neither the keepers' clean-up nor dropping the guards sends a single
/// delete for nodes that went with the session (the old code sent one per hold, up to a lease
/// later).
#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_holds_lost_with_their_session_cost_no_deletes() {
    const HOLDS: usize = 1000;
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = Proxy::start(config.hosts[0].clone()).await;
    let proxied = format!(
        "zk://127.0.0.1:{}{}?session_timeout_ms=4000",
        proxy.port, config.chroot
    );
    let a = provider(&proxied).await;
    let names = Names::new();
    // A short watchdog lease, so the old code's delayed deletes of dropped guards (sent at
    // the lease end) fall inside the window checked below.
    let opts = LockOptions::new().with_lease(dlock_core::Lease::watchdog(Duration::from_secs(2)));
    let mut guards = Vec::with_capacity(HOLDS);
    for chunk in (0..HOLDS).collect::<Vec<_>>().chunks(50) {
        let acquired = futures::future::join_all(chunk.iter().map(|i| {
            let l = a.lock(&names.name(&format!("many-{i}")), opts).unwrap();
            async move { l.acquire().await.unwrap() }
        }))
        .await;
        guards.extend(acquired);
    }
    assert_eq!(a.stats().sessions, 1);
    let old_session = a.session_id();
    proxy.block();
    close_session(&a, &config).await;
    let deletes_before = a.stats().deletes;
    proxy.unblock();
    let all_lost = futures::future::join_all(guards.iter().map(|g| g.lost()));
    // Told as soon as the client hears of the expiry: within the 4 s session timeout of the
    // reconnection.
    must(
        Duration::from_secs(4),
        "every guard reports the loss",
        all_lost,
    )
    .await;
    for g in &guards {
        assert_eq!(
            g.loss_reason(),
            Some(dlock_core::LossReason::SessionExpired)
        );
    }
    eventually(LIMIT, "a new session", || async {
        if a.session_id() != old_session {
            Ok(())
        } else {
            Err("old session")
        }
    })
    .await;
    drop(guards);
    // Past the lease end of every dropped guard (when the old code sent its delete).
    let quiet_until = dlock_core::backend::from_now(Duration::from_secs(3));
    while tokio::time::Instant::now() < quiet_until {
        let sent = a.stats().deletes - deletes_before;
        assert_eq!(sent, 0, "deletes sent for nodes gone with their session");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(a.stats().sessions, 2, "one new session after the expiry");
}

/// Review L3: a provider whose session expired while the ensemble is unreachable keeps trying
/// to open a new one, but only while someone still holds the provider. The old reopen loop
/// held the session itself, so a dropped provider kept connecting for good. The client
/// declares its session expired by itself after 1.4 session timeouts cut off.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_provider_stops_reconnecting() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = Proxy::start(config.hosts[0].clone()).await;
    let proxied = format!(
        "zk://127.0.0.1:{}{}?session_timeout_ms=2000",
        proxy.port, config.chroot
    );
    let a = provider(&proxied).await;
    let old_session = a.session_id();
    let g = a
        .lock(&Names::new().name("orphan"), LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    proxy.block();
    must(LIMIT, "the hold is lost with its session", g.lost()).await;
    // The reopen loop is running against the refusing proxy.
    let seen = proxy.attempts.load(Ordering::SeqCst);
    eventually(LIMIT, "attempts to open a new session", || async {
        let now = proxy.attempts.load(Ordering::SeqCst);
        if now > seen + 1 { Ok(()) } else { Err(now) }
    })
    .await;
    assert_eq!(a.session_id(), old_session);
    drop(g);
    drop(a);
    // An attempt in flight when the provider was dropped may still end; then nothing more.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_drop = proxy.attempts.load(Ordering::SeqCst);
    // Longer than the loop's longest pause (5 s).
    let quiet_until = dlock_core::backend::from_now(Duration::from_secs(7));
    while tokio::time::Instant::now() < quiet_until {
        let now = proxy.attempts.load(Ordering::SeqCst);
        assert_eq!(now, after_drop, "a dropped provider is still connecting");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waiters dropped at many moments (0..30 ms, and sub-millisecond) while another holds the
/// lock, or every permit of a semaphore, leave no node behind: only the holder's node (or
/// lease) is left, and the semaphore's internal mutex is free. (Review T5: the semaphore half
/// used to open a free semaphore and discard the outcome, so it never cancelled a waiter.)
#[tokio::test(flavor = "multi_thread")]
async fn cancelled_creates_leave_no_znode() {
    let Some(url) = url() else { return };
    let (a, b, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let names = Names::new();
    let name = names.name("cancel-create");
    let sem_name = names.name("cancel-create-sem");
    let path = a.lock_path(&name).unwrap();
    let sem_path = a.lock_path(&sem_name).unwrap();
    let g = a
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let permit = a
        .semaphore(&sem_name, 1, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let holder = recipe_children(&admin, &path).await;
    assert_eq!(holder.len(), 1);
    let lease = recipe_children(&admin, &format!("{sem_path}/leases")).await;
    assert_eq!(lease.len(), 1);
    let cuts = (0..10u64)
        .map(|i| Duration::from_micros(i * 100))
        .chain((1..30u64).map(Duration::from_millis));
    for cut in cuts {
        // A fresh handle each time, so no re-entry state is shared.
        let lb = b.lock(&name, LockOptions::default()).unwrap();
        let r = tokio::time::timeout(cut, lb.acquire()).await;
        assert!(r.is_err(), "acquired a held lock");
        let rs = b.semaphore(&sem_name, 1, LockOptions::default()).unwrap();
        let r = tokio::time::timeout(cut, rs.acquire()).await;
        assert!(r.is_err(), "acquired the permit another holds");
    }
    eventually(LIMIT, "only the holders' nodes are left", || async {
        let now = recipe_children(&admin, &path).await;
        let locks = recipe_children(&admin, &format!("{sem_path}/locks")).await;
        let leases = recipe_children(&admin, &format!("{sem_path}/leases")).await;
        if now == holder && locks.is_empty() && leases == lease {
            Ok(())
        } else {
            Err(format!(
                "lock {now:?}; semaphore mutex {locks:?}, leases {leases:?}"
            ))
        }
    })
    .await;
    permit.release().await.unwrap();
    g.release().await.unwrap();
}

// ------------------------------------------------------------------ silence and the horizon

/// With the default settings (a 10 s session, the 30 s watchdog lease), a holder whose network
/// goes silent (a proxy that keeps its connections open and moves no byte) is told its hold is
/// lost strictly before another client's `acquire()` returns, by at least 1 % of the lease:
/// the session's horizon (the send time of the last request the server answered, plus three
/// quarters of the negotiated session timeout) comes before the server can expire the
/// session. Without it, `lost()` waited for the client library to give the session up, 1.4
/// session timeouts after it last heard from the server: after the server had expired the
/// session and the waiter had got in.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_holder_is_told_before_the_next_grant_with_default_settings() {
    let Some(url) = url() else { return };
    let (cut, proxied) = ProxyPartition::start(&url, DEFAULT_PORT).await.unwrap();
    let (a, b, admin) = (
        provider(&proxied).await,
        provider(&url).await,
        admin(&url).await,
    );
    assert_eq!(a.config().session_timeout, DEFAULT_SESSION_TIMEOUT);
    let name = Names::new().name("silent-default");
    let path = a.lock_path(&name).unwrap();
    let options = LockOptions::default();
    let lease = options.lease.ttl();
    let g = a.lock(&name, options).unwrap().acquire().await.unwrap();
    let waiter = {
        let l = b.lock(&name, options).unwrap();
        tokio::spawn(async move {
            let g = l.acquire().await;
            (Instant::now(), g)
        })
    };
    eventually(LIMIT, "the other client waits", || async {
        let n = recipe_children(&admin, &path).await.len();
        if n == 2 { Ok(()) } else { Err(n) }
    })
    .await;
    let lost_at = Arc::new(Mutex::new(None));
    {
        let (lost, lost_at) = (g.lost(), Arc::clone(&lost_at));
        tokio::spawn(async move {
            lost.await;
            lost_at.lock().unwrap().get_or_insert_with(Instant::now);
        });
    }
    let cut_at = Instant::now();
    cut.set_partitioned(true);
    let (granted_at, next) = must(Duration::from_secs(40), "the other client's grant", waiter)
        .await
        .unwrap();
    let lost_at = lost_at.lock().unwrap().take();
    cut.set_partitioned(false);
    let next = next.unwrap();
    let lost_at = lost_at.unwrap_or_else(|| {
        panic!(
            "lost() had not resolved when the other client got the lock, {:?} after the cut",
            granted_at - cut_at
        )
    });
    let margin = granted_at.saturating_duration_since(lost_at);
    eprintln!(
        "silent holder, default settings: cut at 0, lost() at {:?}, the next grant at {:?}: \
         margin {margin:?}",
        lost_at - cut_at,
        granted_at - cut_at
    );
    assert!(lost_at < granted_at);
    assert!(
        margin >= lease / 100,
        "lost() resolved only {margin:?} before the next grant"
    );
    assert_eq!(g.loss_reason(), Some(LossReason::SessionTimedOut));
    next.release().await.unwrap();
}

/// A hold that makes no calls (its watchdog renews every 10 s) on a 2 s session stays held
/// for several session timeouts: while holds are live, the provider probes the server
/// (`exists("/")`) whenever it heard nothing for a quarter of the session timeout, which
/// keeps the session's horizon (three quarters of the timeout after the last answer) ahead.
/// The probes are counted apart from the recipes' calls.
#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_hold_is_kept_by_probes_that_calls_do_not_count() {
    let Some(url) = url() else { return };
    let p = provider(&format!("{url}?session_timeout_ms=2000")).await;
    let name = Names::new().name("probed");
    let g = p
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let before = p.stats();
    let lost = tokio::time::timeout(Duration::from_secs(4), g.lost()).await;
    assert!(
        lost.is_err() && g.is_held(),
        "a quiet hold was lost: {:?}",
        g.loss_reason()
    );
    let probes = p.stats().probes - before.probes;
    assert!(probes >= 6, "{probes} probes in two session timeouts");
    assert_eq!(p.stats().calls(), before.calls(), "probes counted as calls");
    g.release().await.unwrap();
    // No hold, no probes.
    let idle = p.stats().probes;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(p.stats().probes, idle, "probes without a live hold");
}

/// A waiter whose session goes silent (queued behind a holder when the proxy in front of it
/// stops moving bytes; its client then loses the connection and cannot get another) gets a
/// retryable error at its deadline, not `Ok(None)`: nothing the store said since the silence
/// began says the lock is still held. The backend answers so itself, within a second of the
/// deadline; before, only the core's cut-off of an overrunning call (`CALL_GRACE` later) did,
/// while the waiter waited for the delete of its node.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_on_a_silent_session_gets_an_error_not_a_held_lock() {
    let Some(url) = url() else { return };
    let (cut, proxied) = ProxyPartition::start(&url, DEFAULT_PORT).await.unwrap();
    // A 4 s session: the client gives its connection up after 1.6 s of silence, and the
    // session after 5.6 s, after the deadline.
    let w = provider(&format!("{proxied}?session_timeout_ms=4000")).await;
    let (h, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("silent-waiter");
    let path = h.lock_path(&name).unwrap();
    let held = h
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let watches = w.stats().get_data;
    let wait = Duration::from_millis(2500);
    let started = Instant::now();
    let attempt = {
        let l = w.lock(&name, LockOptions::default()).unwrap();
        tokio::spawn(async move { l.try_acquire(wait).await })
    };
    eventually(LIMIT, "the waiter queued and watches", || async {
        let n = recipe_children(&admin, &path).await.len();
        let watching = w.stats().get_data - watches;
        if n == 2 && watching == 1 {
            Ok(())
        } else {
            Err((n, watching))
        }
    })
    .await;
    cut.set_partitioned(true);
    let answer = must(LIMIT, "the waiter's answer", attempt).await.unwrap();
    let took = started.elapsed();
    cut.set_partitioned(false);
    match answer {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        Ok(None) => panic!("a silent store was taken for a lock held by someone"),
        Ok(Some(g)) => panic!("granted through a silent line: {g:?}"),
    }
    // Within a second of the deadline, well before the core's cut-off.
    assert!(
        took < wait + CALL_GRACE * 3 / 4,
        "answered {:?} after the deadline",
        took - wait
    );
    held.release().await.unwrap();
}

// ------------------------------------------------------------------ kinds on one name

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mutex,
    NonReentrant,
    Read,
    Write,
    Permit,
}

/// Tries for `kind` on `name` through `p`, waiting at most `wait`.
async fn try_kind(
    p: &ZkProvider,
    name: &str,
    kind: Kind,
    wait: Duration,
) -> dlock_core::Result<Option<LockGuard>> {
    let opts = LockOptions::default();
    match kind {
        Kind::Mutex => p.lock(name, opts)?.try_acquire(wait).await,
        Kind::NonReentrant => {
            p.lock(name, opts.with_reentrant(false))?
                .try_acquire(wait)
                .await
        }
        Kind::Read => p.read_write_lock(name, opts)?.try_read(wait).await,
        Kind::Write => p.read_write_lock(name, opts)?.try_write(wait).await,
        Kind::Permit => p.semaphore(name, 2, opts)?.try_acquire(wait).await,
    }
}

/// Every pair of kinds on one name, both orders: while the first is held, the second is never
/// granted. Locks (mutexes reentrant or not, readers, writers) queue together, a mutex node
/// counting as a writer: the second waits, queued, and gets in once the first is released. A
/// lock and a semaphore are refused with a non-retryable `InvalidArgument` naming the kind in
/// use, and the refused kind gets in once the name is free. Before, a mutex and a read-write
/// lock, a reentrant and a non-reentrant mutex, and a lock and a semaphore of one name ignored
/// each other and were held together.
#[tokio::test(flavor = "multi_thread")]
async fn kinds_on_one_name_never_hold_together() {
    use Kind::{Mutex as M, NonReentrant as N, Permit as P, Read as R, Write as W};
    let Some(url) = url() else { return };
    let (a, b, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let names = Names::new();
    let pairs = [
        (M, W),
        (W, M),
        (M, R),
        (R, M),
        (M, N),
        (N, M),
        (M, P),
        (P, M),
        (W, P),
        (P, W),
    ];
    for (first, second) in pairs {
        let name = names.name(&format!("{first:?}-{second:?}").to_lowercase());
        let path = a.lock_path(&name).unwrap();
        let held = try_kind(&a, &name, first, LIMIT)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{first:?} on a fresh name"));
        let with_semaphore = first == P || second == P;
        let asked = try_kind(&b, &name, second, Duration::from_millis(300)).await;
        match asked {
            Ok(None) if !with_semaphore => {}
            Err(Error::InvalidArgument { reason, .. }) if with_semaphore => {
                let in_use = if first == P { "a semaphore" } else { "a lock" };
                assert!(
                    reason.contains(&format!("is in use as {in_use}")),
                    "{first:?} then {second:?}: {reason}"
                );
            }
            Ok(Some(g)) => panic!("{second:?} granted beside {first:?}: {g:?}"),
            other => panic!("{second:?} beside {first:?}: {other:?}"),
        }
        if with_semaphore {
            assert!(held.is_held(), "{first:?} disturbed");
            held.release().await.unwrap();
            let g = try_kind(&b, &name, second, LIMIT).await.unwrap();
            g.unwrap_or_else(|| panic!("{second:?} after {first:?} was released"))
                .release()
                .await
                .unwrap();
            continue;
        }
        // Queued behind the first, granted once it is released.
        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move { try_kind(&b, &name, second, LIMIT * 2).await })
        };
        eventually(LIMIT, "the second kind queued", || async {
            let n = recipe_children(&admin, &path).await.len();
            if n == 2 { Ok(()) } else { Err(n) }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "{second:?} got in beside {first:?}");
        assert!(held.is_held(), "{first:?} disturbed");
        held.release().await.unwrap();
        let g = must(LIMIT * 2, "the second kind after the release", waiter)
            .await
            .unwrap()
            .unwrap();
        g.unwrap_or_else(|| panic!("{second:?} after {first:?} was released"))
            .release()
            .await
            .unwrap();
    }
}

// ------------------------------------------------------------------ round trips and herd

/// An uncontended acquire + release is create + getChildren + delete and nothing more: counted
/// by the provider, and by the server (`cons`: the session's last client xid moves by 3).
#[tokio::test(flavor = "multi_thread")]
async fn uncontended_cycle_is_three_calls() {
    let Some(url) = url() else { return };
    let p = provider(&url).await;
    let name = Names::new().name("round-trips");
    let l = p.lock(&name, LockOptions::default()).unwrap();
    // Warm up: the first acquisition also creates the parents.
    l.acquire().await.unwrap().release().await.unwrap();
    for _ in 0..3 {
        let before = p.stats();
        let xid = last_cxid(&url, p.session_id()).await;
        let g = l.acquire().await.unwrap();
        g.release().await.unwrap();
        let after = p.stats();
        let server = last_cxid(&url, p.session_id()).await - xid;
        assert_eq!(after.creates - before.creates, 1, "{before:?} -> {after:?}");
        assert_eq!(after.get_children - before.get_children, 1);
        assert_eq!(after.deletes - before.deletes, 1);
        assert_eq!(after.calls() - before.calls(), 3, "{before:?} -> {after:?}");
        assert_eq!(server, 3, "requests the server saw for one cycle");
    }
}

/// 8 waiters queued on one name: each release wakes exactly one waiter.
#[tokio::test(flavor = "multi_thread")]
async fn one_release_wakes_one_waiter() {
    const WAITERS: usize = 8;
    let Some(url) = url() else { return };
    let (h, w, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("herd");
    let path = h.lock_path(&name).unwrap();
    let holder = h
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let before = w.stats();
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let l = w.lock(&name, LockOptions::default()).unwrap();
        tasks.push(tokio::spawn(async move {
            let g = l.acquire().await.unwrap();
            g.release().await.unwrap();
        }));
    }
    // The server's own view too (review T7: the counts are the library's): its watches by
    // path (`wchp`) show one watched node per waiter, each a contender node. Waited for with
    // the library's count, which goes up when a getData is sent, before the server has
    // registered its watch (a stress run read `wchp` in between).
    let watched = |wchp: &str| -> Vec<String> {
        wchp.lines()
            .filter(|l| l.starts_with('/') && l.contains(path.as_str()))
            .map(str::to_owned)
            .collect()
    };
    let wchp = eventually(LIMIT, "every waiter watches its predecessor", || async {
        let queued = recipe_children(&admin, &path).await.len();
        let watching = w.stats().get_data - before.get_data;
        let wchp = four_letter(&url, "wchp").await;
        let on_server = watched(&wchp).len();
        if queued == WAITERS + 1 && watching == WAITERS as u64 && on_server >= WAITERS {
            Ok(wchp)
        } else {
            Err(format!(
                "{queued} nodes, {watching} watches sent, {on_server} on the server"
            ))
        }
    })
    .await;
    assert_eq!(
        w.wakeups(),
        before.wakeups,
        "nobody woke while the holder held"
    );
    // No watch on the lock's node itself (a children watch there would wake every waiter at
    // each change), and no more than one per waiter.
    let watched = watched(&wchp);
    assert!(
        !watched.iter().any(|l| l.ends_with(path.as_str())),
        "a watch on the lock's node: {watched:?}"
    );
    assert_eq!(watched.len(), WAITERS, "watched nodes: {watched:?}");
    holder.release().await.unwrap();
    for t in must(LIMIT, "8 handoffs", futures::future::join_all(tasks)).await {
        t.unwrap();
    }
    assert_eq!(
        w.wakeups() - before.wakeups,
        WAITERS as u64,
        "one wake-up per handoff"
    );
}

// ------------------------------------------------------------------ Curator interop

const JARS: &[&str] = &[
    "curator-recipes.jar",
    "curator-framework.jar",
    "curator-client.jar",
    "guava.jar",
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
    "netty-handler.jar",
    "netty-transport.jar",
    "netty-common.jar",
    "netty-buffer.jar",
    "netty-resolver.jar",
    "netty-codec.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
];

/// Compiles `tests/java/CuratorPeer.java` once per test binary; `None` (skip) if `javac` or a
/// jar is missing, unless `DLOCK_TEST_REQUIRE=all`.
fn curator_classpath() -> Option<String> {
    static CLASSPATH: OnceLock<Option<String>> = OnceLock::new();
    CLASSPATH
        .get_or_init(|| {
            let skip = |why: String| {
                if std::env::var("DLOCK_TEST_REQUIRE").as_deref() == Ok("all") {
                    panic!("Curator interop cannot run: {why}, but DLOCK_TEST_REQUIRE=all");
                }
                eprintln!("skipped: Curator interop: {why}");
                None
            };
            let java_dir = PathBuf::from(
                std::env::var("DLOCK_JAVA_DIR").unwrap_or_else(|_| "/usr/share/java".into()),
            );
            let mut jars = Vec::new();
            for jar in JARS {
                let p = java_dir.join(jar);
                if !p.exists() {
                    return skip(format!("{} is missing", p.display()));
                }
                jars.push(p.display().to_string());
            }
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("curator-peer-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&out);
            std::fs::create_dir_all(&out).unwrap();
            let source =
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java/CuratorPeer.java");
            let jar_path = jars.join(":");
            let status = match std::process::Command::new("javac")
                .args(["-nowarn", "-cp", &jar_path, "-d"])
                .arg(&out)
                .arg(&source)
                .status()
            {
                Ok(s) => s,
                Err(e) => return skip(format!("javac cannot run ({e})")),
            };
            assert!(status.success(), "javac failed on {}", source.display());
            Some(format!("{}:{jar_path}", out.display()))
        })
        .clone()
}

/// A running Curator peer.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Peer {
    async fn start(url: &str, args: &[&str]) -> Self {
        let classpath = curator_classpath().unwrap();
        let config = ZkConfig::from_url(url).unwrap();
        let mut child = Command::new("java")
            .args([
                "-Xmx128m",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                &classpath,
                "CuratorPeer",
            ])
            .arg(config.connect_string())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// Waits for the next line the peer prints and checks it.
    async fn expect(&mut self, want: &str) {
        let line = must(
            Duration::from_secs(20),
            &format!("peer prints {want}"),
            self.lines.next_line(),
        )
        .await
        .unwrap();
        assert_eq!(
            line.as_deref(),
            Some(want),
            "the Curator peer said {line:?}"
        );
    }

    /// Checks the peer is still waiting: it says nothing (no ACQUIRED) for 300 ms. Called
    /// once its node is queued, so a peer that wrongly got in has every chance to say so.
    async fn still_waiting(&mut self, what: &str) {
        if let Ok(line) =
            tokio::time::timeout(Duration::from_millis(300), self.lines.next_line()).await
        {
            panic!("{what}: the Curator peer said {line:?} while it should still wait");
        }
    }

    /// Tells the peer to release, and waits until it has.
    async fn release(&mut self) {
        let mut stdin = self.stdin.take().unwrap();
        stdin.write_all(b"release\n").await.unwrap();
        drop(stdin);
        self.expect("RELEASED").await;
        self.finish().await;
    }

    async fn finish(&mut self) {
        let status = must(LIMIT, "peer exits", self.child.wait()).await.unwrap();
        assert!(status.success(), "peer exited with {status}");
    }
}

/// Curator's `InterProcessMutex` and a dlock mutex on the same path exclude each other, both
/// ways, and wake each other.
#[tokio::test(flavor = "multi_thread")]
async fn curator_mutex_interop() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("interop/mutex");
    let path = p.lock_path(&name).unwrap();
    let l = p.lock(&name, LockOptions::default()).unwrap();

    // Curator holds: dlock cannot get in, then gets in after Curator's release.
    let mut java = Peer::start(&url, &["mutex", &path, "60000"]).await;
    java.expect("WAITING").await;
    java.expect("ACQUIRED").await;
    assert!(
        l.try_acquire(ZERO).await.unwrap().is_none(),
        "dlock got in while Curator holds"
    );
    let waiter = {
        let l = p.lock(&name, LockOptions::default()).unwrap();
        tokio::spawn(async move { l.acquire().await })
    };
    eventually(LIMIT, "dlock queued behind Curator", || async {
        let n = recipe_children(&admin, &path).await.len();
        if n == 2 { Ok(()) } else { Err(n) }
    })
    .await;
    assert!(!waiter.is_finished(), "dlock got in while Curator holds");
    java.release().await;
    let g = must(LIMIT, "dlock after Curator's release", waiter)
        .await
        .unwrap()
        .unwrap();

    // dlock holds: Curator's timed acquire fails, and a waiting Curator gets in after release.
    let mut java = Peer::start(&url, &["mutex", &path, "60000", "tryacquire", "300"]).await;
    java.expect("WAITING").await;
    java.expect("TIMEOUT").await;
    java.finish().await;
    let mut java = Peer::start(&url, &["mutex", &path, "60000", "tryacquire", "20000"]).await;
    java.expect("WAITING").await;
    eventually(LIMIT, "Curator queued behind dlock", || async {
        let n = recipe_children(&admin, &path).await.len();
        if n == 2 { Ok(()) } else { Err(n) }
    })
    .await;
    java.still_waiting("Curator behind dlock's hold").await;
    g.release().await.unwrap();
    java.expect("ACQUIRED").await;
    assert!(l.try_acquire(ZERO).await.unwrap().is_none());
    java.release().await;
    l.try_acquire(LIMIT)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Curator's `InterProcessMutex` and a dlock mutex built `reentrant(false)` on the same path
/// exclude each other both ways: a non-reentrant dlock mutex is a `lock-` node like a
/// reentrant one. Each side's waiter is queued and still waiting while the other holds, and
/// gets in after its release. (Curator's own non-reentrant `InterProcessSemaphoreMutex` is a
/// one-lease semaphore to dlock.)
#[tokio::test(flavor = "multi_thread")]
async fn curator_mutex_and_a_non_reentrant_dlock_mutex_exclude_each_other() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("interop/nonreentrant");
    let path = p.lock_path(&name).unwrap();
    let opts = LockOptions::new().with_reentrant(false);
    let l = p.lock(&name, opts).unwrap();

    // Curator holds: dlock cannot get in; a dlock waiter queues and waits for the release.
    let mut java = Peer::start(&url, &["mutex", &path, "60000"]).await;
    java.expect("WAITING").await;
    java.expect("ACQUIRED").await;
    assert!(
        l.try_acquire(ZERO).await.unwrap().is_none(),
        "dlock got in while Curator's mutex holds"
    );
    let waiter = {
        let l = p.lock(&name, opts).unwrap();
        tokio::spawn(async move { l.acquire().await })
    };
    eventually(LIMIT, "dlock queued behind Curator", || async {
        let n = recipe_children(&admin, &path).await.len();
        if n == 2 { Ok(()) } else { Err(n) }
    })
    .await;
    assert!(!waiter.is_finished(), "dlock got in while Curator holds");
    java.release().await;
    let g = must(LIMIT, "dlock after Curator's release", waiter)
        .await
        .unwrap()
        .unwrap();

    // dlock holds: Curator's timed acquire fails; a waiting Curator gets in after the release.
    let mut java = Peer::start(&url, &["mutex", &path, "60000", "tryacquire", "300"]).await;
    java.expect("WAITING").await;
    java.expect("TIMEOUT").await;
    java.finish().await;
    let mut java = Peer::start(&url, &["mutex", &path, "60000", "tryacquire", "20000"]).await;
    java.expect("WAITING").await;
    eventually(LIMIT, "Curator queued behind dlock", || async {
        let n = recipe_children(&admin, &path).await.len();
        if n == 2 { Ok(()) } else { Err(n) }
    })
    .await;
    java.still_waiting("Curator's mutex behind dlock's non-reentrant hold")
        .await;
    g.release().await.unwrap();
    java.expect("ACQUIRED").await;
    assert!(l.try_acquire(ZERO).await.unwrap().is_none());
    java.release().await;
    l.try_acquire(LIMIT)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A Curator writer against a dlock downgrade: dlock writes, takes the read lock too, and lets
/// the write go. A Curator writer that arrives then waits for dlock's read (a downgraded read
/// is a read like any other), and gets in once it is released.
#[tokio::test(flavor = "multi_thread")]
async fn curator_writer_waits_for_a_dlock_downgrade() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("interop/downgrade");
    let path = p.lock_path(&name).unwrap();
    let rw = p.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = rw.try_write(LIMIT).await.unwrap().expect("write");
    let r = rw
        .try_read(LIMIT)
        .await
        .unwrap()
        .expect("the writer reads too");
    w.release().await.unwrap();
    assert!(r.is_held(), "the downgraded read outlives the write");

    let mut java = Peer::start(&url, &["write", &path, "60000", "tryacquire", "20000"]).await;
    java.expect("WAITING").await;
    eventually(
        LIMIT,
        "Curator's write queued behind dlock's read",
        || async {
            let n = recipe_children(&admin, &path).await.len();
            if n == 2 { Ok(()) } else { Err(n) }
        },
    )
    .await;
    java.still_waiting("a Curator writer during dlock's downgraded read")
        .await;
    r.release().await.unwrap();
    java.expect("ACQUIRED").await;
    assert!(
        rw.try_read(ZERO).await.unwrap().is_none(),
        "dlock read during Curator's write"
    );
    java.release().await;
}

/// Mixed read/write queues across the two clients: a dlock reader holds; a Curator writer
/// queues behind it; a dlock reader that arrives after the writer queues behind the writer
/// (readers do not pass a queued writer, in Curator's layout) and gets in only after the
/// writer has had its turn.
#[tokio::test(flavor = "multi_thread")]
async fn mixed_read_write_queues_with_curator() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let (p, p2, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("interop/queue");
    let path = p.lock_path(&name).unwrap();
    let rw = p.read_write_lock(&name, LockOptions::default()).unwrap();
    let r1 = rw.try_read(LIMIT).await.unwrap().expect("first read");

    let mut java = Peer::start(&url, &["write", &path, "60000", "tryacquire", "20000"]).await;
    java.expect("WAITING").await;
    eventually(
        LIMIT,
        "Curator's write queued behind the first read",
        || async {
            let n = recipe_children(&admin, &path).await.len();
            if n == 2 { Ok(()) } else { Err(n) }
        },
    )
    .await;
    let late_reader = {
        let rw2 = p2.read_write_lock(&name, LockOptions::default()).unwrap();
        tokio::spawn(async move {
            let r = rw2.read().await?;
            r.release().await
        })
    };
    eventually(
        LIMIT,
        "the late read queued behind Curator's write",
        || async {
            let n = recipe_children(&admin, &path).await.len();
            if n == 3 { Ok(()) } else { Err(n) }
        },
    )
    .await;
    java.still_waiting("Curator's write behind the first read")
        .await;
    assert!(
        !late_reader.is_finished(),
        "a read that came after a queued writer got in first"
    );

    r1.release().await.unwrap();
    java.expect("ACQUIRED").await;
    assert!(
        !late_reader.is_finished(),
        "a read got in during Curator's write"
    );
    java.release().await;
    must(LIMIT, "the late read after Curator's write", late_reader)
        .await
        .unwrap()
        .unwrap();
}

/// Curator's `InterProcessReadWriteLock` and dlock's read-write lock: writer against writer,
/// reader against writer, readers share — both ways.
#[tokio::test(flavor = "multi_thread")]
async fn curator_rwlock_interop() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let p = provider(&url).await;
    let name = Names::new().name("interop/rw");
    let path = p.lock_path(&name).unwrap();
    let rw = p.read_write_lock(&name, LockOptions::default()).unwrap();

    // Curator writes: dlock can neither write nor read.
    let mut java = Peer::start(&url, &["write", &path, "60000"]).await;
    java.expect("WAITING").await;
    java.expect("ACQUIRED").await;
    assert!(
        rw.try_write(ZERO).await.unwrap().is_none(),
        "write during Curator's write"
    );
    assert!(
        rw.try_read(ZERO).await.unwrap().is_none(),
        "read during Curator's write"
    );
    java.release().await;

    // Curator reads: dlock reads too, but cannot write.
    let mut java = Peer::start(&url, &["read", &path, "60000"]).await;
    java.expect("WAITING").await;
    java.expect("ACQUIRED").await;
    let r = rw.try_read(LIMIT).await.unwrap().expect("readers share");
    r.release().await.unwrap();
    assert!(
        rw.try_write(ZERO).await.unwrap().is_none(),
        "write during Curator's read"
    );
    java.release().await;

    // dlock writes: Curator can neither write nor read.
    let w = rw.try_write(LIMIT).await.unwrap().expect("write");
    for mode in ["write", "read"] {
        let mut java = Peer::start(&url, &[mode, &path, "60000", "tryacquire", "300"]).await;
        java.expect("WAITING").await;
        java.expect("TIMEOUT").await;
        java.finish().await;
    }
    w.release().await.unwrap();

    // dlock reads: Curator reads too, Curator's write waits until dlock's read is released.
    let r = rw.try_read(LIMIT).await.unwrap().expect("read");
    let mut reader = Peer::start(&url, &["read", &path, "60000", "tryacquire", "10000"]).await;
    reader.expect("WAITING").await;
    reader.expect("ACQUIRED").await;
    reader.release().await;
    let mut writer = Peer::start(&url, &["write", &path, "60000", "tryacquire", "300"]).await;
    writer.expect("WAITING").await;
    writer.expect("TIMEOUT").await;
    writer.finish().await;
    r.release().await.unwrap();
    let mut writer = Peer::start(&url, &["write", &path, "60000", "tryacquire", "10000"]).await;
    writer.expect("WAITING").await;
    writer.expect("ACQUIRED").await;
    writer.release().await;
}

/// Curator's `InterProcessSemaphoreV2` with N leases counts dlock's permits, and the other way
/// round.
#[tokio::test(flavor = "multi_thread")]
async fn curator_semaphore_interop() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let p = provider(&url).await;
    let name = Names::new().name("interop/sem");
    let path = p.lock_path(&name).unwrap();
    let sem = p.semaphore(&name, 2, LockOptions::default()).unwrap();

    // dlock holds both permits: Curator's timed acquire fails.
    let g1 = sem.try_acquire(LIMIT).await.unwrap().expect("permit 1");
    let g2 = sem.try_acquire(LIMIT).await.unwrap().expect("permit 2");
    let mut java = Peer::start(
        &url,
        &[
            "semaphore",
            &path,
            "60000",
            "tryacquire",
            "300",
            "permits",
            "2",
        ],
    )
    .await;
    java.expect("WAITING").await;
    java.expect("TIMEOUT").await;
    java.finish().await;

    // A waiting Curator gets the permit dlock releases; then dlock counts Curator's lease.
    let mut java = Peer::start(
        &url,
        &[
            "semaphore",
            &path,
            "60000",
            "tryacquire",
            "20000",
            "permits",
            "2",
        ],
    )
    .await;
    java.expect("WAITING").await;
    g1.release().await.unwrap();
    java.expect("ACQUIRED").await;
    assert!(
        sem.try_acquire(ZERO).await.unwrap().is_none(),
        "a 3rd permit of 2"
    );
    java.release().await;
    let g3 = sem
        .try_acquire(LIMIT)
        .await
        .unwrap()
        .expect("Curator's lease came back");
    g3.release().await.unwrap();
    g2.release().await.unwrap();
}

// ------------------------------------------------------------------ server restart

/// A standalone ZooKeeper of our own on a free loopback port (Debian's jars); killed on drop.
struct PrivateZk {
    port: u16,
    dir: PathBuf,
    child: Option<std::process::Child>,
}

impl PrivateZk {
    /// Starts one, or returns `None` (skip) when the jars or `java` are missing and skipping is
    /// allowed.
    async fn start() -> Option<Self> {
        let java_dir = PathBuf::from(
            std::env::var("DLOCK_JAVA_DIR").unwrap_or_else(|_| "/usr/share/java".into()),
        );
        let missing = !java_dir.join("zookeeper.jar").exists()
            || std::process::Command::new("java")
                .arg("-version")
                .stderr(Stdio::null())
                .status()
                .is_err();
        if missing {
            if std::env::var("DLOCK_TEST_REQUIRE").as_deref() == Ok("all") {
                panic!("java or zookeeper.jar is missing but DLOCK_TEST_REQUIRE=all");
            }
            eprintln!("skipped: java or zookeeper.jar is missing");
            return None;
        }
        let port = dlock_conformance::tls::free_port().expect("a free loopback port");
        let dir = std::env::temp_dir().join(format!("dlock-zk-test-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            port,
            dir,
            child: None,
        };
        server.spawn().await;
        Some(server)
    }

    fn url(&self, query: &str) -> String {
        format!("zk://127.0.0.1:{}{query}", self.port)
    }

    async fn spawn(&mut self) {
        let java_dir = PathBuf::from(
            std::env::var("DLOCK_JAVA_DIR").unwrap_or_else(|_| "/usr/share/java".into()),
        );
        let classpath = [
            "zookeeper.jar",
            "zookeeper-jute.jar",
            "slf4j-api.jar",
            "slf4j-nop.jar",
        ]
        .iter()
        .map(|j| java_dir.join(j).display().to_string())
        .collect::<Vec<_>>()
        .join(":");
        let child = std::process::Command::new("java")
            .args(["-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", &classpath])
            .arg("-Dzookeeper.admin.enableServer=false")
            // The container manager checks every 100 ms (default: a minute), so a test sees
            // empty containers go.
            .arg("-Dznode.container.checkIntervalMs=100")
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(self.port.to_string())
            .arg(&self.dir)
            .arg("2000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let url = self.url("");
        eventually(
            Duration::from_secs(20),
            "private zookeeper answers",
            || async {
                let config = ZkConfig::from_url(&url).unwrap();
                let Ok(mut stream) = tokio::net::TcpStream::connect(&config.hosts[0]).await else {
                    return Err("refused".to_owned());
                };
                let mut out = String::new();
                let _ = stream.write_all(b"srvr").await;
                // A server that is starting may accept and not answer: ask again.
                let read = stream.read_to_string(&mut out);
                if tokio::time::timeout(Duration::from_secs(1), read)
                    .await
                    .is_err()
                {
                    return Err("no answer within 1 s".to_owned());
                }
                if out.contains("Zookeeper version") {
                    Ok(())
                } else {
                    Err(out)
                }
            },
        )
        .await;
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateZk {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Review T1: the parents dlock creates are containers, which the server deletes once they
/// are empty, not persistent nodes (which a client cannot tell apart by their stat, so the
/// layout test's check could not fail). On a private server whose container manager runs
/// every 100 ms, the lock's path and its nested parents are gone soon after the release; with
/// persistent parents they would stay for good.
#[tokio::test(flavor = "multi_thread")]
async fn released_locks_leave_their_containers_to_the_server() {
    if url().is_none() {
        return;
    }
    let Some(server) = PrivateZk::start().await else {
        return;
    };
    let url = server.url("");
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = "containers/a/b";
    let path = p.lock_path(name).unwrap();
    let g = p
        .lock(name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert_eq!(recipe_children(&admin, &path).await.len(), 1);
    g.release().await.unwrap();
    let top = path[..path.find("/a/").unwrap()].to_owned();
    eventually(LIMIT, "the empty containers are deleted", || async {
        let mut left = Vec::new();
        for node in [&path, &top] {
            if admin.check_stat(node).await.unwrap().is_some() {
                left.push(node.clone());
            }
        }
        if left.is_empty() { Ok(()) } else { Err(left) }
    })
    .await;
}

/// The server stops and comes back within the session timeout: the hold is suspended
/// meanwhile (`is_held()` false), then held again, never lost, and still excludes others.
#[tokio::test(flavor = "multi_thread")]
async fn server_restart_within_session_timeout_keeps_the_hold() {
    if url().is_none() {
        return;
    }
    let Some(mut server) = PrivateZk::start().await else {
        return;
    };
    let url = server.url("?session_timeout_ms=20000");
    let (a, b) = (provider(&url).await, provider(&url).await);
    let name = Names::new().name("restart");
    let g = a
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(g.is_held());
    server.kill();
    eventually(LIMIT, "the hold is suspended", || async {
        match g.state() {
            dlock_core::HoldState::Suspended => Ok(()),
            other => Err(other),
        }
    })
    .await;
    assert!(!g.is_held(), "is_held() is false while suspended");
    server.spawn().await;
    eventually(
        Duration::from_secs(20),
        "the hold is vouched for again",
        || async {
            match g.state() {
                dlock_core::HoldState::Held => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
    // The other client is back too before it asks: a store that does not answer is an error,
    // not a held lock.
    eventually(
        Duration::from_secs(20),
        "the other client reconnected",
        || async {
            match b.client().state() {
                zk::SessionState::SyncConnected => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
    // Every call is bounded, so a hang (seen once under load in CI) names its step.
    let lb = b.lock(&name, LockOptions::default()).unwrap();
    let busy = must(
        LIMIT * 2,
        "try_acquire(0) after the restart",
        lb.try_acquire(ZERO),
    )
    .await;
    assert!(busy.unwrap().is_none(), "the hold survived the restart");
    must(LIMIT * 2, "release after the restart", g.release())
        .await
        .unwrap();
    let g2 = must(
        LIMIT * 2,
        "acquire after the release",
        lb.try_acquire(LIMIT),
    )
    .await
    .unwrap()
    .expect("free after release");
    must(LIMIT * 2, "the second release", g2.release())
        .await
        .unwrap();
}

/// Review H1: a downgrade whose write node is already gone (here deleted behind the holder's
/// back, as a release by another task of the same handle or an expiry would) must not grant
/// the read beside a writer that got in meanwhile; it waits as a plain reader. The old
/// downgrade created its read node at the write's place and granted it at once.
#[tokio::test(flavor = "multi_thread")]
async fn downgrade_after_the_write_vanished_waits_for_the_new_writer() {
    let Some(url) = url() else { return };
    let (a, b, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("downgrade-race");
    let path = a.lock_path(&name).unwrap();
    let mine = a.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = mine.write().await.unwrap();
    for node in recipe_children(&admin, &path).await {
        admin.delete(&format!("{path}/{node}"), None).await.unwrap();
    }
    let other = b.read_write_lock(&name, LockOptions::default()).unwrap();
    let w2 = must(LIMIT, "the other writer", other.try_write(LIMIT))
        .await
        .unwrap()
        .expect("the write node is gone: the other writer gets in");
    // `w` has not noticed yet (its session is fine), so this read asks for a downgrade.
    let r = must(LIMIT, "the read", mine.try_read(Duration::from_millis(500))).await;
    assert!(
        matches!(r, Ok(None)),
        "a read granted beside another writer: {r:?}"
    );
    w2.release().await.unwrap();
    drop(w);
}

/// Review M2: a read downgraded from a write carries the write's fencing token, so a writer
/// queued behind that write (whose node, and token, came later) gets a higher token than the
/// read. The old downgraded read had its own, later czxid: fencing went backwards.
#[tokio::test(flavor = "multi_thread")]
async fn downgraded_read_token_is_below_the_next_writers() {
    let Some(url) = url() else { return };
    let (a, b) = (provider(&url).await, provider(&url).await);
    let name = Names::new().name("downgrade-fence");
    let mine = a.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = mine.write().await.unwrap();
    let other = b.read_write_lock(&name, LockOptions::default()).unwrap();
    let queued = tokio::spawn(async move {
        let g = other.write().await.unwrap();
        let token = g.fencing_token().get();
        g.release().await.unwrap();
        token
    });
    // The other writer's node exists (it waits) before the downgrade.
    let admin = admin(&url).await;
    let path = a.lock_path(&name).unwrap();
    eventually(LIMIT, "the other writer queued", || async {
        let n = recipe_children(&admin, &path).await;
        if n.len() == 2 { Ok(()) } else { Err(n) }
    })
    .await;
    let r = mine.read().await.unwrap();
    w.release().await.unwrap();
    let read_token = r.fencing_token().get();
    r.release().await.unwrap();
    let next = must(LIMIT, "the queued writer", queued).await.unwrap();
    assert!(
        next > read_token,
        "the next writer's token {next} is not above the downgraded read's {read_token}"
    );
}

/// Review M1: a one-permit semaphore waiter whose nodes vanish while it waits (an operator
/// unsticking the name, an expired session) starts over under the internal mutex. The old
/// code re-created its lease without the mutex, so a second waiter could queue a lease beside
/// it, and once the holder left both waited for each other for good.
#[tokio::test(flavor = "multi_thread")]
async fn semaphore_waiter_whose_nodes_vanish_does_not_deadlock() {
    let Some(url) = url() else { return };
    let (h, a, b) = (
        provider(&url).await,
        provider(&url).await,
        provider(&url).await,
    );
    let admin = admin(&url).await;
    let name = Names::new().name("sem-vanish");
    let path = h.lock_path(&name).unwrap();
    let (locks, leases) = (format!("{path}/locks"), format!("{path}/leases"));
    let opts = LockOptions::default();
    let held = h
        .semaphore(&name, 1, opts)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let sa = a.semaphore(&name, 1, opts).unwrap();
    let first = tokio::spawn(async move {
        let g = sa.acquire().await.unwrap();
        g.release().await.unwrap();
    });
    eventually(
        LIMIT,
        "the waiter holds the internal mutex and waits",
        || async {
            let (l, s) = (
                recipe_children(&admin, &locks).await,
                recipe_children(&admin, &leases).await,
            );
            if l.len() == 1 && s.len() == 2 {
                Ok(())
            } else {
                Err((l, s))
            }
        },
    )
    .await;
    // Delete the waiter's nodes: its internal-mutex node and its (newer) lease.
    for node in recipe_children(&admin, &locks).await {
        admin
            .delete(&format!("{locks}/{node}"), None)
            .await
            .unwrap();
    }
    let mut lease_nodes = recipe_children(&admin, &leases).await;
    lease_nodes.sort_by_key(|n| n[n.len() - 10..].to_owned());
    let newest = lease_nodes.pop().unwrap();
    admin
        .delete(&format!("{leases}/{newest}"), None)
        .await
        .unwrap();
    eventually(LIMIT, "the waiter is back with a new lease", || async {
        let s = recipe_children(&admin, &leases).await;
        if s.len() == 2 && !s.contains(&newest) {
            Ok(())
        } else {
            Err(s)
        }
    })
    .await;
    let sb = b.semaphore(&name, 1, opts).unwrap();
    let second = tokio::spawn(async move {
        let g = sb.acquire().await.unwrap();
        g.release().await.unwrap();
    });
    eprintln!(
        "DBG before release: locks {:?} leases {:?}",
        recipe_children(&admin, &locks).await,
        recipe_children(&admin, &leases).await
    );
    held.release().await.unwrap();
    must(LIMIT, "the first waiter gets the permit", first)
        .await
        .unwrap();
    must(LIMIT, "the second waiter gets the permit", second)
        .await
        .unwrap();
}

/// Review M4: a mutex named like a semaphore's internal directory (`x/locks`) is not that
/// directory: holding it does not block the semaphore `x`.
#[tokio::test(flavor = "multi_thread")]
async fn a_name_like_recipe_internals_is_its_own_lock() {
    let Some(url) = url() else { return };
    let (a, b) = (provider(&url).await, provider(&url).await);
    let x = Names::new().name("x");
    let inner = a
        .lock(&format!("{x}/locks"), LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let permit = must(
        LIMIT,
        "a permit of x while x/locks is held",
        b.semaphore(&x, 1, LockOptions::default())
            .unwrap()
            .try_acquire(Duration::from_secs(2)),
    )
    .await
    .unwrap()
    .expect("x/locks blocked the semaphore x");
    permit.release().await.unwrap();
    inner.release().await.unwrap();
}

/// Review L4: a deeply nested name (100 segments, within the 255-byte limit) gets its parents
/// created; the old 64-level cap failed it with a bare NoNode.
#[tokio::test(flavor = "multi_thread")]
async fn deeply_nested_names_work() {
    let Some(url) = url() else { return };
    let p = provider(&url).await;
    let deep = format!("{}/{}", Names::new().name("deep"), ["d"; 100].join("/"));
    assert!(deep.len() <= 255, "{}", deep.len());
    let g = must(
        LIMIT,
        "a lock 100 levels deep",
        p.lock(&deep, LockOptions::default()).unwrap().acquire(),
    )
    .await
    .unwrap();
    g.release().await.unwrap();
}
