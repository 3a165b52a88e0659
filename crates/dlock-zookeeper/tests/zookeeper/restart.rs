//! A server restart within the session timeout: holds are suspended meanwhile, never lost.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must};
use dlock_core::{LockOptions, LockProvider};
use dlock_zookeeper::zookeeper_client as zk;

use crate::support::server::PrivateZk;
use crate::support::{LIMIT, ZERO, hold, provider, url};

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
    let g = hold(&a, &name).await;
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
    held_again(&g).await;
    // The other client is back too before it asks: a store that does not answer is an error,
    // not a held lock.
    reconnected(&b).await;
    // Every call is bounded, so a hang names its step.
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

/// A waiter that waits through a restart of the server (with the default 10 s session) is
/// woken by the release that follows it: its watch on the node before it outlives the
/// reconnect, or it looks again when the session comes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_is_woken_after_a_server_restart() {
    if url().is_none() {
        return;
    }
    let Some(mut server) = PrivateZk::start().await else {
        return;
    };
    let url = server.url("");
    let (a, b) = (provider(&url).await, provider(&url).await);
    let name = Names::new().name("restart-waiter");
    let g = hold(&a, &name).await;
    let lb = b.lock(&name, LockOptions::default()).unwrap();
    let waiting = tokio::spawn(async move { lb.acquire().await });
    let admin = crate::support::admin(&url).await;
    let path = a.lock_path(&name).unwrap();
    crate::support::await_nodes(&admin, &path, 2, "the waiter's node").await;
    drop(admin);
    server.kill();
    server.spawn().await;
    reconnected(&a).await;
    reconnected(&b).await;
    held_again(&g).await;
    must(LIMIT * 2, "release after the restart", g.release())
        .await
        .unwrap();
    let g2 = must(Duration::from_secs(10), "the waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    must(LIMIT * 2, "the waiter's release", g2.release())
        .await
        .unwrap();
}

/// Waits until `g` is vouched for again after a restart.
async fn held_again(g: &dlock_core::LockGuard) {
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
}

/// Waits until `p`'s session is connected again after a restart.
async fn reconnected(p: &dlock_zookeeper::ZkProvider) {
    eventually(
        Duration::from_secs(20),
        "the client reconnected",
        || async {
            match p.client().state() {
                zk::SessionState::SyncConnected => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
}
