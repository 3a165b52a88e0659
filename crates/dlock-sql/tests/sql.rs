//! SQL-specific tests against real databases: several OS processes contending, holders killed
//! with SIGKILL or `KILL <id>`, exactly-once takeover of an expired row, and round trips.
//!
//! The processes are this test binary run again (`worker_process`, which does nothing unless
//! `DLOCK_WORKER` is set), so the workers are real separate processes with their own pools.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{Lease, LockOptions, LockProvider};
use dlock_sql::SqlProvider;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};
use tokio::time::Instant;

/// MySQL tests in this file touch global status counters; they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn admin(url: &str) -> AnyPool {
    sqlx::any::install_default_drivers();
    let url = url.split('?').next().unwrap();
    AnyPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap()
}

fn sqlite_url(strategy: &str) -> (String, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("dlock-sql-{}.db", uuid::Uuid::new_v4().simple()));
    (
        format!("sqlite://{}?strategy={strategy}", path.display()),
        path,
    )
}

fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// Every (url, label) this machine can test: MySQL strategies when configured, SQLite ones
/// always. SQLite files are returned for cleanup.
fn targets(strategies: &[&str]) -> Vec<(String, String, Option<std::path::PathBuf>)> {
    let mut out = Vec::new();
    if let Some(mysql) = service_url("DLOCK_MYSQL_URL") {
        for s in strategies {
            out.push((format!("{mysql}?strategy={s}"), format!("mysql/{s}"), None));
        }
    }
    for s in strategies.iter().filter(|s| **s != "for-update") {
        let (url, path) = sqlite_url(s);
        out.push((url, format!("sqlite/{s}"), Some(path)));
    }
    out
}

/// A worker process, killed if the test ends (or fails) while it still runs.
struct Worker(std::process::Child);

