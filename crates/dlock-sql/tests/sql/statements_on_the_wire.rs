//! What reaches the server: the round trips of a cycle, names as given, no claim left by a
//! cancelled statement.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_sql::SqlProvider;
use sqlx::Row;

use crate::support::*;

/// An uncontended unique-insert acquire + release is one INSERT and one DELETE; optimistic is
/// one UPDATE each way once the version is known. Counted per statement this test's provider
/// sends (a current-thread runtime, so every statement of the provider runs on this thread).
/// MySQL/MariaDB only: sqlx runs SQLite statements on a worker thread of its own.
#[tokio::test]
async fn uncontended_round_trips() {
    let statements = Statements::installed();
    statements.watch_this_thread();
    let mysql = targets(&["unique-insert", "optimistic"])
        .into_iter()
        .filter(|(_, label, _)| label.starts_with("mysql/"));
    for (url, label, _) in mysql {
        let expect = if label.ends_with("unique-insert") {
            [("INSERT", 10), ("DELETE", 10), ("UPDATE", 0), ("SELECT", 0)]
        } else {
            [("INSERT", 0), ("DELETE", 0), ("UPDATE", 20), ("SELECT", 0)]
        };
        ten_cycles_send(statements, &url, &label, &expect).await;
    }
}

/// Runs 10 uncontended cycles on a provider of `url` (after one that creates the rows and
/// learns the version) and checks the statements this thread sent, by first word, against
/// `expect`.
async fn ten_cycles_send(
    statements: &Statements,
    url: &str,
    label: &str,
    expect: &[(&str, usize)],
) {
    let p = SqlProvider::connect(url).await.unwrap();
    let lock = p
        .lock(&Names::new().name("rtt"), LockOptions::default())
        .unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    statements.take();
    for _ in 0..10 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let sent = statements.take();
    for (verb, want) in expect {
        let got = sent.get(*verb).copied().unwrap_or(0);
        assert_eq!(
            got, *want,
            "{label}: {verb} statements for 10 cycles; all: {sent:?}"
        );
    }
}

