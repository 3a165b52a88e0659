//! PostgreSQL's release notifications: waiters woken by a `NOTIFY`, a listener only while
//! somebody waits.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_sql::SqlProvider;
use sqlx::Row;

use crate::support::*;

/// PostgreSQL announces the releases of the polling strategies: a release `NOTIFY`s the name on
/// the provider's channel, and a waiter's provider receives it (and wakes the waiter, which
/// then takes the lock; how soon is `dlock bench`'s W3). The tables are the test's own, so no
/// other test's releases are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_announces_releases_to_waiters() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    for strategy in ["unique-insert", "optimistic"] {
        let table = format!("dlock_notify_{}", strategy.replace('-', "_"));
        let url = with_query(&pg, &format!("strategy={strategy}&table={table}"));
        let name = Names::new().name("notify");
        let holder = SqlProvider::connect(&url).await.unwrap();
        let waiter = SqlProvider::connect(&url).await.unwrap();
        let g = holder
            .lock(&name, LockOptions::default())
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let before = waiter.release_notifications();
        let lock = waiter.lock(&name, LockOptions::default()).unwrap();
        let waiting = tokio::spawn(async move { lock.acquire().await.map(|g| (lock, g)) });
        // The waiter's provider listens from its first wait on; until its LISTEN took effect
        // a release would reach it only through the waiter's own polling.
        eventually(
            Duration::from_secs(10),
            &format!("{strategy}: the waiter's provider listens"),
            || async {
                if waiter.listens_for_releases() {
                    Ok(())
                } else {
                    Err("not yet")
                }
            },
        )
        .await;
        g.release().await.unwrap();
        let (_lock, g2) = must(
            Duration::from_secs(5),
            &format!("{strategy}: the waiter after the release"),
            waiting,
        )
        .await
        .unwrap()
        .unwrap();
        eventually(
            Duration::from_secs(5),
            &format!("{strategy}: the waiter's provider received the release"),
            || async {
                let n = waiter.release_notifications();
                if n > before { Ok(()) } else { Err(n) }
            },
        )
        .await;
        g2.release().await.unwrap();
    }
}

/// A PostgreSQL provider listens for release notifications only once one of its waiters
/// waits: the server sends every release on the channel to every listening session, so
/// providers that never wait (many clients, each on its own names) would each receive, and
/// drop, every other client's releases. Counted on the server, in `pg_stat_activity`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_providers_listen_only_once_they_wait() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let server = sqlx::PgPool::connect(&pg).await.unwrap();
    for strategy in ["unique-insert", "optimistic"] {
        let table = format!("dlock_listen_{}", strategy.replace('-', "_"));
        let url = with_query(&pg, &format!("strategy={strategy}&table={table}"));
        let listeners = || {
            let server = server.clone();
            // sqlx listens again after a reconnection with `LISTEN "…";`.
            let listen = format!("LISTEN \"{table}_release\"%");
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE $1",
                )
                .bind(listen)
                .fetch_one(&server)
                .await
                .unwrap()
            }
        };
        let name = Names::new().name("listen");
        let a = SqlProvider::connect(&url).await.unwrap();
        let b = SqlProvider::connect(&url).await.unwrap();
        for p in [&a, &b] {
            let lock = p.lock(&name, LockOptions::default()).unwrap();
            for _ in 0..20 {
                lock.acquire().await.unwrap().release().await.unwrap();
            }
        }
        assert!(
            !a.listens_for_releases() && !b.listens_for_releases(),
            "{strategy}"
        );
        assert_eq!(
            listeners().await,
            0,
            "{strategy}: nobody waited, nobody listens"
        );
        // One waiter: its provider, and only its, listens.
        let g = a
            .lock(&name, LockOptions::default())
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let lock = b.lock(&name, LockOptions::default()).unwrap();
        let waiting = tokio::spawn(async move { lock.acquire().await.map(|g| (lock, g)) });
        eventually(
            Duration::from_secs(10),
            &format!("{strategy}: the waiter's provider listens"),
            || async {
                match listeners().await {
                    1 => Ok(()),
                    n => Err(n),
                }
            },
        )
        .await;
        assert!(
            !a.listens_for_releases(),
            "{strategy}: the holder's provider did not wait"
        );
        g.release().await.unwrap();
        let (_lock, g2) = must(
            Duration::from_secs(5),
            &format!("{strategy}: the waiter after the release"),
            waiting,
        )
        .await
        .unwrap()
        .unwrap();
        g2.release().await.unwrap();
    }
    server.close().await;
}

/// The release listener's session outlives a role's `idle_session_timeout` (it sends
/// nothing while nothing is released): when the server has ended the provider's idle
/// statement connection, the listener that was idle longer still listens on its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_listener_outlives_the_servers_idle_timeout() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let db = admin(&pg).await;
    let app = format!("dlock_listen_{}", uuid::Uuid::new_v4().simple());
    let url = pg_app_url(
        &pg,
        "unique-insert",
        &app,
        "&options=-c%20idle_session_timeout%3D300",
    );
    let provider = SqlProvider::connect(&url).await.unwrap();
    let name = Names::new().name("listen");
    let lock = provider.lock(&name, LockOptions::default()).unwrap();
    let listener = || async {
        let pids: Vec<i32> = sqlx::query(
            "SELECT pid FROM pg_stat_activity \
             WHERE application_name = $1 AND query LIKE 'LISTEN%'",
        )
        .bind(&app)
        .fetch_all(&db)
        .await
        .map_err(|e| e.to_string())?
        .iter()
        .map(|r| r.get::<i32, _>(0))
        .collect();
        match pids[..] {
            [pid] => Ok(pid),
            _ => Err(format!("listening sessions: {pids:?}")),
        }
    };
    // The provider listens from its first wait on: a waiter waits once.
    let g = lock.acquire().await.unwrap();
    let other = provider.lock(&name, LockOptions::default()).unwrap();
    let waiting = tokio::spawn(async move { other.acquire().await.map(|g| (other, g)) });
    let pid = eventually(Duration::from_secs(20), "the provider listens", listener).await;
    g.release().await.unwrap();
    let (_other, g2) = must(Duration::from_secs(5), "the waiter", waiting)
        .await
        .unwrap()
        .unwrap();
    g2.release().await.unwrap();
    // A statement connection idle from now on, the listener idle since before.
    lock.acquire().await.unwrap().release().await.unwrap();
    eventually(
        Duration::from_secs(20),
        "the server ends the idle statement connection",
        || async {
            match own_backends(&db, &app).await {
                0 => Ok(()),
                n => Err(n),
            }
        },
    )
    .await;
    assert_eq!(
        listener().await,
        Ok(pid),
        "the listening session was ended by the server's idle timeout"
    );
}
