//! Connections and pools: a database that cannot be reached, connections the server ended,
//! warm connections, a busy SQLite file.

use std::time::Duration;

use dlock_conformance::{Names, eventually, service_url};
use dlock_core::{Lease, LockOptions, LockProvider};
use dlock_sql::{SqlProvider, Strategy};
use sqlx::Row;
use tokio::time::Instant;

use crate::support::*;

/// `try_acquire(0)` is bounded by its wait (plus the handle's 2 s grace)
/// even when SQLite's write lock is taken by someone else and the pool is the application's
/// own (sqlx's busy timeout: 5 s), and the attempt cut off leaves nothing behind. The file
/// could not be asked about the lock in that time (its write lock is the application's, not a
/// dlock holder's): the answer is a retryable error, not "held".
#[tokio::test]
async fn try_acquire_zero_is_bounded_while_sqlite_is_write_locked() {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
    let file =
        std::env::temp_dir().join(format!("dlock-busy-{}.db", uuid::Uuid::new_v4().simple()));
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(options.clone()).await.unwrap();
    let p = crate::support::on_pool(pool, Strategy::UniqueInsert, "dlock", 1)
        .await
        .unwrap();
    // Another writer (of the application) holds SQLite's write lock.
    let other = SqlitePool::connect_with(options).await.unwrap();
    let mut writer = other.begin().await.unwrap();
    sqlx::query("CREATE TABLE busy_marker (x INTEGER)")
        .execute(&mut *writer)
        .await
        .unwrap();
    let lock = p.lock("write-locked", LockOptions::default()).unwrap();
    let started = Instant::now();
    let r = lock.try_acquire(Duration::ZERO).await;
    let took = started.elapsed();
    assert!(
        matches!(&r, Err(e) if e.is_retryable()),
        "try_acquire(0) while write-locked: {r:?}"
    );
    // The grace is 2 s; the busy timeout 5 s.
    assert!(
        took < Duration::from_secs(4),
        "try_acquire(0) took {took:?}"
    );
    writer.rollback().await.unwrap();
    // Once the writer is gone, the lock is free: the cut-off attempt left nothing behind.
    let g = eventually(
        Duration::from_secs(10),
        "the lock after the writer left",
        || {
            let lock = &lock;
            async move {
                match lock.try_acquire(Duration::ZERO).await {
                    Ok(Some(g)) => Ok(g),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
    g.release().await.unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// A database that cannot be reached is an error, not a lock held by someone else: a
/// `try_acquire` whose attempts all failed to reach the database returns the last
/// `Error::Connection` (retryable) at its deadline, as the Redis backend does. It returned `Ok(None)`, "held",
/// so a caller that treats a held lock as "someone else does the job" skipped the job while
/// the database was down. The fault: the proxy the provider reaches the server through is
/// stopped (its connections closed, new ones refused).
#[tokio::test]
async fn a_try_of_an_unreachable_database_is_an_error_not_a_held_lock() {
    use dlock_conformance::ProxyPartition;
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let (proxy, proxied) = ProxyPartition::start(&for_update(&pg), 5432).await.unwrap();
    let p = SqlProvider::connect(&proxied).await.unwrap();
    let lock = p
        .lock(&Names::new().name("unreachable"), LockOptions::default())
        .unwrap();
    let g = lock
        .try_acquire(Duration::ZERO)
        .await
        .unwrap()
        .expect("free");
    g.release().await.unwrap();
    drop(proxy);
    for wait in [Duration::ZERO, Duration::from_millis(1500)] {
        match lock.try_acquire(wait).await {
            Err(e) => assert!(
                matches!(e, dlock_core::Error::Connection { .. }) && e.is_retryable(),
                "try_acquire({wait:?}): {e}"
            ),
            Ok(held) => panic!(
                "try_acquire({wait:?}) of an unreachable database answered Ok (acquired: {})",
                held.is_some()
            ),
        }
    }
}

/// A pooled connection that the server ended while it sat idle is a connection error, and the
/// acquisition tries again on another connection: a healthy database never fails the caller.
/// PostgreSQL ends a session idle past `idle_session_timeout` (which managed services set on
/// their roles) with `FATAL 57P05`, which the client reads as the answer to its next
/// statement; that code was a hard, non-retryable error, so `try_acquire` failed at once.
/// MariaDB closes a connection idle past `wait_timeout` without a word (an I/O error): that
/// case guards the answer that was already right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_server_ended_while_idle_is_tried_again() {
    let _serial = SERIAL.lock().await;
    if let Some(pg) = service_url("DLOCK_POSTGRES_URL") {
        use sqlx::ConnectOptions as _;
        let pg_admin = admin(&pg).await;
        let version: i64 = sqlx::query("SELECT current_setting('server_version_num')::bigint")
            .fetch_one(&pg_admin)
            .await
            .unwrap()
            .get(0);
        // `idle_session_timeout` is PostgreSQL 14's (scripts/services starts 15).
        assert!(
            version >= 140_000,
            "PostgreSQL {version} has no idle_session_timeout"
        );
        let base = pg.split('?').next().unwrap();
        let options = sqlx::postgres::PgConnectOptions::from_url(&base.parse().unwrap())
            .unwrap()
            .options([("idle_session_timeout", "300ms")]);
        let app = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .unwrap();
        let provider = crate::support::on_pool(
            app.clone(),
            Strategy::UniqueInsert,
            &prefix("unique-insert"),
            1,
        )
        .await
        .unwrap();
        let (first, second) = (app.acquire().await.unwrap(), app.acquire().await.unwrap());
        let mut ids = Vec::new();
        for mut c in [first, second] {
            let id: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *c)
                .await
                .unwrap();
            ids.push(i64::from(id));
        }
        let alive = format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE pid IN ({}, {})",
            ids[0], ids[1]
        );
        ends_idle_connections("postgres", &provider, &pg_admin, &alive).await;
    }
    if let Some(mysql) = service_url("DLOCK_MYSQL_URL") {
        let app = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(2)
            .test_before_acquire(false)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::Executor::execute(&mut *conn, "SET SESSION wait_timeout = 1").await?;
                    Ok(())
                })
            })
            .connect(mysql.split('?').next().unwrap())
            .await
            .unwrap();
        let provider = crate::support::on_pool(
            app.clone(),
            Strategy::UniqueInsert,
            &prefix("unique-insert"),
            1,
        )
        .await
        .unwrap();
        let (first, second) = (app.acquire().await.unwrap(), app.acquire().await.unwrap());
        let mut ids = Vec::new();
        for mut c in [first, second] {
            let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                .fetch_one(&mut *c)
                .await
                .unwrap();
            ids.push(id);
        }
        let alive = format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN ({}, {})",
            ids[0], ids[1]
        );
        ends_idle_connections("mysql", &provider, &admin(&mysql).await, &alive).await;
    }
}

