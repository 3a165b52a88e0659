//! The watchdog's renewals on the row strategies: a provider's holds renew with one statement
//! per batch rather than one each, and a hold taken by another owner is lost alone.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must};
use dlock_core::{HoldState, LockGuard, LockOptions, LockProvider};
use dlock_sql::SqlProvider;
use sqlx::{AnyPool, Row};

use crate::support::*;

/// Holds per target, granted 25 ms apart over a second: alone, each would renew a third of
/// the default 30 s lease after its own grant; batched, they come due on one or two beats.
const HOLDS: usize = 40;

/// The `expires_at` of each of `names`' rows in `table` (0 for a row that is gone).
async fn expiries(db: &AnyPool, table: &str, url: &str, names: &[String]) -> Vec<i64> {
    let sql = q(
        url,
        &format!("SELECT expires_at FROM {table} WHERE name = ?"),
    );
    let mut out = Vec::new();
    for name in names {
        let row = sqlx::query(&sql)
            .bind(name.as_bytes())
            .fetch_optional(db)
            .await
            .unwrap();
        out.push(row.map_or(0, |r| r.get::<i64, _>(0)));
    }
    out
}

/// One target: 40 holds, the first then taken by another owner behind dlock's back; once
/// every other row's expiry moved, the moves came from at most a few statements (SQLite and
/// MySQL read the clock once per statement, PostgreSQL's `clock_timestamp()` once per row,
/// all within a millisecond or two), and only the first hold is lost.
async fn renew_together(url: String, label: String) {
    let p = SqlProvider::connect(&url).await.unwrap();
    let db = admin(&url).await;
    let table = if label.ends_with("unique-insert") {
        format!("{}_holds", table_of(&url))
    } else {
        format!("{}_versions", table_of(&url))
    };
    let ns = Names::new();
    let names: Vec<String> = (0..HOLDS).map(|i| ns.name(&format!("h{i}"))).collect();
    let mut guards: Vec<LockGuard> = Vec::new();
    let mut spacing = tokio::time::interval(Duration::from_millis(25));
    for name in &names {
        spacing.tick().await;
        let lock = p.lock(name, LockOptions::default()).unwrap();
        guards.push(lock.acquire().await.unwrap());
    }
    sqlx::query(&q(
        &url,
        &format!("UPDATE {table} SET owner = 'someone-else:1' WHERE name = ?"),
    ))
    .bind(names[0].as_bytes())
    .execute(&db)
    .await
    .unwrap();
    let granted = expiries(&db, &table, &url, &names[1..]).await;
    let renewed = eventually(
        Duration::from_secs(25),
        &format!("{label}: every hold renewed once"),
        || async {
            let now = expiries(&db, &table, &url, &names[1..]).await;
            if now.iter().zip(&granted).all(|(n, g)| n > g) {
                Ok(now)
            } else {
                Err(now)
            }
        },
    )
    .await;
    let mut stamps = renewed.clone();
    stamps.sort_unstable();
    stamps.dedup();
    assert!(
        stamps.len() <= 6,
        "{label}: {} holds renewed at {} distinct times: not in batches",
        HOLDS - 1,
        stamps.len()
    );
    must(
        Duration::from_secs(5),
        &format!("{label}: the stolen hold is lost"),
        guards[0].lost(),
    )
    .await;
    for (i, g) in guards.iter().enumerate().skip(1) {
        assert_eq!(g.state(), HoldState::Held, "{label}: hold {i}");
    }
    for g in guards.into_iter().skip(1) {
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_holds_renew_together_and_each_is_lost_alone() {
    let targets = targets_with_postgres(&["unique-insert", "optimistic"]);
    let runs: Vec<_> = targets
        .iter()
        .map(|(url, label, _)| tokio::spawn(renew_together(url.clone(), label.clone())))
        .collect();
    for run in runs {
        run.await.unwrap();
    }
    for (_, _, file) in targets {
        if let Some(path) = file {
            remove_sqlite(&path);
        }
    }
}
