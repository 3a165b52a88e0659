//! Silence and the session's horizon: a holder whose network goes silent is told before the
//! lock can pass on, a quiet hold is kept by probes, and a silent store is an error, not a
//! held lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_conformance::{Names, Partition, ProxyPartition, eventually, must};
use dlock_core::backend::CALL_GRACE;
use dlock_core::{Lease, LockOptions, LockProvider, LossReason};
use dlock_zookeeper::{DEFAULT_PORT, DEFAULT_SESSION_TIMEOUT};
use tokio::time::Instant;

use crate::support::{LIMIT, admin, await_nodes, hold, provider, recipe_children, url};

/// With the default settings (a 10 s session, the 30 s watchdog lease), a holder whose network
/// goes silent (a proxy that keeps its connections open and moves no byte) is told its hold is
/// lost strictly before another client's `acquire()` returns, by at least 1 % of the lease:
/// the session's horizon (the send time of the last request the server answered, plus three
/// quarters of the negotiated session timeout) comes before the server can expire the
/// session. The client library alone gives the session up only 1.4 session timeouts after
/// it last heard from the server: after the server has expired the session and the waiter
/// has got in.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_holder_is_told_before_the_next_grant_with_default_settings() {
    silent_holder_is_told_before_the_next_grant(LockOptions::default(), "silent-default").await;
}

/// As [`a_silent_holder_is_told_before_the_next_grant_with_default_settings`], for a fixed
/// lease of 60 s, six times the session: the store keeps a hold only as long as the session
/// lives, and a fixed lease is never renewed, so the session's horizon, not the lease's end,
/// bounds what the guard vouches for.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_holder_of_a_fixed_lease_longer_than_the_session_is_told_first() {
    let options = LockOptions::new().with_lease(Lease::Fixed(Duration::from_secs(60)));
    silent_holder_is_told_before_the_next_grant(options, "silent-fixed").await;
}

async fn silent_holder_is_told_before_the_next_grant(options: LockOptions, label: &str) {
    let Some(url) = url() else { return };
    let (cut, proxied) = ProxyPartition::start(&url, DEFAULT_PORT).await.unwrap();
    let (a, b, admin) = (
        provider(&proxied).await,
        provider(&url).await,
        admin(&url).await,
    );
    assert_eq!(a.config().session_timeout, DEFAULT_SESSION_TIMEOUT);
    let name = Names::new().name(label);
    let path = a.lock_path(&name).unwrap();
    let lease = options.lease.ttl();
    let g = a.lock(&name, options).unwrap().acquire().await.unwrap();
    let waiter = {
        let l = b.lock(&name, options).unwrap();
        tokio::spawn(async move {
            let g = l.acquire().await;
            (Instant::now(), g)
        })
    };
    await_nodes(&admin, &path, 2, "the other client waits").await;
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
        "{label}: cut at 0, lost() at {:?}, the next grant at {:?}: margin {margin:?}",
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
    let g = hold(&p, &name).await;
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
/// deadline, well before the core's cut-off of an overrunning call (`CALL_GRACE` later).
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
    let held = hold(&h, &name).await;
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
