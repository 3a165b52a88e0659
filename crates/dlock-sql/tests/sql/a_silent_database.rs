//! A database that does not answer (a silent network: its connections stay open, nothing
//! flows either way) is a retryable error, never a lock held by someone else.

use std::time::Duration;

use dlock_conformance::{Names, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_sql::SqlProvider;
use tokio::time::Instant;

use crate::support::*;
use dlock_conformance::{Partition, ProxyPartition};
use dlock_core::backend::CALL_GRACE;

/// How long a provider waits for a connection past an acquisition's deadline (the grace
/// that lets even a zero wait open one).
const CONNECT_GRACE: Duration = Duration::from_secs(1);

/// Every strategy of the configured servers: (URL, the server's default port, label).
fn servers() -> Vec<(String, u16, String)> {
    let mut out = Vec::new();
    if let Some(mysql) = service_url("DLOCK_MYSQL_URL") {
        for s in ["unique-insert", "optimistic", "for-update", "get-lock"] {
            let url = with_query(&mysql, &format!("strategy={s}&table={}", prefix(s)));
            out.push((url, 3306, format!("mysql/{s}")));
        }
    }
    if let Some(pg) = service_url("DLOCK_POSTGRES_URL") {
        for s in ["unique-insert", "optimistic", "for-update", "advisory"] {
            let url = with_query(&pg, &format!("strategy={s}&table={}", prefix(s)));
            out.push((url, 5432, format!("postgres/{s}")));
        }
    }
    out
}

/// Runs `case` on every server and strategy at once (each case waits out silences of its
/// own), and fails with the first case that failed.
async fn on_every_server<F, Fut>(case: F)
where
    F: Fn(String, u16, String) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut cases = tokio::task::JoinSet::new();
    for (url, port, label) in servers() {
        cases.spawn(case(url, port, label));
    }
    while let Some(done) = cases.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// `try_acquire(wait)` through a silent network, whether the lock is free or held by
/// another client, returns a retryable error within the wait, the handle's cut-off
/// ([`CALL_GRACE`]) and a slack; the lock works again once the network is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_through_a_silent_network_is_an_error_not_a_held_lock() {
    on_every_server(|url, port, label| async move {
        let (cut, proxied) = ProxyPartition::start(&url, port).await.unwrap();
        let p = SqlProvider::connect(&proxied).await.unwrap();
        let other = SqlProvider::connect(&url).await.unwrap();
        let name = Names::new().name("silent");
        let lock = p.lock(&name, LockOptions::default()).unwrap();
        // The line works first: its connections are open when it goes silent.
        let g = lock.try_acquire(Duration::from_secs(5)).await.unwrap();
        g.expect("a new name is free").release().await.unwrap();
        for held in [false, true] {
            let holder = if held {
                let l = other.lock(&name, LockOptions::default()).unwrap();
                let g = l.try_acquire(Duration::from_secs(5)).await.unwrap();
                Some(g.expect("free for the other client"))
            } else {
                None
            };
            let state = if held {
                "held by another client"
            } else {
                "free"
            };
            cut.set_partitioned(true);
            for wait in [Duration::ZERO, Duration::from_secs(1)] {
                let limit = wait + CALL_GRACE + Duration::from_secs(3);
                let what = format!("{label}: try_acquire({wait:?}) through a silent network");
                match must(limit, &what, lock.try_acquire(wait)).await {
                    Err(e) => assert!(e.is_retryable(), "{what} ({state}): {e}"),
                    Ok(None) => panic!("{what}: taken for a lock held by someone ({state})"),
                    Ok(Some(_)) => panic!("{what}: granted ({state})"),
                }
            }
            cut.set_partitioned(false);
            if let Some(g) = holder {
                g.release().await.unwrap();
            }
        }
        // The attempts cut off are undone (or their connections closed) once the
        // network is back: the lock is free again.
        let what = format!("{label}: the lock once the network is back");
        let g = must(
            Duration::from_secs(30),
            &what,
            lock.try_acquire(Duration::from_secs(25)),
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        g.unwrap_or_else(|| panic!("{what}: still held"))
            .release()
            .await
            .unwrap();
    })
    .await;
}

/// An attempt that has to wait for a connection on a silent network (the pool's only
/// connection is stuck in a statement nobody answers, or a new one cannot be opened)
/// gives up at its deadline, after a grace to open one, with a retryable
/// `Error::Connection` of its own: it does not wait for the pool's own timeout (10 s), to
/// be cut off by the handle ([`CALL_GRACE`] past the deadline). The row strategies run on
/// a pool of one connection; the pinned ones open a connection for each attempt whose
/// connection closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_connection_ends_at_the_deadline() {
    on_every_server(|url, port, label| async move {
        let pinned = ["for-update", "advisory", "get-lock"]
            .iter()
            .any(|s| label.ends_with(s));
        let url = if pinned {
            url
        } else {
            with_query(&url, "pool=1")
        };
        let (cut, proxied) = ProxyPartition::start(&url, port).await.unwrap();
        let p = SqlProvider::connect(&proxied).await.unwrap();
        let name = Names::new().name("silent-pool");
        let lock = p.lock(&name, LockOptions::default()).unwrap();
        let g = lock.try_acquire(Duration::from_secs(5)).await.unwrap();
        g.expect("a new name is free").release().await.unwrap();
        cut.set_partitioned(true);
        // Cut off by the handle: its connection stays in the statement (or the undo after
        // it), or is closed.
        let first = lock.try_acquire(Duration::ZERO).await;
        assert!(first.is_err(), "{label}: {first:?}");
        for wait in [Duration::ZERO, Duration::from_secs(1)] {
            let started = Instant::now();
            let r = lock.try_acquire(wait).await;
            let took = started.elapsed();
            let what = format!("{label}: try_acquire({wait:?}) waiting for a connection");
            match r {
                Err(e @ dlock_core::Error::Connection { .. }) => assert!(
                    took < wait + CONNECT_GRACE + Duration::from_millis(500),
                    "{what}: answered after {took:?}, not at its deadline and connect \
                     grace: {e}"
                ),
                other => panic!("{what}: {other:?} after {took:?}"),
            }
        }
        cut.set_partitioned(false);
    })
    .await;
}
