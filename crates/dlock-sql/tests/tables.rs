//! dlock's tables against real databases: the shape they must have, their upgrade, their
//! pruning, and that a hold of any length leaves them (and the rest of the database) to
//! `VACUUM`. A PostgreSQL for-update hold keeps no transaction id open, so `VACUUM` goes on
//! removing dead rows while it lasts; tables whose for-update locks were row locks are refused
//! until they are upgraded, with tokens that go on from where they were; tables made by hand
//! without a unique `name` are refused; the rows of names nobody holds are pruned. A test
//! binary of its own: the `sql` binary fills one shard of `scripts/test`.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_sql::{SqlConfig, SqlProvider};
use sqlx::Row;

use crate::support::*;

/// A for-update hold on PostgreSQL, held with the defaults (a 30 s watchdog lease), does not
/// hold back `VACUUM`: rows that die while it is held are removed. A row lock would need a
/// transaction id, and a transaction id held open keeps every row version that dies after it
/// "not yet removable", in every table of the database, for as long as the hold lasts.
///
/// Other tests' transactions on the same database hold the horizon back for a moment too, so
/// `VACUUM` is run again until the dead rows are gone (within 30 s); a hold that pins the
/// horizon keeps them for its whole life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_for_update_hold_on_postgres_keeps_no_dead_rows() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let url = with_query(&pg, "strategy=for-update&table=dlock_long_holds");
    let provider = SqlProvider::connect(&url).await.unwrap();
    let db = sqlx::PgPool::connect(&pg).await.unwrap();
    let churn = format!("dlock_churn_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(&format!(
        "CREATE TABLE {churn} (id INT PRIMARY KEY, v INT) WITH (autovacuum_enabled = false); \
         INSERT INTO {churn} SELECT g, 0 FROM generate_series(1, 1000) g"
    ))
    .execute(&db)
    .await
    .unwrap();
    let name = Names::new().name("long");
    let guard = hold(&provider, &name).await;
    let pid = provider.holder_connection_id(&name).expect("a pinned hold");
    let holder = sqlx::query(
        "SELECT backend_xid IS NULL, backend_xmin IS NULL FROM pg_stat_activity WHERE pid = $1",
    )
    .bind(i64::try_from(pid).unwrap())
    .fetch_one(&db)
    .await
    .unwrap();
    let (no_xid, no_xmin): (bool, bool) = (holder.get(0), holder.get(1));
    assert!(
        no_xid && no_xmin,
        "the holder's session keeps a transaction id (none: {no_xid}) or a snapshot (none: \
         {no_xmin}) open"
    );
    // 1,000 dead row versions, made while the lock is held.
    sqlx::raw_sql(&format!("UPDATE {churn} SET v = v + 1"))
        .execute(&db)
        .await
        .unwrap();
    let vacuum = format!("VACUUM {churn}");
    let dead = format!("SELECT pg_stat_get_dead_tuples('{churn}'::regclass)");
    eventually(
        Duration::from_secs(30),
        "VACUUM removes the rows that died while the lock is held",
        || async {
            sqlx::raw_sql(&vacuum).execute(&db).await.unwrap();
            let left: i64 = sqlx::query_scalar(&dead).fetch_one(&db).await.unwrap();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} dead rows left"))
            }
        },
    )
    .await;
    assert!(guard.is_held(), "the lock was held all along");
    guard.release().await.unwrap();
    sqlx::raw_sql(&format!("DROP TABLE {churn}"))
        .execute(&db)
        .await
        .unwrap();
}

