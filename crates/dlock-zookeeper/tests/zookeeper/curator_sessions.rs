//! A Curator 5.4 peer and dlock on one path when a holder's session ends, both ways, for each
//! kind they share: Curator's holder is frozen (SIGSTOP) until the server expires its 10 s
//! session, and dlock's waiter gets in only once Curator's node is gone; dlock's holder is cut
//! off and its session ended on the server (taken over and closed, as an expiry does), and
//! Curator's waiter gets in then and not before, and dlock's guard says it lost. Default settings on both sides: dlock's 10 s session, Curator's 10 s.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must};
use dlock_core::{HoldState, LockGuard, LockOptions, LockProvider};
use dlock_zookeeper::{ZkConfig, ZkProvider};
use tokio::time::Instant;

use crate::support::curator::{Peer, curator_classpath};
use crate::support::proxy::BlockingProxy;
use crate::support::{LIMIT, admin, await_nodes, close_session, provider, recipe_children, url};

/// How long a frozen Curator holder's node may outlive the freeze: its 10 s session, counted
/// from its last ping, and the server's expiry tick, with room for a loaded machine.
const EXPIRY_LIMIT: Duration = Duration::from_secs(40);

/// What a frozen holder's session lasts at least after the freeze: its 10 s session less the
/// third of it that may have passed since its last ping.
const SESSION_LEFT: Duration = Duration::from_secs(6);

/// A kind both clients have, as each side names it.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Curator's `InterProcessMutex`, dlock's mutex.
    Mutex,
    /// Curator's `InterProcessReadWriteLock`: the holder writes, the waiter reads.
    WriteThenRead,
    /// Curator's `InterProcessSemaphoreV2` and dlock's semaphore, one permit.
    Semaphore,
}

impl Kind {
    /// The peer's arguments for the holder's side (`holder`) or the waiter's.
    fn curator_args(self, path: &str, holder: bool) -> Vec<&str> {
        let mode = match (self, holder) {
            (Self::Mutex, _) => "mutex",
            (Self::WriteThenRead, true) => "write",
            (Self::WriteThenRead, false) => "read",
            (Self::Semaphore, _) => "semaphore",
        };
        let mut args = vec![mode, path, "600000"];
        if !holder {
            args.extend(["tryacquire", "60000"]);
        }
        if matches!(self, Self::Semaphore) {
            args.extend(["permits", "1"]);
        }
        args
    }

    /// Takes the holder's side (`holder`) or the waiter's on `p`, waiting as long as it takes.
    async fn take(self, p: &ZkProvider, name: &str, holder: bool) -> LockGuard {
        let opts = LockOptions::default();
        let taken = match self {
            Self::Mutex => p.lock(name, opts).unwrap().acquire().await,
            Self::WriteThenRead => {
                let rw = p.read_write_lock(name, opts).unwrap();
                if holder {
                    rw.write().await
                } else {
                    rw.read().await
                }
            }
            Self::Semaphore => p.semaphore(name, 1, opts).unwrap().acquire().await,
        };
        taken.unwrap()
    }

    /// Where the contenders of the lock at `path` queue.
    fn queue(self, path: &str) -> String {
        match self {
            Self::Semaphore => format!("{path}/leases"),
            Self::Mutex | Self::WriteThenRead => path.to_owned(),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mutex_passes_between_curator_and_dlock_when_the_holders_session_ends() {
    both_ways(Kind::Mutex, "expiry/mutex").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_lock_passes_to_readers_of_the_other_client_when_its_session_ends() {
    both_ways(Kind::WriteThenRead, "expiry/rw").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_permit_passes_between_curator_and_dlock_when_the_holders_session_ends() {
    both_ways(Kind::Semaphore, "expiry/semaphore").await;
}

/// See the module docs: Curator holds and expires, then dlock holds and its session ends.
async fn both_ways(kind: Kind, name: &str) {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let name = Names::new().name(name);
    curator_holder_expires(kind, &url, &name).await;
    dlock_holders_session_ends(kind, &url, &name).await;
}

/// Curator holds `name` and is frozen; dlock's waiter gets in once the server expired
/// Curator's session and its node is gone, and not while it lived.
async fn curator_holder_expires(kind: Kind, url: &str, name: &str) {
    let (p, admin) = (provider(url).await, admin(url).await);
    let path = p.lock_path(name).unwrap();
    let queue = kind.queue(&path);
    let mut java = Peer::start(url, &kind.curator_args(&path, true)).await;
    java.expect("WAITING").await;
    java.expect("ACQUIRED").await;
    let held_by_curator = recipe_children(&admin, &queue).await;
    assert_eq!(held_by_curator.len(), 1, "{kind:?}: Curator's node");
    let waiter = {
        let (p, name) = (p.clone(), name.to_owned());
        tokio::spawn(async move { kind.take(&p, &name, false).await })
    };
    await_nodes(&admin, &queue, 2, "dlock queued behind Curator").await;
    java.signal("STOP");
    let frozen = Instant::now();
    let g = must(
        EXPIRY_LIMIT,
        "dlock after Curator's session expired",
        waiter,
    )
    .await
    .unwrap();
    let waited = frozen.elapsed();
    let now = recipe_children(&admin, &queue).await;
    assert!(
        !now.contains(&held_by_curator[0]),
        "{kind:?}: dlock got in beside Curator's live node {now:?}"
    );
    assert!(
        waited >= SESSION_LEFT,
        "{kind:?}: dlock got in {waited:?} after Curator froze, within its session"
    );
    java.kill().await;
    g.release().await.unwrap();
}

/// dlock holds `name` through a proxy and is cut off (its guard no longer says it holds);
/// Curator's waiter does not get in while dlock's session lives on the server, and does once
/// it is ended there; dlock's guard says it lost once the network is back.
async fn dlock_holders_session_ends(kind: Kind, url: &str, name: &str) {
    let config = ZkConfig::from_url(url).unwrap();
    let proxy = BlockingProxy::start(&config).await;
    let proxied = format!("zk://{}{}", proxy.addr(), config.chroot);
    let (p, admin) = (provider(&proxied).await, admin(url).await);
    let path = p.lock_path(name).unwrap();
    let g = kind.take(&p, name, true).await;
    let mut java = Peer::start(url, &kind.curator_args(&path, false)).await;
    java.expect("WAITING").await;
    await_nodes(&admin, &kind.queue(&path), 2, "Curator queued behind dlock").await;
    java.still_waiting(&format!("{kind:?}: Curator behind dlock's hold"))
        .await;
    proxy.block();
    eventually(LIMIT, "the hold is suspended", || async {
        match g.state() {
            HoldState::Suspended => Ok(()),
            other => Err(other),
        }
    })
    .await;
    // Cut off, dlock's session still lives on the server: Curator still waits.
    java.still_waiting(&format!("{kind:?}: Curator while dlock's session lives"))
        .await;
    close_session(&p, &config).await;
    java.expect("ACQUIRED").await;
    proxy.unblock();
    must(LIMIT, "lost() after the session ended", g.lost()).await;
    java.release().await;
}