/// A PostgreSQL release of unique-insert or optimistic is a statement of its own, and its
/// announcement to other processes' waiters (a `SELECT pg_notify(…)`) another, after it: the
/// release commits without PostgreSQL's cluster-wide notify lock, and a notify that fails (a
/// full notify queue behind a listener that stopped reading) cannot undo it. Counted as in
/// [`uncontended_round_trips`]: 10 cycles send 10 releases and 10 announcements.
#[tokio::test]
async fn postgres_releases_commit_before_their_announcement() {
    let statements = Statements::installed();
    statements.watch_this_thread();
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    for strategy in ["unique-insert", "optimistic"] {
        let url = with_query(
            &pg,
            &format!("strategy={strategy}&table={}", prefix(strategy)),
        );
        let (release, acquire) = if strategy == "unique-insert" {
            (("DELETE", 10), ("INSERT", 10))
        } else {
            (("UPDATE", 20), ("INSERT", 0))
        };
        let expect = [release, acquire, ("SELECT", 10), ("WITH", 0)];
        ten_cycles_send(statements, &url, &format!("postgres/{strategy}"), &expect).await;
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
        assert!(status.is_held(), "{name}");
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

/// An acquire dropped while its claim statement is still running must not leave a claim
/// behind. The claim is held up by a write transaction of the test's own, so the drop lands
/// mid-statement every time; the statement then finishes after the drop. The undo runs on the
/// claim's connection, after it: on another connection it could run before the claim and
/// leave the "free" lock claimed for a whole lease. The case waits until the claim has run
/// (the row's version moved) and then requires it undone.
#[tokio::test]
async fn optimistic_acquire_cancelled_mid_statement_leaves_no_claim() {
    let (url, path) = sqlite_url("optimistic");
    let a = SqlProvider::connect(&url).await.unwrap();
    let name = Names::new().name("cancel-mid-statement");
    // First use: the row exists and its version is cached, so the next acquire's first
    // statement is the claim itself.
    let lock = a.lock(&name, LockOptions::default()).unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    let version = || async {
        let row = sqlx::query("SELECT owner, version FROM dlock_versions WHERE name = ?")
            .bind(name.as_bytes())
            .fetch_one(&admin(&url).await)
            .await
            .unwrap();
        (
            row.try_get::<String, _>(0).unwrap(),
            row.try_get::<i64, _>(1).unwrap(),
        )
    };
    let (_, before) = version().await;

    let blocker = admin(&url).await;
    let mut tx = blocker.begin().await.unwrap();
    sqlx::query("INSERT INTO dlock_fence (name, token) VALUES ('blocker', 1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The claim waits for the blocker's write lock (busy timeout 5 s) until the drop.
    let r = tokio::time::timeout(Duration::from_millis(300), lock.acquire()).await;
    assert!(r.is_err(), "the acquire got through the blocker");
    tx.rollback().await.unwrap();
    blocker.close().await;

    eventually(
        Duration::from_secs(5),
        "the cancelled claim ran and was undone",
        || async {
            match version().await {
                (owner, v) if v > before && owner.is_empty() => Ok(()),
                seen => Err(seen),
            }
        },
    )
    .await;
    remove_sqlite(&path);
}

/// A PostgreSQL unique-insert waiter's polls insert nothing: each was a failing INSERT (a
/// server ERROR naming the lock in the log, an aborted transaction, a dead tuple). Three
/// waiters poll a held name for a second, then each takes it in turn; the tables are the
/// test's own, and their rows inserted are counted by the server once the providers' backends
/// are ended (a backend hands its counts over when it exits): one per grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_unique_insert_waiters_insert_nothing_while_they_wait() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let table = format!("dlock_polls_{}", &id[..8]);
    let app = format!("dlock-polls-{}", &id[..8]);
    let url = with_query(
        &pg,
        &format!("strategy=unique-insert&table={table}&application_name={app}"),
    );
    let name = Names::new().name("polls");
    let holder = SqlProvider::connect(&url).await.unwrap();
    let g = holder
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let p = SqlProvider::connect(&url).await.unwrap();
        let lock = p.lock(&name, LockOptions::default()).unwrap();
        waiters.push(tokio::spawn(async move {
            let g = lock.acquire().await?;
            g.release().await?;
            Ok::<_, dlock_core::Error>(p)
        }));
    }
    // The waiters poll the held name meanwhile (each poll of the old statement a failed INSERT).
    let polled = tokio::time::timeout(Duration::from_secs(1), async {
        for w in &mut waiters {
            w.await.unwrap().unwrap();
        }
    })
    .await;
    assert!(polled.is_err(), "a waiter got a held lock");
    g.release().await.unwrap();
    let mut providers = vec![holder];
    for w in waiters {
        let p = must(Duration::from_secs(10), "a waiter after the release", w)
            .await
            .unwrap()
            .unwrap();
        providers.push(p);
    }
    // Dropped providers close their connections; whatever is left open is ended.
    drop(providers);
    let db = admin(&pg).await;
    eventually(
        Duration::from_secs(20),
        "the providers' backends end",
        || async {
            let n: i64 = sqlx::query(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = $1",
            )
            .bind(&app)
            .fetch_one(&db)
            .await
            .unwrap()
            .get(0);
            if n == 0 { Ok(()) } else { Err(n) }
        },
    )
    .await;
    let inserted: i64 = sqlx::query(
        "SELECT COALESCE(SUM(n_tup_ins), -1)::BIGINT FROM pg_stat_user_tables WHERE relname = $1",
    )
    .bind(format!("{table}_holds"))
    .fetch_one(&db)
    .await
    .unwrap()
    .get(0);
    for t in ["meta", "holds", "versions", "seeds", "fence"] {
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}_{t}"))
            .execute(&db)
            .await;
    }
    assert_eq!(
        inserted, 4,
        "rows inserted into the holds table for 4 grants (the polls of 3 waiters in between)"
    );
}
