//! Locks taken inside a transaction the application owns (`lock_in`, `lock_in_pg`), against
//! real databases (MariaDB, PostgreSQL). A test binary of its own: the `sql` binary's tests
//! take turns through a lock in a `static`, so it must fit one shard of `scripts/test`.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::{Names, Partition, ProxyPartition, eventually, must, service_url};
use dlock_core::{FencingToken, LockOptions, LockProvider};
use dlock_sql::{SqlProvider, Strategy};

use crate::support::*;

/// A for-update lock taken inside the application's own transaction (`lock_in`) and a plain
/// for-update holder exclude each other; the lock ends with the transaction (commit or
/// rollback); its token is above every earlier holder's and never repeats after a rollback;
/// a connection outside a transaction is refused, as is a provider of another strategy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_in_the_callers_transaction_and_a_plain_holder_exclude_each_other() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let plain = SqlProvider::connect(&for_update(&mysql)).await.unwrap();
    let app = sqlx::MySqlPool::connect(&mysql).await.unwrap();
    let locks = crate::support::on_pool(app.clone(), Strategy::ForUpdate, &prefix("for-update"), 4)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS dlock_test_fenced \
         (id VARBINARY(255) NOT NULL PRIMARY KEY, fence BIGINT NOT NULL) ENGINE=InnoDB",
    )
    .execute(&app)
    .await
    .unwrap();
    let name = Names::new().name("in-tx");
    let plain_lock = plain.lock(&name, LockOptions::default()).unwrap();

    // The transaction holds it: a plain holder cannot take it, and gets it at the commit.
    let mut tx = app.begin().await.unwrap();
    let session_wait: u64 = sqlx::query_scalar("SELECT @@innodb_lock_wait_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let held = locks
        .lock_in(&mut tx, &name, Duration::ZERO)
        .await
        .unwrap()
        .expect("a free lock");
    assert_eq!(held.name().as_str(), name);
    assert!(
        plain_lock
            .try_acquire(Duration::ZERO)
            .await
            .unwrap()
            .is_none(),
        "the transaction holds the lock"
    );
    sqlx::query("INSERT INTO dlock_test_fenced (id, fence) VALUES (?, ?)")
        .bind(name.as_bytes())
        .bind(held.token().get())
        .execute(&mut *tx)
        .await
        .unwrap();
    let waiter = {
        let lock = Arc::clone(&plain_lock);
        tokio::spawn(async move { lock.try_acquire(Duration::from_secs(20)).await })
    };
    tx.commit().await.unwrap();
    let g = must(Duration::from_secs(25), "the plain waiter", waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("granted once the transaction committed");
    assert!(g.fencing_token() > held.token());
    let stored: i64 = sqlx::query_scalar("SELECT fence FROM dlock_test_fenced WHERE id = ?")
        .bind(name.as_bytes())
        .fetch_one(&app)
        .await
        .unwrap();
    assert_eq!(u64::try_from(stored).unwrap(), held.token().get());

    // The plain holder holds it: the transaction does not get it, waiting or not, and the
    // session's lock wait is put back afterwards.
    let mut tx = app.begin().await.unwrap();
    assert!(
        locks
            .lock_in(&mut tx, &name, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        locks
            .lock_in(&mut tx, &name, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none()
    );
    let after: u64 = sqlx::query_scalar("SELECT @@innodb_lock_wait_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(
        after, session_wait,
        "the session's lock wait was not put back"
    );
    tx.rollback().await.unwrap();
    let last_plain = g.fencing_token();
    g.release().await.unwrap();

    // A rollback ends the lock too; the token it had is never handed out again.
    let mut tx = app.begin().await.unwrap();
    let again = locks
        .lock_in(&mut tx, &name, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free again");
    assert!(again.token() > last_plain);
    tx.rollback().await.unwrap();
    let g = plain_lock
        .try_acquire(Duration::ZERO)
        .await
        .unwrap()
        .expect("free after the rollback");
    assert!(g.fencing_token() > again.token());
    g.release().await.unwrap();

    // Outside a transaction the row lock would end with its statement: refused.
    let mut conn = app.acquire().await.unwrap();
    let e = locks
        .lock_in(&mut conn, &name, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        matches!(e, dlock_core::Error::InvalidArgument { .. }),
        "{e}"
    );
    drop(conn);
    // Another strategy on the for-update tables is refused; on its own tables it cannot lock
    // in a transaction.
    let refused = crate::support::on_pool(
        app.clone(),
        Strategy::UniqueInsert,
        &prefix("for-update"),
        1,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(refused, dlock_core::Error::Config { .. }),
        "{refused}"
    );
    let other = crate::support::on_pool(
        app.clone(),
        Strategy::UniqueInsert,
        &prefix("unique-insert"),
        1,
    )
    .await
    .unwrap();
    let mut tx = app.begin().await.unwrap();
    let e = other
        .lock_in(&mut tx, &name, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(e, dlock_core::Error::Unsupported { .. }), "{e}");
    tx.rollback().await.unwrap();
    sqlx::query("DELETE FROM dlock_test_fenced WHERE id = ?")
        .bind(name.as_bytes())
        .execute(&app)
        .await
        .unwrap();
}

/// A PostgreSQL for-update lock in the caller's transaction excludes plain
/// holders and is excluded by them; a busy lock leaves the transaction usable (PostgreSQL
/// aborts a transaction whose statement failed), and the session's lock wait is put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_in_a_postgres_transaction_and_a_plain_holder_exclude_each_other() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let plain = SqlProvider::connect(&for_update(&pg)).await.unwrap();
    let app = sqlx::PgPool::connect(&pg).await.unwrap();
    let locks = crate::support::on_pool(app.clone(), Strategy::ForUpdate, &prefix("for-update"), 4)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS dlock_test_fenced (id BYTEA PRIMARY KEY, fence BIGINT NOT NULL)",
    )
    .execute(&app)
    .await
    .ok();
    let name = Names::new().name("in-pg-tx");
    let plain_lock = plain.lock(&name, LockOptions::default()).unwrap();

    // The transaction holds it: a plain holder cannot take it, and gets it at the commit.
    let mut tx = app.begin().await.unwrap();
    let held = locks
        .lock_in_pg(&mut tx, &name, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("a free lock");
    assert!(
        plain_lock
            .try_acquire(Duration::ZERO)
            .await
            .unwrap()
            .is_none(),
        "the transaction holds the lock"
    );
    sqlx::query("INSERT INTO dlock_test_fenced (id, fence) VALUES ($1, $2)")
        .bind(name.as_bytes())
        .bind(i64::try_from(held.token().get()).unwrap())
        .execute(&mut *tx)
        .await
        .unwrap();
    let waiter = {
        let lock = Arc::clone(&plain_lock);
        tokio::spawn(async move { lock.try_acquire(Duration::from_secs(20)).await })
    };
    tx.commit().await.unwrap();
    let g = must(Duration::from_secs(25), "the plain waiter", waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("granted once the transaction committed");
    assert!(g.fencing_token() > held.token());
    let stored: i64 = sqlx::query_scalar("SELECT fence FROM dlock_test_fenced WHERE id = $1")
        .bind(name.as_bytes())
        .fetch_one(&app)
        .await
        .unwrap();
    assert_eq!(u64::try_from(stored).unwrap(), held.token().get());

    // The plain holder holds it: the transaction does not get it, waiting or not, and stays
    // usable, with its lock wait as it was.
    let mut tx = app.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '7s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    for wait in [Duration::ZERO, Duration::from_millis(300)] {
        assert!(
            locks
                .lock_in_pg(&mut tx, &name, wait)
                .await
                .unwrap()
                .is_none(),
            "held by the plain holder (wait {wait:?})"
        );
    }
    let after: String = sqlx::query_scalar("SELECT current_setting('lock_timeout')")
        .fetch_one(&mut *tx)
        .await
        .expect("the transaction is still usable");
    assert_eq!(after, "7s", "the transaction's lock wait was not put back");
    tx.rollback().await.unwrap();
    let last_plain = g.fencing_token();
    g.release().await.unwrap();

    // A rollback ends the lock too; granted after a wait, the lock wait is put back.
    let mut tx = app.begin().await.unwrap();
    let again = locks
        .lock_in_pg(&mut tx, &name, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free again");
    assert!(again.token() > last_plain);
    let after: String = sqlx::query_scalar("SELECT current_setting('lock_timeout')")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(after, "0", "the session's lock wait was not put back");
    tx.rollback().await.unwrap();
    let g = plain_lock
        .try_acquire(Duration::ZERO)
        .await
        .unwrap()
        .expect("free after the rollback");
    assert!(g.fencing_token() > again.token());
    g.release().await.unwrap();

    // Outside a transaction, or on another strategy: refused.
    let mut conn = app.acquire().await.unwrap();
    let e = locks
        .lock_in_pg(&mut conn, &name, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        matches!(e, dlock_core::Error::InvalidArgument { .. }),
        "{e}"
    );
    drop(conn);
    // Another strategy on the for-update tables is refused; on its own tables it cannot lock
    // in a transaction.
    let refused = crate::support::on_pool(
        app.clone(),
        Strategy::UniqueInsert,
        &prefix("for-update"),
        1,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(refused, dlock_core::Error::Config { .. }),
        "{refused}"
    );
    let other = crate::support::on_pool(
        app.clone(),
        Strategy::UniqueInsert,
        &prefix("unique-insert"),
        1,
    )
    .await
    .unwrap();
    let mut tx = app.begin().await.unwrap();
    let e = other
        .lock_in_pg(&mut tx, &name, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(e, dlock_core::Error::Unsupported { .. }), "{e}");
    tx.rollback().await.unwrap();
    sqlx::query("DELETE FROM dlock_test_fenced WHERE id = $1")
        .bind(name.as_bytes())
        .execute(&app)
        .await
        .unwrap();
}

/// A deadlock whose victim is the transaction `lock_in` runs in: InnoDB rolls back the whole
/// transaction, so the error is not retryable (a retry on the same transaction would run in
/// autocommit and, on MySQL 8, hand out a lock that holds nothing). Transaction 1 has
/// changed 59 rows and holds the lock; transaction 2 has changed row 1 and asks for the lock
/// while transaction 1 asks for row 1: InnoDB picks the transaction that changed less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_that_rolls_back_the_callers_transaction_is_not_retryable() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let app = sqlx::MySqlPool::connect(&mysql).await.unwrap();
    let locks = crate::support::on_pool(app.clone(), Strategy::ForUpdate, &prefix("for-update"), 4)
        .await
        .unwrap();
    let table = format!(
        "dlock_test_deadlock_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    sqlx::query(&format!(
        "CREATE TABLE {table} (id INT NOT NULL PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB"
    ))
    .execute(&app)
    .await
    .unwrap();
    let rows: Vec<String> = (1..=60).map(|id| format!("({id}, 0)")).collect();
    sqlx::query(&format!("INSERT INTO {table} VALUES {}", rows.join(", ")))
        .execute(&app)
        .await
        .unwrap();
    let name = Names::new().name("deadlock");
    let update = |rows: &str| format!("UPDATE {table} SET v = v + 1 WHERE {rows}");

    let mut tx2 = app.begin().await.unwrap();
    sqlx::query(&update("id = 1"))
        .execute(&mut *tx2)
        .await
        .unwrap();
    let mut tx1 = app.begin().await.unwrap();
    sqlx::query(&update("id > 1"))
        .execute(&mut *tx1)
        .await
        .unwrap();
    let held = locks
        .lock_in(&mut tx1, &name, Duration::ZERO)
        .await
        .unwrap()
        .expect("a free lock");
    let first = {
        let update = update("id = 1");
        tokio::spawn(async move {
            let r = sqlx::query(&update).execute(&mut *tx1).await.map(|_| ());
            (tx1, r)
        })
    };
    let e = locks
        .lock_in(&mut tx2, &name, Duration::from_secs(10))
        .await
        .expect_err("the deadlock's victim");
    assert!(
        !e.is_retryable() && e.to_string().contains("rolled back"),
        "the victim's error must say its transaction is gone, not invite a retry: {e}"
    );
    let (tx1, r) = must(Duration::from_secs(10), "the surviving transaction", first)
        .await
        .unwrap();
    r.expect("the surviving transaction changes row 1 once the victim is rolled back");
    tx1.rollback().await.unwrap();
    drop(tx2);
    drop(held);
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&app)
        .await
        .unwrap();
}

/// `lock_in_pg` in a REPEATABLE READ (or SERIALIZABLE) transaction is refused, and the
/// transaction stays usable: its snapshot was taken before the lock could be granted, so it
/// would read what the lock protects as it was before the last holder's writes. The fault:
/// a plain holder writes a row and releases; the REPEATABLE READ transaction, whose snapshot
/// is older, asks for the lock. (Granted, it read the row without the holder's write.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_in_a_repeatable_read_transaction_is_refused() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let app = sqlx::PgPool::connect(&pg).await.unwrap();
    let locks = crate::support::on_pool(app.clone(), Strategy::ForUpdate, &prefix("for-update"), 2)
        .await
        .unwrap();
    let name = Names::new().name("in-snapshot");
    for isolation in ["REPEATABLE READ", "SERIALIZABLE"] {
        let mut tx = app.begin().await.unwrap();
        sqlx::query(&format!("SET TRANSACTION ISOLATION LEVEL {isolation}"))
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        // Another holder's turn comes and goes after the snapshot.
        hold(&locks, &name).await.release().await.unwrap();
        let e = locks
            .lock_in_pg(&mut tx, &name, Duration::from_millis(200))
            .await
            .expect_err("a lock whose transaction reads an older snapshot");
        assert!(
            matches!(e, dlock_core::Error::InvalidArgument { .. })
                && e.to_string().contains("READ COMMITTED"),
            "{isolation}: {e}"
        );
        sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .expect("the transaction is still usable");
        tx.rollback().await.unwrap();
    }
}