/// A lock cycle gives its connections back to the provider's warm ones, not to sqlx (whose
/// pool pings every connection it takes back, a round trip, and opens another meanwhile): 200
/// cycles, and renewals of a held lock, run on one connection of each pool, in a pool that may
/// open four. Fails on a provider without warm connections (sqlx opened 2-3 per pool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_cycles_and_renewals_reuse_one_warm_connection() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let db = admin(&pg).await;
    // The statement pool serves every strategy; advisory and for-update pin a connection of
    // a second pool for each hold.
    for (strategy, pools) in [
        ("unique-insert", 1),
        ("optimistic", 1),
        ("advisory", 2),
        ("for-update", 2),
    ] {
        let app = format!("dlock_warm_{}", uuid::Uuid::new_v4().simple());
        let url = pg_app_url(&pg, strategy, &app, "&pool=4");
        let provider = SqlProvider::connect(&url).await.unwrap();
        let name = Names::new().name("warm");
        let lock = provider.lock(&name, LockOptions::default()).unwrap();
        for _ in 0..200 {
            lock.acquire().await.unwrap().release().await.unwrap();
        }
        // Renewals of a held lock (every second) while its acquisition's connection is warm.
        let renewed = provider
            .lock(
                &name,
                LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(3))),
            )
            .unwrap();
        let guard = renewed.acquire().await.unwrap();
        let (mut last, mut rises) = (guard.remaining(), 0);
        eventually(
            Duration::from_secs(20),
            &format!("{strategy}: the lease is renewed twice"),
            || {
                let now = guard.remaining();
                if now > last {
                    rises += 1;
                }
                last = now;
                let seen = rises;
                async move { if seen >= 2 { Ok(()) } else { Err(seen) } }
            },
        )
        .await;
        // Counted while the hold is renewed (a release could meet a renewal in flight,
        // which would rightly need a second connection).
        assert_eq!(
            own_backends(&db, &app).await,
            pools,
            "{strategy}: connections opened for 200 lock cycles and the renewals of a hold"
        );
        guard.release().await.unwrap();
    }
}

