//! A server's limits on how long a statement may run (a PostgreSQL role's, database's or
//! URL's `statement_timeout`, a MariaDB user's `MAX_STATEMENT_TIME`) never end a wait the
//! caller asked for, against real databases. A test binary of its own: the `sql` binary's
//! tests take turns through a lock in a `static`, so it must fit one shard of `scripts/test`.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use dlock_conformance::{Names, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_sql::{SqlProvider, Strategy};
use tokio::time::Instant;

use crate::support::*;

/// A `statement_timeout` the role, the database or the URL sets (managed services often set
/// 30-60 s) does not cut a waiting for-update or advisory acquire short: the wait is the
/// caller's. The waiter's URL sets 500 ms; it waits its whole 2 s and is answered "held".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_does_not_end_a_wait() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    for strategy in ["for-update", "advisory"] {
        let url = with_query(
            &pg,
            &format!("strategy={strategy}&table={}", prefix(strategy)),
        );
        let waiter = with_query(&url, "options=-c%20statement_timeout%3D500");
        waits_its_whole_wait(strategy, &url, &waiter, Duration::from_secs(2)).await;
    }
}

/// MariaDB's `MAX_STATEMENT_TIME` of a user (or of the server; managed services set one)
/// does not cut a waiting for-update or get-lock acquire short either, nor a `lock_in` on the
/// application's connection: the waiter logs in as a user whose statements the server ends
/// after 1 s (`DLOCK_MYSQL_TIMED_URL`, made by `scripts/services`), waits its whole 3 s and
/// is answered "held". (MySQL has no such limit on a locking read.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_statement_time_does_not_end_a_wait() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&admin(&mysql).await)
        .await
        .unwrap();
    if !version.contains("MariaDB") {
        eprintln!("skipped: {version} is not MariaDB, which alone limits a user's statements");
        return;
    }
    let Some(timed) = service_url("DLOCK_MYSQL_TIMED_URL") else {
        return;
    };
    let wait = Duration::from_secs(3);
    for strategy in ["for-update", "get-lock"] {
        let tables = format!("strategy={strategy}&table={}", prefix(strategy));
        let (holder, waiter) = (with_query(&mysql, &tables), with_query(&timed, &tables));
        waits_its_whole_wait(strategy, &holder, &waiter, wait).await;
    }
    let holder = SqlProvider::connect(&for_update(&mysql)).await.unwrap();
    let app = sqlx::MySqlPool::connect(&timed).await.unwrap();
    let locks = on_pool(app.clone(), Strategy::ForUpdate, &prefix("for-update"), 2)
        .await
        .unwrap();
    let name = Names::new().name("statement-time-in-tx");
    let g = hold(&holder, &name).await;
    let mut tx = app.begin().await.unwrap();
    let started = Instant::now();
    let r = locks.lock_in(&mut tx, &name, wait).await;
    assert!(
        matches!(r, Ok(None)),
        "lock_in: a wait past the user's max_statement_time: {r:?}"
    );
    assert!(started.elapsed() >= wait, "lock_in: gave up early");
    drop(tx);
    g.release().await.unwrap();
}

/// A provider of `holder` holds a lock, and one of `waiter` (whose statements the server
/// would end sooner) tries it for `wait`: it is answered "held", after the whole wait.
async fn waits_its_whole_wait(strategy: &str, holder: &str, waiter: &str, wait: Duration) {
    let holder = SqlProvider::connect(holder).await.unwrap();
    let waiter = SqlProvider::connect(waiter).await.unwrap();
    let name = Names::new().name("statement-time");
    let g = hold(&holder, &name).await;
    let started = Instant::now();
    let r = waiter
        .lock(&name, LockOptions::default())
        .unwrap()
        .try_acquire(wait)
        .await;
    assert!(
        matches!(r, Ok(None)),
        "{strategy}: a wait past the server's statement time limit: {r:?}"
    );
    assert!(started.elapsed() >= wait, "{strategy}: gave up early");
    g.release().await.unwrap();
}
