//! The for-update cases that drive the strategy's own steps: a grant, its fence, a kill of
//! a waiting connection, a stalled first try.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "postgres")]
use dlock_core::backend::Deadline;
#[cfg(feature = "postgres")]
use dlock_core::{Lease, LockName};

use super::ForUpdate;
#[cfg(feature = "postgres")]
use super::Granted;
use crate::db::query;
use crate::error::{Meaning, meaning};
#[cfg(feature = "postgres")]
use crate::strategy::Attempt;

/// The for-update strategy of `provider`.
fn for_update(provider: &crate::SqlProvider) -> Arc<ForUpdate> {
    Arc::clone(&provider.strategy)
        .for_update()
        .expect("a for-update provider")
}

/// A for-update provider on the database at `url`, on tables named `table`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn provider_on(url: &str, table: &str) -> crate::SqlProvider {
    crate::SqlProvider::connect(&format!("{url}?strategy=for-update&table={table}"))
        .await
        .expect("provider")
}

/// A PostgreSQL for-update provider on tables of its own and a new name, or `None`
/// without a server; and the helpers of the fence cases below.
#[cfg(feature = "postgres")]
async fn pg_for_update(table: &str) -> Option<(crate::SqlProvider, LockName)> {
    let url = dlock_conformance::service_url("DLOCK_POSTGRES_URL")?;
    let provider = provider_on(&url, table).await;
    let name = LockName::new(format!("{table}/{}", uuid::Uuid::new_v4())).expect("name");
    Some((provider, name))
}

/// A for-update grant of `name` through `provider`, with its attempt.
#[cfg(feature = "postgres")]
async fn pg_grant(
    provider: &crate::SqlProvider,
    name: &LockName,
    lease: Duration,
) -> (Attempt, Granted) {
    let a = Attempt::new(&provider.inner, name, Lease::watchdog(lease));
    let granted = for_update(provider)
        .lock(&a, Deadline::after(Duration::from_secs(10)))
        .await
        .expect("try")
        .expect("the lock is free");
    (a, granted)
}

/// The fencing token of `granted`, taken as a grant takes it.
#[cfg(feature = "postgres")]
async fn pg_fence(
    provider: &crate::SqlProvider,
    a: &Attempt,
    granted: &mut Granted,
    lease: Duration,
) -> dlock_core::Result<u64> {
    for_update(provider).fence_held(a, granted, || lease).await
}

/// A holder of `name` through `provider` that is granted the lock, takes its fencing token
/// and frees the lock again: the token.
#[cfg(feature = "postgres")]
async fn pg_fenced_hold(provider: &crate::SqlProvider, name: &LockName, lease: Duration) -> u64 {
    let (a, mut granted) = pg_grant(provider, name, lease).await;
    let token = pg_fence(provider, &a, &mut granted, lease)
        .await
        .expect("fence");
    granted.conn.free(None).await.expect("free");
    token
}

/// The fault: ends server session `pid`, and waits (up to 10 s, on the server) until it
/// is gone, so its transaction is over. PostgreSQL 14+.
#[cfg(feature = "postgres")]
async fn pg_terminate(provider: &crate::SqlProvider, pid: i64) {
    let ended = query("SELECT pg_terminate_backend($1::INTEGER, 10000)::INTEGER")
        .bind(pid)
        .fetch_one(&provider.inner.pool)
        .await
        .expect("terminate")
        .int(0)
        .expect("answer");
    assert_eq!(ended, 1, "the holder's session did not end");
}

