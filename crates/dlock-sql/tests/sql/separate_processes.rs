//! Holders and waiters in separate OS processes: contention, a holder killed, a holder frozen.

use std::process::Command;
use std::time::Duration;

use dlock_conformance::{Names, must};
use dlock_core::backend::later;
use dlock_core::{Lease, LockOptions, LockProvider};
use dlock_sql::SqlProvider;
use sqlx::Row;
use tokio::time::Instant;

use crate::support::*;

/// The worker side, run in a child process: `count` does read-yield-write increments of a
/// counter row under the lock; `hold` takes the lock, says HELD, and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    let Ok(mode) = std::env::var("DLOCK_WORKER") else {
        return;
    };
    let url = std::env::var("DLOCK_WORKER_URL").unwrap();
    let name = std::env::var("DLOCK_WORKER_NAME").unwrap();
    let cycles: u32 = std::env::var("DLOCK_WORKER_CYCLES")
        .unwrap()
        .parse()
        .unwrap();
    let p = SqlProvider::connect(&url).await.unwrap();
    let lease = LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(2)));
    let lock = p.lock(&name, lease).unwrap();
    match mode.as_str() {
        "count" => {
            let db = admin(&url).await;
            for _ in 0..cycles {
                let g = lock.acquire().await.unwrap();
                let v: i64 = sqlx::query(&q(
                    &url,
                    "SELECT value FROM dlock_test_counter WHERE name = ?",
                ))
                .bind(name.as_bytes())
                .fetch_one(&db)
                .await
                .unwrap()
                .try_get(0)
                .unwrap();
                tokio::task::yield_now().await;
                sqlx::query(&q(
                    &url,
                    "UPDATE dlock_test_counter SET value = ? WHERE name = ?",
                ))
                .bind(v + 1)
                .bind(name.as_bytes())
                .execute(&db)
                .await
                .unwrap();
                g.release().await.unwrap();
            }
        }
        "hold" => {
            let _g = lock.acquire().await.unwrap();
            println!("HELD");
            std::future::pending::<()>().await;
        }
        "hold-fixed" => {
            let fixed = LockOptions::new().with_lease(Lease::Fixed(FIXED_LEASE));
            let _g = p.lock(&name, fixed).unwrap().acquire().await.unwrap();
            println!("HELD");
            std::future::pending::<()>().await;
        }
        other => panic!("unknown worker mode {other}"),
    }
}

/// The fixed lease of the `hold-fixed` worker.
const FIXED_LEASE: Duration = Duration::from_secs(4);

/// Four OS processes × 25 cycles on one name through one database: the counter they update
/// read-then-write inside the critical section ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_contending_keep_the_counter_exact() {
    const PROCESSES: u32 = 4;
    const CYCLES: u32 = 25;
    let _serial = SERIAL.lock().await;
    for (url, label, file) in targets_with_postgres(&[
        "unique-insert",
        "optimistic",
        "for-update",
        "advisory",
        "get-lock",
    ]) {
        let name = Names::new().name("cross");
        // Creates dlock's tables before the workers race to.
        let _p = SqlProvider::connect(&url).await.unwrap();
        let db = admin(&url).await;
        let bytes = if url.starts_with("postgres") {
            "BYTEA"
        } else {
            "VARBINARY(255)"
        };
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS dlock_test_counter (name {bytes} NOT NULL PRIMARY KEY, value BIGINT NOT NULL)",
        ))
        .execute(&db)
        .await
        .unwrap();
        sqlx::query(&q(
            &url,
            "INSERT INTO dlock_test_counter (name, value) VALUES (?, 0)",
        ))
        .bind(name.as_bytes())
        .execute(&db)
        .await
        .unwrap();
        let mut children: Vec<_> = (0..PROCESSES)
            .map(|_| spawn_worker("count", &url, &name, CYCLES))
            .collect();
        let started = Instant::now();
        for child in &mut children {
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(status.success(), "{label}: a worker failed: {status}");
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "{label}: workers hang"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let v: i64 = sqlx::query(&q(
            &url,
            "SELECT value FROM dlock_test_counter WHERE name = ?",
        ))
        .bind(name.as_bytes())
        .fetch_one(&db)
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
        assert_eq!(v, i64::from(PROCESSES * CYCLES), "{label}: lost updates");
        db.close().await;
        if let Some(f) = file {
            remove_sqlite(&f);
        }
    }
}