/// `lock_in_pg` on a transaction of another database than the provider's is refused:
/// advisory locks exclude each other within one database, so the lock would exclude none of
/// the provider's holders. The transaction here is on the server's `postgres` database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_in_a_transaction_of_another_database_is_refused() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let app = sqlx::PgPool::connect(&pg).await.unwrap();
    let locks = crate::support::on_pool(app.clone(), Strategy::ForUpdate, &prefix("for-update"), 2)
        .await
        .unwrap();
    let (base, _) = pg.rsplit_once('/').unwrap();
    let other = sqlx::PgPool::connect(&format!("{base}/postgres"))
        .await
        .unwrap();
    let name = Names::new().name("elsewhere");
    let held = hold(&locks, &name).await;
    let mut tx = other.begin().await.unwrap();
    let e = locks
        .lock_in_pg(&mut tx, &name, Duration::ZERO)
        .await
        .expect_err("a lock on another database, while a holder holds it here");
    assert!(
        matches!(e, dlock_core::Error::InvalidArgument { .. })
            && e.to_string().contains("database"),
        "{e}"
    );
    tx.rollback().await.unwrap();
    held.release().await.unwrap();
}

/// A `lock_in` dropped while it waits (a caller's timeout) leaves the caller's connection's
/// `innodb_lock_wait_timeout` as it was: the wait is the statement's own, never the
/// session's (a session value raised for the wait and put back after it stays raised on the
/// application's pooled connection when the call is dropped in between).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lock_in_leaves_the_session_as_it_was() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let plain = SqlProvider::connect(&for_update(&mysql)).await.unwrap();
    let app = sqlx::MySqlPool::connect(&mysql).await.unwrap();
    let locks = crate::support::on_pool(app.clone(), Strategy::ForUpdate, &prefix("for-update"), 4)
        .await
        .unwrap();
    let name = Names::new().name("dropped-lock-in");
    let held = plain
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let mut tx = app.begin().await.unwrap();
    let before: u64 = sqlx::query_scalar("SELECT @@innodb_lock_wait_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    // Cut off while it waits for the held row (its wait is 3 s).
    let cut = tokio::time::timeout(
        Duration::from_millis(1500),
        locks.lock_in(&mut tx, &name, Duration::from_secs(3)),
    )
    .await;
    assert!(cut.is_err(), "the lock_in was not waiting: {cut:?}");
    // The connection answers once the dropped statement's wait has run out; sqlx hands that
    // statement's answer (a lock wait timeout) to the next query first.
    let mut after = None;
    for _ in 0..2 {
        match sqlx::query_scalar::<_, u64>("SELECT @@innodb_lock_wait_timeout")
            .fetch_one(&mut *tx)
            .await
        {
            Ok(v) => {
                after = Some(v);
                break;
            }
            Err(e) => eprintln!("the dropped statement's answer: {e}"),
        }
    }
    let after = after.expect("the connection answers");
    assert_eq!(after, before, "the session's lock wait was left changed");
    drop(tx);
    held.release().await.unwrap();
}