/// A for-update grant whose connection ends before its fencing token is taken gets no
/// token (another holder may have taken the row and a token meanwhile, and a token above the
/// real holder's must never be handed out). On PostgreSQL the statement
/// that takes the token checks that the holder's transaction still runs; without that
/// check this case gets a token for a grant that is gone. (PostgreSQL 14+: the wait for
/// the end of the terminated session.)
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_grant_whose_connection_ended_gets_no_fencing_token() {
    let Some((provider, name)) = pg_for_update("dlock_fence_held").await else {
        return;
    };
    let lease = Duration::from_secs(30);

    // A live grant gets its token.
    let first = pg_fenced_hold(&provider, &name, lease).await;

    // The granted connection is ended before the token is taken.
    let (b, mut granted) = pg_grant(&provider, &name, lease).await;
    pg_terminate(
        &provider,
        i64::try_from(granted.connection_id).expect("pid"),
    )
    .await;
    let refused = pg_fence(&provider, &b, &mut granted, lease).await;
    assert!(
        refused.is_err(),
        "a grant whose connection ended got the token {refused:?}"
    );

    // The next holder gets the next token: the refused grant took none.
    let next = pg_fenced_hold(&provider, &name, lease).await;
    assert_eq!(next, first + 1);
}

/// The check of the holder at the start of the token's statement can go stale while that
/// statement waits for the fence row (another token being taken): the holder may end
/// meanwhile, and another holder take the row and its own token first. The statement asks
/// again once it has the fence row. The fault: the fence row is held by an open transaction
/// while the token is asked for, and the holder's session is ended during that wait. Without
/// the second check the statement hands out a token above the real holder's.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_holder_that_ends_while_its_token_waits_gets_none() {
    let Some((provider, name)) = pg_for_update("dlock_fence_wait").await else {
        return;
    };
    let inner = &provider.inner;
    let lease = Duration::from_secs(30);
    // The name's fence row exists.
    pg_fenced_hold(&provider, &name, lease).await;

    // Another token being taken holds the fence row.
    let mut blocker = inner.pool.acquire().await.expect("connection");
    query("BEGIN").execute(&mut blocker).await.expect("begin");
    query("UPDATE dlock_fence_wait_fence SET token = token WHERE name = $1")
        .bind(name.as_str().as_bytes())
        .execute(&mut blocker)
        .await
        .expect("lock the fence row");

    // The holder asks for its token; the statement waits for the fence row.
    let (_b, granted) = pg_grant(&provider, &name, lease).await;
    let mut fencer = inner.pool.acquire().await.expect("connection");
    query("SET lock_timeout = '60s'")
        .execute(&mut fencer)
        .await
        .expect("lock wait");
    let fencer_pid = query("SELECT pg_backend_pid()::BIGINT")
        .fetch_one(&mut fencer)
        .await
        .expect("pid")
        .int(0)
        .expect("pid");
    let statement = for_update(&provider).sql.next_fence_held.clone();
    let key = name.as_str().as_bytes().to_vec();
    let (transaction, pid) = (
        granted.transaction,
        i64::try_from(granted.connection_id).expect("pid"),
    );
    let token = tokio::spawn(async move {
        let row = query(&statement)
            .bind(key.as_slice())
            .bind(transaction)
            .bind(pid)
            .fetch_optional(&mut fencer)
            .await;
        row.map(|r| r.map(|r| r.int(0)))
    });
    dlock_conformance::eventually(
        Duration::from_secs(10),
        "the token's statement waits for the fence row",
        || async {
            let waits =
                query("SELECT COUNT(*) FROM pg_locks WHERE pid = $1::INTEGER AND NOT granted")
                    .bind(fencer_pid)
                    .fetch_one(&inner.pool)
                    .await
                    .map_err(|e| e.to_string())?
                    .int(0)
                    .map_err(|e| e.to_string())?;
            if waits > 0 {
                Ok(())
            } else {
                Err("not waiting yet".to_owned())
            }
        },
    )
    .await;

    // The holder's session ends while its token waits.
    pg_terminate(&provider, pid).await;
    query("COMMIT").execute(&mut blocker).await.expect("commit");
    let got = token.await.expect("task").expect("statement");
    assert!(
        got.is_none(),
        "a holder that ended while its token waited got the token {got:?}"
    );
    drop(granted);
}

