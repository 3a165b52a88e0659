//! The for-update cases (MySQL) that drive the strategy's own steps: a kill of a waiting
//! connection, a stalled first try.

use std::sync::Arc;
use std::time::Duration;

use super::ForUpdate;
use crate::db::query;
use crate::error::{Meaning, meaning};

/// The for-update strategy of `provider`.
fn for_update(provider: &crate::SqlProvider) -> Arc<ForUpdate> {
    Arc::clone(&provider.strategy)
        .for_update()
        .expect("a for-update provider")
}

/// A for-update provider on the database at `url`, on tables named `table`.
async fn provider_on(url: &str, table: &str) -> crate::SqlProvider {
    crate::SqlProvider::connect(&format!("{url}?strategy=for-update&table={table}"))
        .await
        .expect("provider")
}

/// The kill of a dropped waiter may reach the server before the waiting statement does
/// (the client wrote the statement, then its future was dropped): it then finds the
/// session idle. A cancel of the statement (`KILL QUERY`) was lost
/// there, and the statement that came next waited for the row its whole lock timeout, on
/// a session nobody reads. Killing the connection leaves nothing to run it.
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