/// `lock_in` and `lock_in_pg` on a provider made from the application's pool need no second
/// connection of that pool: with a pool of one connection, which the caller's transaction
/// holds, the lock is taken (its row and its fencing token come from the provider's own
/// connections) and a second one in a new transaction gets a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_in_needs_no_second_connection_of_the_callers_pool() {
    if let Some(mysql) = service_url("DLOCK_MYSQL_URL") {
        let app = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(POOL_PATIENCE)
            .connect(&mysql)
            .await
            .unwrap();
        let locks = on_pool(app.clone(), Strategy::ForUpdate, &prefix("one-conn"), 2)
            .await
            .unwrap();
        let name = Names::new().name("one-conn");
        twice_in_turn("lock_in", async || {
            let mut tx = app.begin().await.unwrap();
            let lock = locks.lock_in(&mut tx, &name, Duration::ZERO).await;
            tx.commit().await.unwrap();
            lock.unwrap().expect("a free lock").token()
        })
        .await;
    }
    if let Some(pg) = service_url("DLOCK_POSTGRES_URL") {
        let app = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(POOL_PATIENCE)
            .connect(&pg)
            .await
            .unwrap();
        let locks = on_pool(app.clone(), Strategy::ForUpdate, &prefix("one-conn"), 2)
            .await
            .unwrap();
        let name = Names::new().name("one-conn-pg");
        twice_in_turn("lock_in_pg", async || {
            let mut tx = app.begin().await.unwrap();
            let lock = locks.lock_in_pg(&mut tx, &name, Duration::ZERO).await;
            tx.commit().await.unwrap();
            lock.unwrap().expect("a free lock").token()
        })
        .await;
    }
}

