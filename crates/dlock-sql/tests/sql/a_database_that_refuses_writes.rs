//! A database that refuses writes (a read-only server, session or transaction: a replica, a
//! primary demoted by a failover, a hot standby) is a clear error that names the cause and
//! says that retrying cannot help, at once, for `try_acquire` and for `acquire()` alike: never
//! a lock held by someone else, never a wait for ever.

use std::time::Duration;

use dlock_conformance::{Names, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_sql::{SqlProvider, Strategy};
use tokio::time::Instant;

use crate::support::*;

/// Asks for a new name through `provider`, whose statements now run in a read-only
/// session, and checks the answer: a non-retryable error naming `cause`.
async fn refused(label: &str, provider: &SqlProvider, cause: &str) {
    let name = Names::new().name("read-only");
    let lock = provider.lock(&name, LockOptions::default()).unwrap();
    let tries = [
        ("try_acquire(2 s)", lock.try_acquire(Duration::from_secs(2))),
        (
            "acquire()",
            Box::pin(async { lock.acquire().await.map(Some) }),
        ),
    ];
    for (call, fut) in tries {
        let what = format!("{label}: {call} in a read-only session");
        match must(Duration::from_secs(10), &what, fut).await {
            Err(e) => {
                let message = e.to_string();
                assert!(!e.is_retryable(), "{what}: retryable: {message}");
                assert!(
                    message.contains("refuses writes") && message.contains(cause),
                    "{what}: the error does not name the cause ({cause}): {message}"
                );
            }
            Ok(None) => panic!("{what}: taken for a lock held by someone"),
            Ok(Some(_)) => panic!("{what}: granted"),
        }
    }
}

/// MariaDB/MySQL: a provider on the application's pool (one connection), whose session is
/// then made read-only (`SET SESSION TRANSACTION READ ONLY`; the server's `read_only` is
/// global, and would refuse the other tests' writes too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_mysql_session() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    for strategy in [
        Strategy::UniqueInsert,
        Strategy::Optimistic,
        Strategy::ForUpdate,
    ] {
        let label = format!("mysql/{strategy}");
        let app = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .connect(mysql.split('?').next().unwrap())
            .await
            .unwrap();
        let table = prefix(&strategy.to_string());
        let provider = crate::support::on_pool(app.clone(), strategy, &table, 2)
            .await
            .unwrap();
        let mut c = app.acquire().await.unwrap();
        sqlx::Executor::execute(&mut *c, "SET SESSION TRANSACTION READ ONLY")
            .await
            .unwrap();
        drop(c);
        refused(&label, &provider, "transaction_read_only").await;
    }
}

/// SQLite: a provider on a file opened read-only (`mode=ro`, as a read-only mount or
/// permissions would) cannot record its strategy, and says why at once.
#[tokio::test]
async fn a_read_only_sqlite_file() {
    let (url, path) = sqlite_url("unique-insert");
    let writable = SqlProvider::connect(&url).await.unwrap();
    drop(writable);
    let started = Instant::now();
    let refused = SqlProvider::connect(&format!("{url}&mode=ro")).await;
    remove_sqlite(&path);
    match refused {
        Err(e) => {
            let message = e.to_string();
            assert!(!e.is_retryable(), "retryable: {message}");
            assert!(
                message.contains("refuses writes") && message.contains("mode=ro"),
                "the error does not name the cause: {message}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "retried a refusal for {:?}",
                started.elapsed()
            );
        }
        Ok(_) => panic!("a provider on a read-only file connected"),
    }
}

/// PostgreSQL: a provider on the application's pool (one connection), whose session then
/// sets `default_transaction_read_only` (what a role or database setting, or a hot
/// standby, gives every session); and a provider whose connections have it from the
/// start, which cannot even create its tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_postgres_session() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let base = pg.split('?').next().unwrap();
    for strategy in [
        Strategy::UniqueInsert,
        Strategy::Optimistic,
        Strategy::ForUpdate,
        Strategy::Advisory,
    ] {
        let label = format!("postgres/{strategy}");
        let app = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(base)
            .await
            .unwrap();
        let table = prefix(&strategy.to_string());
        let provider = crate::support::on_pool(app.clone(), strategy, &table, 2)
            .await
            .unwrap();
        let mut c = app.acquire().await.unwrap();
        sqlx::Executor::execute(&mut *c, "SET SESSION default_transaction_read_only = on")
            .await
            .unwrap();
        drop(c);
        refused(&label, &provider, "default_transaction_read_only").await;
    }
    let url = with_query(
        &pg,
        "strategy=unique-insert&table=dlock_unique_insert\
         &options=-c%20default_transaction_read_only%3Don",
    );
    let started = Instant::now();
    match SqlProvider::connect(&url).await {
        Err(e) => {
            let message = e.to_string();
            assert!(!e.is_retryable(), "connect: retryable: {message}");
            assert!(
                message.contains("refuses writes")
                    && message.contains("default_transaction_read_only"),
                "connect: the error does not name the cause: {message}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "connect: retried a refusal for {:?}",
                started.elapsed()
            );
        }
        Ok(_) => panic!("a provider on read-only sessions connected"),
    }
}
