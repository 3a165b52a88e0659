//! Fencing tokens that only rise: an expired row taken over once, a row out of tokens, rows
//! deleted by hand or left by an older dlock.

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::{Names, must};
use dlock_core::{LockOptions, LockProvider};
use dlock_sql::SqlProvider;

use crate::support::*;

/// A row whose `expires_at` passed is taken over exactly once when 8 waiters race for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_row_is_taken_over_exactly_once() {
    let _serial = SERIAL.lock().await;
    for (url, label, file) in targets(&["unique-insert", "optimistic"]) {
        let name = Names::new().name("expired");
        let p = SqlProvider::connect(&url).await.unwrap();
        let db = admin(&url).await;
        let t = table_of(&url);
        let (ins, upd) = if label.ends_with("unique-insert") {
            (
                format!(
                    "INSERT INTO {t}_holds (name, owner, holds, takeovers, expires_at) VALUES (?, 'ghost:1', 1, 0, 1000)"
                ),
                None,
            )
        } else {
            (
                format!(
                    "INSERT INTO {t}_versions (name, owner, holds, version, expires_at) VALUES (?, 'ghost:1', 1, 7, 1000)"
                ),
                Some(7),
            )
        };
        sqlx::query(&ins)
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

/// A unique-insert row taken over 2^20 times has used up its tokens; the next
/// acquire starts a new row (a larger id, so larger tokens) instead of failing for good.
#[tokio::test]
async fn a_row_out_of_tokens_starts_afresh() {
    let (url, path) = sqlite_url("unique-insert");
    let (a, b) = (
        SqlProvider::connect(&url).await.unwrap(),
        SqlProvider::connect(&url).await.unwrap(),
    );
    let name = Names::new().name("worn-out");
    let old = a
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let admin = admin(&url).await;
    sqlx::query("UPDATE dlock_holds SET takeovers = 1048575, expires_at = 0 WHERE name = ?")
        .bind(name.as_bytes())
        .execute(&admin)
        .await
        .unwrap();
    let highest_old = old.fencing_token().get() | 0xF_FFFF;
    old.leak();
    let g = must(
        Duration::from_secs(10),
        "an acquire after the last takeover",
        b.lock(&name, LockOptions::default())
            .unwrap()
            .try_acquire(Duration::from_secs(5)),
    )
    .await
    .unwrap()
    .expect("the lock is free (expired)");
    assert!(
        g.fencing_token().get() > highest_old,
        "token {} not above the old row's {highest_old}",
        g.fencing_token().get()
    );
    g.release().await.unwrap();
    remove_sqlite(&path);
}

/// Optimistic tokens never go backwards, even when the name's row is deleted by hand (a
/// clean-up job, say): a new row starts at the versions of a new seed, above every earlier
/// one (a row started again at version 0 would give 1 after the delete). And a row whose seed
/// has no version left moves to a new seed before its next claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_tokens_survive_a_deleted_row() {
    for (url, label, file) in targets_with_postgres(&["optimistic"]) {
        let name = Names::new().name("reseed");
        let table = table_of(&url);
        let mut last = 0;
        let take = |last: &mut u64, token: u64, what: &str| {
            assert!(
                token > *last,
                "{label}: {what}: token {token} is not above the last one, {last}"
            );
            *last = token;
        };
        let p = SqlProvider::connect(&url).await.unwrap();
        let db = admin(&url).await;
        let lock = p.lock(&name, LockOptions::default()).unwrap();
        for _ in 0..2 {
            let g = lock.acquire().await.unwrap();
            take(&mut last, g.fencing_token().get(), "before the delete");
            g.release().await.unwrap();
        }
        let delete = q(
            &url,
            &format!("DELETE FROM {table}_versions WHERE name = ?"),
        );
        sqlx::query(&delete)
            .bind(name.as_bytes())
            .execute(&db)
            .await
            .unwrap();
        // The same provider (its cached version is gone with the row) and a fresh one.
        let fresh = SqlProvider::connect(&url).await.unwrap();
        for (who, provider) in [("same provider", &p), ("fresh provider", &fresh)] {
            let g = provider
                .lock(&name, LockOptions::default())
                .unwrap()
                .acquire()
                .await
                .unwrap();
            take(
                &mut last,
                g.fencing_token().get(),
                &format!("after the delete ({who})"),
            );
            g.release().await.unwrap();
        }
        // The next claim is the last of its seed; the one after it moves the row on.
        let end_of_seed = ((last >> 20) + 1) << 20;
        let set = q(
            &url,
            &format!("UPDATE {table}_versions SET version = ? WHERE name = ?"),
        );
        sqlx::query(&set)
            .bind(i64::try_from(end_of_seed - 2).unwrap())
            .bind(name.as_bytes())
            .execute(&db)
            .await
            .unwrap();
        last = end_of_seed - 2;
        for what in ["the last version of a seed", "the first of the next seed"] {
            let g = fresh
                .lock(&name, LockOptions::default())
                .unwrap()
                .acquire()
                .await
                .unwrap();
            take(&mut last, g.fencing_token().get(), what);
            g.release().await.unwrap();
        }
        assert!(last > end_of_seed, "{label}: moved to a new seed ({last})");
        if let Some(f) = file {
            remove_sqlite(&f);
        }
    }
}