/// How long the one-connection pools wait for their connection: longer than a `lock_in` is
/// given, so that one waiting for the pool fails the test by taking too long.
const POOL_PATIENCE: Duration = Duration::from_secs(120);

/// Takes a lock twice through `lock_in_a_transaction` (`what` in a new transaction of the
/// one-connection pool, committed), each within 20 s: the second token is the higher.
async fn twice_in_turn(what: &str, mut lock_in_a_transaction: impl AsyncFnMut() -> FencingToken) {
    let wait = Duration::from_secs(20);
    let what = format!("{what} with the pool's one connection in the transaction");
    let first = must(wait, &what, lock_in_a_transaction()).await;
    let second = must(wait, &what, lock_in_a_transaction()).await;
    assert!(second > first, "{first:?} then {second:?}");
}

/// A `lock_in` whose transaction ended after the grant but before its fencing token was
/// taken gets an error, never the token: by then a later holder may have taken the lock with
/// a lower one. The fault: the provider's statements go through a proxy that is partitioned
/// while the caller's transaction (on a connection of its own) waits for the row, so the
/// token's statement stalls after the grant; the caller's connection is then killed, a plain
/// holder takes the lock and its token, and the partition heals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_ended_before_its_token_gets_no_token() {
    use sqlx::Connection;
    if let Some(mysql) = service_url("DLOCK_MYSQL_URL") {
        let (proxy, proxied) = ProxyPartition::start(&mysql, 3306).await.unwrap();
        let app = sqlx::MySqlPool::connect(&proxied).await.unwrap();
        let locks = on_pool(app, Strategy::ForUpdate, &prefix("for-update"), 2)
            .await
            .unwrap();
        let mut caller = sqlx::MySqlConnection::connect(&mysql).await.unwrap();
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut caller)
            .await
            .unwrap();
        let name = Names::new().name("ended-before-token");
        let taken = {
            let name = name.clone();
            async move {
                let mut tx = caller.begin().await.unwrap();
                locks.lock_in(&mut tx, &name, Duration::from_secs(60)).await
            }
        };
        let state = format!(
            "SELECT CASE WHEN t.trx_state = 'LOCK WAIT' THEN 'waiting' \
             WHEN p.COMMAND = 'Sleep' THEN 'idle' ELSE 'busy' END \
             FROM information_schema.PROCESSLIST p \
             LEFT JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID \
             WHERE p.ID = {id}"
        );
        let kill = format!("KILL CONNECTION {id}");
        ended_before_its_token(&mysql, &name, &proxy, taken, &state, &kill).await;
    }
    if let Some(pg) = service_url("DLOCK_POSTGRES_URL") {
        let (proxy, proxied) = ProxyPartition::start(&pg, 5432).await.unwrap();
        let app = sqlx::PgPool::connect(&proxied).await.unwrap();
        let locks = on_pool(app, Strategy::ForUpdate, &prefix("for-update"), 2)
            .await
            .unwrap();
        let mut caller = sqlx::PgConnection::connect(&pg).await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut caller)
            .await
            .unwrap();
        let name = Names::new().name("ended-before-token-pg");
        let taken = {
            let name = name.clone();
            async move {
                let mut tx = caller.begin().await.unwrap();
                locks
                    .lock_in_pg(&mut tx, &name, Duration::from_secs(60))
                    .await
            }
        };
        let state = format!(
            "SELECT CASE WHEN wait_event_type = 'Lock' THEN 'waiting' \
             WHEN state = 'idle in transaction' THEN 'idle' ELSE 'busy' END \
             FROM pg_stat_activity WHERE pid = {pid}"
        );
        let kill = format!("SELECT pg_terminate_backend({pid})");
        ended_before_its_token(&pg, &name, &proxy, taken, &state, &kill).await;
    }
}