impl std::ops::Deref for Worker {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Worker {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_worker(mode: &str, url: &str, name: &str, cycles: u32) -> Worker {
    Worker(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "worker_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DLOCK_WORKER", mode)
            .env("DLOCK_WORKER_URL", url)
            .env("DLOCK_WORKER_NAME", name)
            .env("DLOCK_WORKER_CYCLES", cycles.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

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
                let v: i64 = sqlx::query("SELECT value FROM dlock_test_counter WHERE name = ?")
                    .bind(name.as_bytes())
                    .fetch_one(&db)
                    .await
                    .unwrap()
                    .try_get(0)
                    .unwrap();
                tokio::task::yield_now().await;
                sqlx::query("UPDATE dlock_test_counter SET value = ? WHERE name = ?")
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
        other => panic!("unknown worker mode {other}"),
    }
}

/// Four OS processes × 25 cycles on one name through one database: the counter they update
/// read-then-write inside the critical section ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_contending_keep_the_counter_exact() {
    const PROCESSES: u32 = 4;
    const CYCLES: u32 = 25;
    let _serial = SERIAL.lock().await;
    for (url, label, file) in targets(&["unique-insert", "optimistic", "for-update"]) {
        let name = Names::new().name("cross");
        // Creates dlock's tables before the workers race to.
        let _p = SqlProvider::connect(&url).await.unwrap();
        let db = admin(&url).await;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS dlock_test_counter (name VARCHAR(255) NOT NULL PRIMARY KEY, value BIGINT NOT NULL)",
        )
        .execute(&db)
        .await
        .unwrap();
        sqlx::query("INSERT INTO dlock_test_counter (name, value) VALUES (?, 0)")
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
        let v: i64 = sqlx::query("SELECT value FROM dlock_test_counter WHERE name = ?")
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
    for (url, label, file) in targets(&["unique-insert", "optimistic", "for-update"]) {
        let name = Names::new().name("sigkill");
        let mut child = spawn_worker("hold", &url, &name, 0);
        let mut out = BufReader::new(child.stdout.take().unwrap());
        // The test harness prints its own lines first; wait for the worker's.
        let held = tokio::task::block_in_place(|| {
            let mut line = String::new();
            while out.read_line(&mut line).unwrap_or(0) > 0 {
                if line.trim_end().ends_with("HELD") {
                    return true;
                }
                line.clear();
            }
            false
        });
        assert!(held, "{label}: the worker never held the lock");
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

/// The for-update holder's connection killed with `KILL <id>`: `lost()` fires and another
/// client gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_for_update_connection_reports_loss() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let url = format!("{mysql}?strategy=for-update");
    let p = SqlProvider::connect(&url).await.unwrap();
    let name = Names::new().name("kill-conn");
    let opts = LockOptions::new().with_lease(Lease::watchdog(Duration::from_millis(900)));
    let g = p.lock(&name, opts).unwrap().acquire().await.unwrap();
    let id = p
        .holder_connection_id(&name)
        .expect("the holding connection");
    let db = admin(&mysql).await;
    sqlx::query(&format!("KILL {id}"))
        .execute(&db)
        .await
        .unwrap();
    must(Duration::from_secs(3), "lost() after KILL", g.lost()).await;
    assert!(!g.is_held());
    let other = SqlProvider::connect(&url).await.unwrap();
    let g2 = other
        .lock(&name, LockOptions::default())
        .unwrap()
        .try_acquire(Duration::from_secs(3))
        .await
        .unwrap();
    assert!(g2.is_some(), "free once the connection is gone");
}

/// A row whose `expires_at` passed is taken over exactly once when 8 waiters race for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_row_is_taken_over_exactly_once() {
    let _serial = SERIAL.lock().await;
    for (url, label, file) in targets(&["unique-insert", "optimistic"]) {
        let name = Names::new().name("expired");
        let p = SqlProvider::connect(&url).await.unwrap();
        let db = admin(&url).await;
        let (ins, upd) = if label.ends_with("unique-insert") {
            (
                "INSERT INTO dlock_holds (name, owner, holds, takeovers, expires_at) VALUES (?, 'ghost:1', 1, 0, 1000)",
                None,
            )
        } else {
            (
                "INSERT INTO dlock_versions (name, owner, holds, version, expires_at) VALUES (?, 'ghost:1', 1, 7, 1000)",
                Some(7),
            )
        };
        sqlx::query(ins)
            .bind(name.as_bytes())
            .execute(&db)
            .await
            .unwrap();
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let mut racers = Vec::new();
        for i in 0..8 {
            let p = if i % 2 == 0 {
                p.clone()
            } else {
                SqlProvider::connect(&url).await.unwrap()
            };
            let lock = p.lock(&name, LockOptions::default()).unwrap();
            let barrier = Arc::clone(&barrier);
            racers.push(tokio::spawn(async move {
                barrier.wait().await;
                lock.try_acquire(Duration::ZERO).await.unwrap()
            }));
        }
        let mut winners = Vec::new();
        for r in racers {
            if let Some(g) = r.await.unwrap() {
                winners.push(g);
            }
        }
        assert_eq!(winners.len(), 1, "{label}: exactly one takeover");
        if let Some(v) = upd {
            assert_eq!(
                winners[0].fencing_token().get(),
                v + 1,
                "{label}: the version is the token"
            );
        }
        for g in winners {
            g.release().await.unwrap();
        }
        db.close().await;
        if let Some(f) = file {
            remove_sqlite(&f);
        }
    }
}

/// An uncontended unique-insert acquire + release is one INSERT and one DELETE (MySQL status
/// counters); optimistic is one UPDATE each way once the version is known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_round_trips() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let db = admin(&mysql).await;
    async fn counters(db: &AnyPool) -> std::collections::HashMap<String, i64> {
        sqlx::query("SHOW GLOBAL STATUS LIKE 'Com\\_%'")
            .fetch_all(db)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|r| {
                let k: String = r.try_get(0).ok()?;
                let v: String = r.try_get(1).ok()?;
                Some((k, v.parse().ok()?))
            })
            .collect()
    }
    for (strategy, expect) in [
        (
            "unique-insert",
            [
                ("Com_insert", 10),
                ("Com_delete", 10),
                ("Com_update", 0),
                ("Com_select", 0),
            ],
        ),
        (
            "optimistic",
            [
                ("Com_insert", 0),
                ("Com_delete", 0),
                ("Com_update", 20),
                ("Com_select", 0),
            ],
        ),
    ] {
        let p = SqlProvider::connect(&format!("{mysql}?strategy={strategy}"))
            .await
            .unwrap();
        let lock = p
            .lock(&Names::new().name("rtt"), LockOptions::default())
            .unwrap();
        lock.acquire().await.unwrap().release().await.unwrap(); // creates rows, learns the version
        let before = counters(&db).await;
        for _ in 0..10 {
            lock.acquire().await.unwrap().release().await.unwrap();
        }
        let after = counters(&db).await;
        for (key, want) in expect {
            let got = after[key] - before[key];
            // The counters are the server's: another client's statement would show here too.
            assert_eq!(got, want, "{strategy}: {key} for 10 cycles");
        }
    }
}

/// Names with quotes, backslashes, LIKE wildcards, emoji and 255 bytes are stored as given;
/// 256 bytes is rejected before any SQL runs.
#[tokio::test]
async fn awkward_names_round_trip() {
    let (url, path) = sqlite_url("unique-insert");
    let p = SqlProvider::connect(&url).await.unwrap();
    let long = "n".repeat(255);
    for name in [
        "it's",
        "back\\slash",
        "100%",
        "a_b",
        "🔒 emoji",
        "\"q\"",
        long.as_str(),
    ] {
        let g = p
            .lock(name, LockOptions::default())
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let status = p.describe(name).await.unwrap();
        assert!(status.held, "{name}");
        g.release().await.unwrap();
    }
    let e = p
        .lock(&"n".repeat(256), LockOptions::default())
        .unwrap_err();
    assert!(matches!(e, dlock_core::Error::InvalidName { .. }));
    eventually(Duration::from_secs(1), "file exists", || async {
        if path.exists() {
            Ok(())
        } else {
            Err("no file")
        }
    })
    .await;
    remove_sqlite(&path);
}