/// Optimistic rows of an older dlock counted versions from 0, with no seed behind them, and a
/// busy name can be past 2^20. Their tokens never go backwards either: a row at the end of a
/// seed's versions moves to a seed above its own version (not merely the next seed), and a
/// provider raises the seed counter above the tables' versions when it connects, so such a
/// row deleted by hand comes back above them. The tables are the test's own (a fresh seed
/// counter), dropped at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_rows_of_an_older_dlock_keep_their_tokens_rising() {
    for (url, label, file) in targets_with_postgres(&["optimistic"]) {
        let table = format!(
            "dlock_legacy_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..16]
        );
        let url = with_query(
            url.split('?').next().unwrap(),
            &format!("strategy=optimistic&table={table}"),
        );
        let p = SqlProvider::connect(&url).await.unwrap();
        let db = admin(&url).await;
        let plant = |name: String, version: i64| {
            let db = db.clone();
            let insert = q(
                &url,
                &format!("INSERT INTO {table}_versions (name, version) VALUES (?, ?)"),
            );
            async move {
                sqlx::query(&insert)
                    .bind(name.into_bytes())
                    .bind(version)
                    .execute(&db)
                    .await
                    .unwrap();
            }
        };
        let token = |p: SqlProvider, name: String| async move {
            let g = p
                .lock(&name, LockOptions::default())
                .unwrap()
                .acquire()
                .await
                .unwrap();
            let t = g.fencing_token().get();
            g.release().await.unwrap();
            t
        };
        // A fresh name takes seed 1: versions from 2^20.
        let fresh = Names::new().name("fresh");
        assert!(token(p.clone(), fresh).await > 1 << 20, "{label}: seeded");
        // An old row two seeds further, one claim before the end of its versions.
        let old = Names::new().name("old");
        let end = (3u64 << 20) - 1;
        plant(old.clone(), i64::try_from(end - 1).unwrap()).await;
        assert_eq!(token(p.clone(), old.clone()).await, end, "{label}: last");
        let moved = token(p.clone(), old).await;
        assert!(
            moved > end,
            "{label}: the old row moved to a seed below its versions: {moved} after {end}"
        );
        // An old row far above the counter, seen by a provider that connects, then deleted.
        let deleted = Names::new().name("deleted");
        let high = (9u64 << 20) - 2;
        plant(deleted.clone(), i64::try_from(high).unwrap()).await;
        let later_provider = SqlProvider::connect(&url).await.unwrap();
        let delete = q(
            &url,
            &format!("DELETE FROM {table}_versions WHERE name = ?"),
        );
        sqlx::query(&delete)
            .bind(deleted.as_bytes())
            .execute(&db)
            .await
            .unwrap();
        let back = token(later_provider, deleted).await;
        assert!(
            back > high,
            "{label}: a deleted old row came back below its versions: {back} after {high}"
        );
        for suffix in ["meta", "holds", "versions", "seeds", "rows", "fence"] {
            sqlx::query(&format!("DROP TABLE IF EXISTS {table}_{suffix}"))
                .execute(&db)
                .await
                .unwrap();
        }
        if let Some(f) = file {
            remove_sqlite(&f);
        }
    }
}