/// Tables that served for-update on PostgreSQL as row locks (schema version 1) are refused:
/// their old holders' row locks and this dlock's advisory locks would not exclude each other.
/// The error names the one statement that upgrades them once the old dlocks are stopped;
/// after it, tokens go on from the last one the row locks handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_tables_are_refused_until_upgraded_and_tokens_go_on() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let table = format!(
        "dlock_v1_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let url = with_query(&pg, &format!("strategy=for-update&table={table}"));
    SqlProvider::connect(&url).await.unwrap();
    let db = sqlx::PgPool::connect(&pg).await.unwrap();
    let name = Names::new().name("upgraded");
    // What a dlock of version 1 leaves: its version, and a token handed out by row locks.
    sqlx::query(&format!(
        "UPDATE {table}_meta SET value = '1' WHERE name = 'schema'"
    ))
    .execute(&db)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table}_fence (name, token) VALUES ($1, 41)"
    ))
    .bind(name.as_bytes())
    .execute(&db)
    .await
    .unwrap();
    let e = SqlProvider::connect(&url)
        .await
        .expect_err("tables of schema version 1");
    let upgrade = format!("UPDATE {table}_meta SET value = '2' WHERE name = 'schema'");
    assert!(
        !e.is_retryable() && e.to_string().contains(&upgrade),
        "the error must name the upgrade: {e}"
    );
    sqlx::query(&upgrade).execute(&db).await.unwrap();
    let provider = must(
        Duration::from_secs(10),
        "connect",
        SqlProvider::connect(&url),
    )
    .await
    .unwrap();
    let guard = hold(&provider, &name).await;
    assert_eq!(
        guard.fencing_token().get(),
        42,
        "the token after the row locks' 41"
    );
    guard.release().await.unwrap();
    let mut drop = String::new();
    for t in [
        "meta", "holds", "versions", "seeds", "fence", "rows", "names",
    ] {
        drop.push_str(&format!("DROP TABLE {table}_{t}; "));
    }
    sqlx::raw_sql(&drop).execute(&db).await.unwrap();
}

/// Tables made by hand (`create_tables=false`) whose `<prefix>_holds` has no unique index of
/// `name` are refused at connect, naming the table and the index to add: two INSERTs of one
/// name would both succeed, and both callers hold the lock. With the index added, the
/// provider connects and excludes. On every dialect this machine has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_made_tables_without_a_unique_name_are_refused() {
    let (sqlite, path) = sqlite_url("unique-insert");
    std::fs::File::create(&path).unwrap();
    let mut bases = vec![sqlite];
    bases.extend(service_url("DLOCK_MYSQL_URL"));
    bases.extend(service_url("DLOCK_POSTGRES_URL"));
    for base in bases {
        let table = format!(
            "dlock_hm_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let url = with_query(
            &base,
            &format!("strategy=unique-insert&table={table}&create_tables=false"),
        );
        let db = admin(&base).await;
        for ddl in SqlConfig::from_url(&url).unwrap().table_ddl() {
            // The holds table without its key on the name (SQLite: without UNIQUE).
            let ddl = if ddl.contains(&format!("{table}_holds (")) {
                ddl.replace("NOT NULL PRIMARY KEY, id", "NOT NULL, id")
                    .replace("name BLOB NOT NULL UNIQUE", "name BLOB NOT NULL")
            } else {
                ddl
            };
            sqlx::query(&ddl).execute(&db).await.unwrap();
        }
        let e = SqlProvider::connect(&url)
            .await
            .expect_err("a holds table whose names need not be unique");
        assert!(
            matches!(e, dlock_core::Error::Config { .. })
                && e.to_string()
                    .contains(&format!("{table}_holds has no unique index")),
            "{url}: {e}"
        );
        // Unique indexes that do not keep two rows of one name apart at every INSERT: a
        // deferred constraint (PostgreSQL), an index of the name's first bytes (MySQL).
        let almost = if base.starts_with("postgres") {
            Some(format!(
                "ALTER TABLE {table}_holds ADD CONSTRAINT {table}_later UNIQUE (name) \
                 DEFERRABLE INITIALLY DEFERRED"
            ))
        } else if base.starts_with("mysql") {
            Some(format!(
                "CREATE UNIQUE INDEX {table}_prefix ON {table}_holds (name(8))"
            ))
        } else {
            None
        };
        if let Some(almost) = almost {
            sqlx::query(&almost).execute(&db).await.unwrap();
            let e = SqlProvider::connect(&url)
                .await
                .expect_err("a unique index that does not hold at each INSERT");
            assert!(e.to_string().contains("has no unique index"), "{url}: {e}");
            // PostgreSQL's ON CONFLICT refuses to work beside a deferrable one.
            if base.starts_with("postgres") {
                sqlx::query(&format!(
                    "ALTER TABLE {table}_holds DROP CONSTRAINT {table}_later"
                ))
                .execute(&db)
                .await
                .unwrap();
            }
        }
        sqlx::query(&format!(
            "CREATE UNIQUE INDEX {table}_by_name ON {table}_holds (name)"
        ))
        .execute(&db)
        .await
        .unwrap();
        let p = SqlProvider::connect(&url).await.expect("the index added");
        let name = Names::new().name("hand-made");
        let g = hold(&p, &name).await;
        let second = p
            .lock(&name, LockOptions::default())
            .unwrap()
            .try_acquire(std::time::Duration::ZERO)
            .await
            .unwrap();
        assert!(second.is_none(), "{url}: two holders");
        g.release().await.unwrap();
        drop(p);
        drop_tables(&db, &table).await;
        db.close().await;
    }
    remove_sqlite(&path);
}