/// The case of [`a_transaction_that_ended_before_its_token_gets_no_token`] on the server
/// `url`: `taken` takes `name` in the caller's transaction (its provider behind `proxy`);
/// `state` says whether the caller's connection is `waiting` for a row lock or `idle`;
/// `kill` ends it.
async fn ended_before_its_token(
    url: &str,
    name: &str,
    proxy: &ProxyPartition,
    taken: impl Future<Output = dlock_core::Result<Option<dlock_sql::TxLock>>> + Send + 'static,
    state: &str,
    kill: &str,
) {
    let limit = Duration::from_secs(20);
    let admin = admin(url).await;
    let caller_is = async |wanted: &str| {
        let what = format!("the caller's connection {wanted}");
        eventually(limit, &what, async || {
            let now: String = sqlx::query_scalar(state)
                .fetch_one(&admin)
                .await
                .map_err(|e| e.to_string())?;
            if now == wanted { Ok(()) } else { Err(now) }
        })
        .await
    };
    let plain = SqlProvider::connect(&for_update(url)).await.unwrap();
    let first = plain.lock(name, LockOptions::default()).unwrap();
    let first = first.acquire().await.unwrap();
    let taken = tokio::spawn(taken);
    caller_is("waiting").await;
    // Granted at the release, the caller's transaction asks for its token through the
    // partitioned proxy: the statement waits there.
    proxy.set_partitioned(true);
    first.release().await.unwrap();
    caller_is("idle").await;
    sqlx::query(kill).execute(&admin).await.unwrap();
    let next = plain.lock(name, LockOptions::default()).unwrap();
    let next = must(limit, "the lock after the caller's end", next.acquire())
        .await
        .unwrap();
    proxy.set_partitioned(false);
    let taken = must(limit, "the caller's lock", taken).await.unwrap();
    match taken {
        Err(e) => assert!(
            !e.is_retryable() && e.to_string().contains("did not outlive"),
            "the error must say the transaction ended: {e}"
        ),
        Ok(lock) => panic!(
            "a transaction that had ended got {lock:?}, beside the holder's {:?}",
            next.fencing_token()
        ),
    }
    next.release().await.unwrap();
}