/// A holder process killed with SIGKILL: the lock is free again within its lease
/// (unique-insert, optimistic), or at once (for-update: the server drops the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_lock() {
    let _serial = SERIAL.lock().await;
    for (url, label, file) in targets_with_postgres(&[
        "unique-insert",
        "optimistic",
        "for-update",
        "advisory",
        "get-lock",
    ]) {
        let name = Names::new().name("sigkill");
        let mut child = spawn_worker("hold", &url, &name, 0);
        await_held(&mut child, &label);
        let p = SqlProvider::connect(&url).await.unwrap();
        let lock = p.lock(&name, LockOptions::default()).unwrap();
        assert!(
            lock.try_acquire(Duration::ZERO).await.unwrap().is_none(),
            "{label}: held by the child"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        let killed = Instant::now();
        let limit = if label.ends_with("for-update") {
            Duration::from_secs(3)
        } else {
            Duration::from_secs(2) + Duration::from_secs(3)
        };
        let g = must(
            limit,
            &format!("{label}: free after SIGKILL"),
            lock.acquire(),
        )
        .await
        .unwrap();
        eprintln!("{label}: free {:?} after SIGKILL", killed.elapsed());
        g.release().await.unwrap();
        if let Some(f) = file {
            remove_sqlite(&f);
        }
    }
}

/// A holder process frozen with SIGSTOP (a GC pause, a VM migration, a partition) past its 2 s
/// lease loses the lock, and another process acquires it within the lease + 2 s: by the
/// row's expiry (unique-insert, optimistic), or by the server-side lease of for-update (the
/// server ends a connection idle longer than its `wait_timeout` or
/// `idle_in_transaction_session_timeout`; without it the row stayed locked for the server's
/// default, 8 hours on MySQL, forever on PostgreSQL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_holder_process_loses_the_lock_within_its_lease() {
    let _serial = SERIAL.lock().await;
    for (url, label, file) in targets_with_postgres(&[
        "unique-insert",
        "optimistic",
        "for-update",
        "advisory",
        "get-lock",
    ]) {
        let name = Names::new().name("sigstop");
        let mut child = spawn_worker("hold", &url, &name, 0);
        await_held(&mut child, &label);
        let p = SqlProvider::connect(&url).await.unwrap();
        let lock = p.lock(&name, LockOptions::default()).unwrap();
        assert!(
            lock.try_acquire(Duration::ZERO).await.unwrap().is_none(),
            "{label}: held by the child"
        );
        let stopped = Command::new("kill")
            .args(["-STOP", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
        let frozen = Instant::now();
        // The lease is 2 s (renewed every 2/3 s): the row or the connection outlives the
        // freeze by at most that, plus the 2 s the issue allows.
        let g = must(
            Duration::from_secs(4) + Duration::from_secs(1),
            &format!("{label}: free after the holder froze"),
            lock.try_acquire(Duration::from_secs(4)),
        )
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{label}: still held 4 s after its holder froze"));
        eprintln!("{label}: free {:?} after SIGSTOP", frozen.elapsed());
        g.release().await.unwrap();
        let _ = Command::new("kill")
            .args(["-CONT", &child.id().to_string()])
            .status();
        drop(child);
        if let Some(f) = file {
            remove_sqlite(&f);
        }
    }
}

/// A for-update holder with a fixed lease, frozen (SIGSTOP) shortly before that lease ends,
/// loses the row at its end, not a whole lease after its last sign of life: the server is held
/// to the fixed lease (the holder's watcher keeps the server-side lease at what is left of
/// it), so another process acquires within the lease + 2 s of the grant. With only pings, the
/// server kept the row until the last ping plus the whole lease (about 7 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_its_fixed_lease_at_its_end() {
    let _serial = SERIAL.lock().await;
    for (url, label, _) in targets_with_postgres(&["for-update", "advisory", "get-lock"]) {
        let name = Names::new().name("fixed-freeze");
        let mut child = spawn_worker("hold-fixed", &url, &name, 0);
        await_held(&mut child, &label);
        let granted = Instant::now();
        // Freeze it 3.2 s into its 4 s lease: it has just confirmed its connection.
        tokio::time::sleep_until(later(granted, Duration::from_millis(3200))).await;
        let stopped = Command::new("kill")
            .args(["-STOP", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
        let p = SqlProvider::connect(&url).await.unwrap();
        let lock = p.lock(&name, LockOptions::default()).unwrap();
        let bound = later(granted, FIXED_LEASE + Duration::from_secs(2));
        let g = must(
            Duration::from_secs(10),
            &format!("{label}: the try after the freeze"),
            lock.try_acquire(bound.saturating_duration_since(Instant::now())),
        )
        .await
        .unwrap()
        .unwrap_or_else(|| {
            panic!(
                "{label}: still held {:?} after the grant of a {FIXED_LEASE:?} fixed lease",
                granted.elapsed()
            )
        });
        eprintln!(
            "{label}: free {:?} after the grant of a {FIXED_LEASE:?} fixed lease",
            granted.elapsed()
        );
        g.release().await.unwrap();
        let _ = Command::new("kill")
            .args(["-CONT", &child.id().to_string()])
            .status();
        drop(child);
    }
}