/// unique-insert and optimistic delete the rows of names nobody has held for
/// `prune_after_ms`, so a table keeps a row per name in use rather than one per name ever
/// used: the rows of 20 holders that died (unique-insert) or of 20 names used once and released
/// (optimistic) go, a name held throughout with the defaults (a 30 s watchdog lease) keeps its
/// row and its lock, and a pruned name used again gets a token above its last one. On every
/// dialect this machine has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_names_nobody_holds_are_pruned_and_tokens_go_on() {
    let mut bases = Vec::new();
    for strategy in ["unique-insert", "optimistic"] {
        let (sqlite, path) = sqlite_url(strategy);
        bases.push((sqlite, Some(path)));
        for env in ["DLOCK_MYSQL_URL", "DLOCK_POSTGRES_URL"] {
            if let Some(url) = service_url(env) {
                bases.push((with_query(&url, &format!("strategy={strategy}")), None));
            }
        }
    }
    for (base, path) in bases {
        let unique_insert = base.contains("strategy=unique-insert");
        let (table, rows) = {
            let t = format!(
                "dlock_pr_{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            );
            let rows = format!("{t}_{}", if unique_insert { "holds" } else { "versions" });
            (t, rows)
        };
        let url = with_query(&base, &format!("table={table}&prune_after_ms=1000"));
        let provider = SqlProvider::connect(&url).await.unwrap();
        let db = admin(&base).await;
        let names = Names::new();
        let kept = names.name("held");
        let guard = hold(&provider, &kept).await;
        let mut last = Vec::new();
        for i in 0..20 {
            let name = names.name(&format!("once-{i}"));
            if unique_insert {
                // A holder that died: its row, its lease long over.
                sqlx::query(&q(
                    &base,
                    &format!(
                        "INSERT INTO {rows} (name, owner, holds, takeovers, expires_at) \
                         VALUES (?, 'dead:1', 1, 0, 1000)"
                    ),
                ))
                .bind(name.as_bytes().to_vec())
                .execute(&db)
                .await
                .unwrap();
                let id: i64 =
                    sqlx::query_scalar(&q(&base, &format!("SELECT id FROM {rows} WHERE name = ?")))
                        .bind(name.as_bytes().to_vec())
                        .fetch_one(&db)
                        .await
                        .unwrap();
                last.push((name, u64::try_from(id).unwrap() << 20));
            } else {
                let g = hold(&provider, &name).await;
                last.push((name, g.fencing_token().get()));
                g.release().await.unwrap();
            }
        }
        let count = format!("SELECT COUNT(*) FROM {rows}");
        eventually(
            Duration::from_secs(30),
            "the rows of the names nobody holds are pruned",
            || async {
                let left: i64 = sqlx::query_scalar(&count).fetch_one(&db).await.unwrap();
                if left == 1 {
                    Ok(())
                } else {
                    Err(format!("{left} rows"))
                }
            },
        )
        .await;
        let held: i64 = sqlx::query_scalar(&q(
            &base,
            &format!("SELECT COUNT(*) FROM {rows} WHERE name = ?"),
        ))
        .bind(kept.as_bytes().to_vec())
        .fetch_one(&db)
        .await
        .unwrap();
        assert_eq!(held, 1, "{url}: the held name's row was pruned");
        assert!(guard.is_held(), "{url}: the held name's lock was lost");
        for (name, token) in &last[..3] {
            let g = hold(&provider, name).await;
            assert!(
                g.fencing_token().get() > *token,
                "{url}: {name}'s token after its row went, {}, is not above its last, {token}",
                g.fencing_token().get()
            );
            g.release().await.unwrap();
        }
        guard.release().await.unwrap();
        drop(provider);
        drop_tables(&db, &table).await;
        db.close().await;
        if let Some(path) = path {
            remove_sqlite(&path);
        }
    }
}

/// Drops the tables a test made with prefix `table` (those of every dialect; missing ones are
/// skipped).
async fn drop_tables(db: &sqlx::AnyPool, table: &str) {
    for t in [
        "meta", "holds", "versions", "seeds", "fence", "rows", "names",
    ] {
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}_{t}"))
            .execute(db)
            .await;
    }
}