/// The kill of a dropped waiter may reach the server before the waiting statement does
/// (the client wrote the statement, then its future was dropped): it then finds the
/// session idle. A cancel of the statement (`KILL QUERY`, `pg_cancel_backend`) was lost
/// there, and the statement that came next waited for the row its whole lock timeout, on
/// a session nobody reads. Killing the connection leaves nothing to run it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn a_kill_before_its_statement_still_stops_it(url: &str, set_lock_wait: &str) {
    use dlock_core::{LockOptions, LockProvider};

    let provider = provider_on(url, "dlock_kill_first").await;
    let inner = &provider.inner;
    let name = format!("kill-first/{}", uuid::Uuid::new_v4());
    let holder = provider
        .lock(&name, LockOptions::default())
        .expect("lock")
        .try_acquire(Duration::from_secs(5))
        .await
        .expect("acquire")
        .expect("a new name is free");
    let lock_pool = inner.lock_pool.as_ref().unwrap_or(&inner.pool);
    let mut waiter = lock_pool.acquire().await.expect("connection");
    query(set_lock_wait)
        .execute(&mut waiter)
        .await
        .expect("lock wait");
    let id = query(&for_update(&provider).pinning.session_sql().connection_id)
        .fetch_one(&mut waiter)
        .await
        .expect("connection id")
        .int(0)
        .expect("id");
    let id = u64::try_from(id).expect("id");
    query(
        &for_update(&provider)
            .pinning
            .session_sql()
            .kill_connection(id),
    )
    .execute(&inner.pool)
    .await
    .expect("kill");
    let waited = query(&for_update(&provider).sql.lock_row)
        .bind(name.as_bytes())
        .fetch_optional(&mut waiter)
        .await;
    waiter.close_on_drop();
    match waited {
        Err(e) => assert!(
            meaning(&e) != Meaning::Busy,
            "the statement after the kill waited for the held row: {e}"
        ),
        Ok(_) => panic!("the statement after the kill was granted a held row"),
    }
    holder.release().await.expect("release");
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_kill_before_its_statement_still_stops_it_on_postgres() {
    let Some(url) = dlock_conformance::service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    a_kill_before_its_statement_still_stops_it(&url, "SET lock_timeout = '3s'").await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_kill_before_its_statement_still_stops_it_on_mysql() {
    let Some(url) = dlock_conformance::service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    a_kill_before_its_statement_still_stops_it(&url, "SET SESSION innodb_lock_wait_timeout = 3")
        .await;
}

/// An acquirer that stops between its first try on a new name and the rollback after it
/// (a process paused there, or cut off) must not keep other new names from being
/// created. Under MySQL's default REPEATABLE READ, that try left a gap lock which
/// blocked the first insert of every name sorting next to it, until the server dropped
/// the connection (its default `wait_timeout` is 8 hours): this case's acquire of another
/// new name then timed out.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_stalled_first_try_blocks_no_other_new_name() {
    use dlock_core::{LockOptions, LockProvider};

    let Some(url) = dlock_conformance::service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let provider = provider_on(&url, "dlock_stalled").await;
    let inner = &provider.inner;
    let prefix = format!("stalled/{}", uuid::Uuid::new_v4());
    // The stalled acquirer: its first try on a name without a row, on a connection of the
    // provider's own lock pool, and nothing after it.
    let lock_pool = inner.lock_pool.as_ref().expect("a for-update lock pool");
    let mut stalled = lock_pool.acquire().await.expect("connection");
    let stalled_name = format!("{prefix}/a");
    let found = query(&for_update(&provider).sql.lock_row_nowait)
        .bind(stalled_name.as_bytes())
        .fetch_optional(&mut stalled)
        .await
        .expect("first try");
    assert!(found.is_none(), "the name has no row yet");
    // Another new name, sorting right after it.
    let other = provider
        .lock(&format!("{prefix}/b"), LockOptions::default())
        .expect("lock");
    let guard = other
        .try_acquire(Duration::from_secs(5))
        .await
        .expect("acquire");
    assert!(
        guard.is_some(),
        "a free new name was not acquired while another acquirer stalled next to it"
    );
    query("ROLLBACK")
        .execute(&mut stalled)
        .await
        .expect("rollback");
}
