//! A session's expiry and the session after it: holds are told, waiters queue again, nothing
//! is deleted for nodes that went with the session, and the provider opens a new session (with
//! the application's connector) only while someone holds it.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must};
use dlock_core::{LockOptions, LockProvider};
use dlock_zookeeper::zookeeper_client as zk;
use dlock_zookeeper::{ZkConfig, ZkProvider};

use crate::support::proxy::BlockingProxy;
use crate::support::{
    LIMIT, a_new_session, admin, await_nodes, close_session, hold, provider, recipe_children, url,
};

/// The session expires under a hold: while the holder is cut off (through a proxy), another
/// connection takes its session over and closes it. `lost()` fires once the holder learns of
/// it, another client acquires, and the provider goes on with a new session.
#[tokio::test(flavor = "multi_thread")]
async fn session_expiry_reports_loss() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = BlockingProxy::start(&config).await;
    let proxied = format!("zk://{}{}", proxy.addr(), config.chroot);
    let (a, b, admin) = (
        provider(&proxied).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("expire");
    let path = a.lock_path(&name).unwrap();
    let g = hold(&a, &name).await;
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
    await_nodes(&admin, &path, 0, "the session's node is gone").await;
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
/// holder releases it.
#[tokio::test(flavor = "multi_thread")]
async fn an_unbounded_acquire_outlives_its_sessions_expiry() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = BlockingProxy::start(&config).await;
    let proxied = format!("zk://{}{}", proxy.addr(), config.chroot);
    let (a, b, admin) = (
        provider(&proxied).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("acquire-outlives-expiry");
    let path = a.lock_path(&name).unwrap();
    let held = hold(&b, &name).await;
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

/// 1000 holds on one provider and a forced session expiry. Every guard reports
/// `SessionExpired` within the session timeout, the provider opens exactly one new session,
/// and neither the keepers' clean-up nor dropping the guards sends a single delete for nodes
/// that went with the session.
#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_holds_lost_with_their_session_cost_no_deletes() {
    const HOLDS: usize = 1000;
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = BlockingProxy::start(&config).await;
    let proxied = format!(
        "zk://{}{}?session_timeout_ms=4000",
        proxy.addr(),
        config.chroot
    );
    let a = provider(&proxied).await;
    let names = Names::new();
    // A short watchdog lease, so that the delete of a dropped guard, sent at its lease end
    // if at all, falls inside the window checked below.
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
    a_new_session(&a, old_session).await;
    drop(guards);
    // Past the lease end of every dropped guard (when a leaked hold's delete is sent).
    let quiet_until = dlock_core::backend::from_now(Duration::from_secs(3));
    while tokio::time::Instant::now() < quiet_until {
        let sent = a.stats().deletes - deletes_before;
        assert_eq!(sent, 0, "deletes sent for nodes gone with their session");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(a.stats().sessions, 2, "one new session after the expiry");
}

/// A provider whose session expired while the ensemble is unreachable keeps trying to open a
/// new one, but only while someone still holds the provider: a dropped provider stops
/// connecting. The client declares its session expired by itself after 1.4 session timeouts
/// cut off.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_provider_stops_reconnecting() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let proxy = BlockingProxy::start(&config).await;
    let proxied = format!(
        "zk://{}{}?session_timeout_ms=2000",
        proxy.addr(),
        config.chroot
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
    let seen = proxy.attempts();
    eventually(LIMIT, "attempts to open a new session", || async {
        let now = proxy.attempts();
        if now > seen + 1 { Ok(()) } else { Err(now) }
    })
    .await;
    assert_eq!(a.session_id(), old_session);
    drop(g);
    drop(a);
    // An attempt in flight when the provider was dropped may still end; then nothing more.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_drop = proxy.attempts();
    // Longer than the loop's longest pause (5 s).
    let quiet_until = dlock_core::backend::from_now(Duration::from_secs(7));
    while tokio::time::Instant::now() < quiet_until {
        let now = proxy.attempts();
        assert_eq!(now, after_drop, "a dropped provider is still connecting");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A provider on the application's own connector. Its `digest` credentials
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
    let proxy = BlockingProxy::start(&config).await;
    let proxied = ZkConfig::from_url(&format!("zk://{}{root}", proxy.addr())).unwrap();
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

/// A session or connection timeout the protocol cannot carry (its signed 32-bit count of
/// milliseconds) is refused at connect with a configuration error, never sent wrapped.
#[tokio::test(flavor = "multi_thread")]
async fn timeouts_the_protocol_cannot_carry_are_refused() {
    let Some(url) = url() else { return };
    let config = ZkConfig::from_url(&url).unwrap();
    let month = Duration::from_secs(30 * 24 * 60 * 60);
    for config in [
        config.clone().with_session_timeout(month),
        config.clone().with_session_timeout(Duration::ZERO),
        config
            .clone()
            .with_session_timeout(Duration::from_micros(10_500)),
        config.clone().with_connection_timeout(month),
    ] {
        match ZkProvider::connect_with(config.clone()).await {
            Err(dlock_core::Error::Config { .. }) => {}
            other => panic!("{config:?}: {:?}", other.map(|p| p.session_id())),
        }
    }
}