/// Warm connections the server ended are not an answer to a zero-wait try: the statement that
/// finds one dead gives the pool's others back to sqlx, and the attempt is made again on a
/// fresh one. Ended by an administrator, and by the server's `idle_session_timeout` (a managed
/// PostgreSQL's setting) while the connection was idle but still warm: a pinned hold's
/// release puts the session's own `idle_session_timeout` back, not none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_connections_the_server_ended_are_not_an_answer() {
    let _serial = SERIAL.lock().await;
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let db = admin(&pg).await;
    for (strategy, idle_timeout) in [
        ("unique-insert", false),
        ("advisory", false),
        ("unique-insert", true),
        ("for-update", true),
        ("advisory", true),
    ] {
        let app = format!("dlock_warm_{}", uuid::Uuid::new_v4().simple());
        let extra = if idle_timeout {
            "&options=-c%20idle_session_timeout%3D1000"
        } else {
            ""
        };
        let label = format!("{strategy}, idle_session_timeout {idle_timeout}");
        let provider = SqlProvider::connect(&pg_app_url(&pg, strategy, &app, extra))
            .await
            .unwrap();
        let names = Names::new();
        let (a, b) = (names.name("warm-a"), names.name("warm-b"));
        let (a, b) = (
            provider.lock(&a, LockOptions::default()).unwrap(),
            provider.lock(&b, LockOptions::default()).unwrap(),
        );
        // One after the other: one connection of each pool is open, and warm (none waits in
        // sqlx's queue, which hands out its idle connections untested).
        a.acquire().await.unwrap().release().await.unwrap();
        b.acquire().await.unwrap().release().await.unwrap();
        assert!(
            own_backends(&db, &app).await >= 1,
            "{label}: a connection open"
        );
        if !idle_timeout {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1",
            )
            .bind(&app)
            .execute(&db)
            .await
            .unwrap();
        }
        eventually(
            Duration::from_secs(20),
            &format!("{label}: the server ends the provider's connections"),
            || async {
                match own_backends(&db, &app).await {
                    0 => Ok(()),
                    n => Err(n),
                }
            },
        )
        .await;
        for (round, lock) in [&a, &b, &a].into_iter().enumerate() {
            let g = lock
                .try_acquire(Duration::ZERO)
                .await
                .unwrap_or_else(|e| {
                    panic!("{label}: round {round}: a free lock on dead warm connections: {e}")
                })
                .unwrap_or_else(|| panic!("{label}: round {round}: a free lock was reported held"));
            g.release().await.unwrap();
        }
    }
}

/// A provider whose runtime ended while it kept connections warm is dropped outside any
/// runtime without a panic (sqlx takes a connection back in a task, which needs one).
#[test]
fn a_provider_with_warm_connections_outlives_its_runtime() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let provider = runtime.block_on(async {
        let url = with_query(
            &pg,
            &format!("strategy=unique-insert&table={}", prefix("unique-insert")),
        );
        let provider = SqlProvider::connect(&url).await.unwrap();
        let lock = provider
            .lock(&Names::new().name("outlives"), LockOptions::default())
            .unwrap();
        lock.acquire().await.unwrap().release().await.unwrap();
        provider
    });
    drop(runtime);
    drop(provider);
}

/// A pinned strategy's `?pool=N` sizes its lock pool (a connection per held or waiting lock);
/// its statements' pool stays at most 16 beside it, so a provider asks the server for N + 16
/// connections, not 2N (with N = 64, twice that passed PostgreSQL's default 100 and stalled
/// acquires while connections were refused). Many `describe`s at once, which run on the
/// statements' pool, open no more than 16 connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_providers_statements_pool_stays_small() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let app = format!(
        "dlock_pool_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = with_query(
        &pg,
        &format!(
            "strategy=advisory&table={}&pool=48&application_name={app}",
            prefix("advisory")
        ),
    );
    let p = SqlProvider::connect(&url).await.unwrap();
    let name = Names::new().name("statements-pool");
    for _ in 0..5 {
        let describes: Vec<_> = (0..48)
            .map(|_| {
                let (p, name) = (p.clone(), name.clone());
                tokio::spawn(async move { p.describe(&name).await })
            })
            .collect();
        for d in describes {
            d.await.unwrap().unwrap();
        }
    }
    let db = admin(&pg).await;
    let open: i64 = sqlx::Row::try_get(
        &sqlx::query(&format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{app}'"
        ))
        .fetch_one(&db)
        .await
        .unwrap(),
        0,
    )
    .unwrap();
    // The statements' pool's 16, and the connection the lock pool opened when it was made.
    assert!(
        (1..=17).contains(&open),
        "{open} connections of the provider after 48 describes at once"
    );
}
