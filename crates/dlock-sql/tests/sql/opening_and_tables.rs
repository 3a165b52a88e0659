//! Opening a database and setting up dlock's tables: paths, several applications at once, one
//! strategy per set of tables.

use dlock_conformance::service_url;
use dlock_core::{LockOptions, LockProvider};
use dlock_sql::{SqlProvider, Strategy};

use crate::support::*;

/// A SQLite file under a directory with a space and a non-ASCII character (a home
/// directory like `/home/Jane Doe` or `/home/josé`): dlock creates that directory, not its
/// percent-encoded spelling, and the store works.
#[tokio::test]
async fn sqlite_path_with_a_space_and_an_accent() {
    let root = std::env::temp_dir().join(format!("dlock {} josé", uuid::Uuid::new_v4().simple()));
    let file = root.join("state dir").join("locks.db");
    let p = SqlProvider::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    let g = p
        .lock("spaced", LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
    assert!(file.exists(), "no file at {}", file.display());
    let encoded = root.to_string_lossy().replace(' ', "%20");
    assert!(!std::path::Path::new(&encoded).exists(), "made {encoded}");
    let _ = std::fs::remove_dir_all(&root);
}

/// Several applications opening one new SQLite file at once, on their own pools or by URL, all
/// get a provider: creating the tables and switching to WAL race in rollback-journal mode, where
/// SQLite answers a lock upgrade that would deadlock with `SQLITE_BUSY` at once, without its
/// busy timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_opening_one_new_sqlite_file_at_once_all_connect() {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
    for round in 0..200 {
        let file =
            std::env::temp_dir().join(format!("dlock-race-{}.db", uuid::Uuid::new_v4().simple()));
        let opens = (0..12).map(|i| {
            let file = file.clone();
            tokio::spawn(async move {
                if i % 2 == 0 {
                    // By URL, with dlock's own pool.
                    return SqlProvider::connect(&format!("sqlite://{}", file.display()))
                        .await
                        .map_err(|e| sqlx::Error::Protocol(e.to_string()));
                }
                let options = SqliteConnectOptions::new()
                    .filename(&file)
                    .create_if_missing(true);
                let pool = SqlitePool::connect_with(options).await?;
                crate::support::on_pool(pool, Strategy::UniqueInsert, "dlock", 1)
                    .await
                    .map_err(|e| sqlx::Error::Protocol(e.to_string()))
            })
        });
        let opens: Vec<_> = opens.collect();
        for open in opens {
            if let Err(e) = open.await.unwrap() {
                panic!("round {round}: an application could not open the new file: {e}");
            }
        }
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
    }
}

/// Several applications starting at once on a server where dlock's tables do not exist yet
/// all get a provider. PostgreSQL's `CREATE TABLE IF NOT EXISTS` is not safe against itself:
/// two sessions that both find the table missing both create it, and the later one fails with
/// "relation ... already exists" or a unique violation in the catalog (two test shards
/// creating the for-update tables at once, say). MySQL's is, and is checked the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_creating_one_new_set_of_tables_at_once_all_connect() {
    let mut servers = Vec::new();
    servers.extend(service_url("DLOCK_MYSQL_URL").map(|u| {
        (
            u,
            &["unique-insert", "optimistic", "for-update", "get-lock"][..],
        )
    }));
    servers.extend(service_url("DLOCK_POSTGRES_URL").map(|u| {
        (
            u,
            &["unique-insert", "optimistic", "for-update", "advisory"][..],
        )
    }));
    for (base, strategies) in servers {
        let db = admin(&base).await;
        for strategy in strategies {
            for round in 0..10 {
                let table = format!(
                    "dlock_race_{}",
                    &uuid::Uuid::new_v4().simple().to_string()[..12]
                );
                let url = with_query(&base, &format!("strategy={strategy}&table={table}"));
                let opens: Vec<_> = (0..8)
                    .map(|_| {
                        let url = url.clone();
                        tokio::spawn(async move { SqlProvider::connect(&url).await })
                    })
                    .collect();
                let mut failed = None;
                for open in opens {
                    if let Err(e) = open.await.unwrap() {
                        failed.get_or_insert(e);
                    }
                }
                for suffix in [
                    "meta", "holds", "versions", "seeds", "rows", "names", "fence",
                ] {
                    sqlx::query(&format!("DROP TABLE IF EXISTS {table}_{suffix}"))
                        .execute(&db)
                        .await
                        .unwrap();
                }
                if let Some(e) = failed {
                    panic!(
                        "{strategy} on {}, round {round}: an application could not create or open the new tables: {e}",
                        base.split('@').next_back().unwrap_or("")
                    );
                }
            }
        }
    }
}

/// Two strategies on one set of tables keep their holds in different tables and would not
/// exclude each other; the tables record the strategy that first used them, and a provider
/// asking for another is refused with a Config error that says what to do. The same
/// strategy, or another prefix, is fine.
#[tokio::test]
async fn two_strategies_on_one_set_of_tables_are_refused() {
    let (sqlite, path) = sqlite_url("unique-insert");
    let mut bases = vec![sqlite.replace("?strategy=unique-insert", "")];
    bases.extend(service_url("DLOCK_MYSQL_URL"));
    bases.extend(service_url("DLOCK_POSTGRES_URL"));
    for base in bases {
        let url = |s: &str, t: &str| with_query(&base, &format!("strategy={s}&table={t}"));
        let first = SqlProvider::connect(&url("unique-insert", "dlock_mixed"))
            .await
            .unwrap();
        for other in ["optimistic", "for-update"] {
            if other == "for-update" && base.starts_with("sqlite") {
                continue;
            }
            match SqlProvider::connect(&url(other, "dlock_mixed")).await {
                Err(dlock_core::Error::Config { message, .. }) => {
                    assert!(
                        message.contains("unique-insert") && message.contains(other),
                        "{base}: {message}"
                    );
                }
                Err(e) => panic!("{base}: {other} on unique-insert's tables: {e}"),
                Ok(_) => panic!("{base}: {other} on unique-insert's tables was accepted"),
            }
        }
        SqlProvider::connect(&url("unique-insert", "dlock_mixed"))
            .await
            .expect("the same strategy again");
        SqlProvider::connect(&url("optimistic", "dlock_mixed_other"))
            .await
            .expect("another strategy on its own tables");
        drop(first);
    }
    remove_sqlite(&path);
}

/// SQLite settings under which processes sharing the file would not exclude each other (no
/// file locks, an immutable file) or a waiter would fail at once instead of waiting (a shared
/// cache answers SQLITE_LOCKED without a busy timeout) are refused with a clear error.
#[tokio::test]
async fn sqlite_settings_without_file_locks_are_refused() {
    for (setting, expected) in [
        ("vfs=unix-none", "VFS with file locks"),
        ("vfs=memdb", "VFS with file locks"),
        ("vfs=win32-longpath-none", "VFS with file locks"),
        ("cache=shared", "shared cache is refused"),
        ("immutable=true", "never locked"),
    ] {
        let (url, path) = sqlite_url("unique-insert");
        let r = SqlProvider::connect(&with_query(&url, setting)).await;
        remove_sqlite(&path);
        match r {
            Err(e @ dlock_core::Error::Config { .. }) => {
                assert!(e.to_string().contains(expected), "{setting}: {e}");
            }
            other => panic!("{setting}: expected a configuration error, got {other:?}"),
        }
    }
}

/// A role that may not create tables (PostgreSQL checks `CREATE` before `IF NOT EXISTS`)
/// connects with `create_tables=false` to tables an administrator made: here a schema of the
/// test's own whose `CREATE` privilege the test takes back after the first provider made
/// the tables. Without the option the connect fails; with it, the provider works. A prefix
/// whose tables do not exist is refused at connect, naming the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_create_connects_with_create_tables_false() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let schema = format!(
        "dlock_lp_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let db = admin(&pg).await;
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&db)
        .await
        .unwrap();
    let url = with_query(
        &pg,
        &format!("strategy=unique-insert&options=-c%20search_path%3D{schema}"),
    );
    let owner = SqlProvider::connect(&url).await.unwrap();
    drop(owner);
    sqlx::query(&format!(
        "REVOKE CREATE ON SCHEMA {schema} FROM CURRENT_USER"
    ))
    .execute(&db)
    .await
    .unwrap();
    let creating = SqlProvider::connect(&url).await;
    assert!(creating.is_err(), "created tables without CREATE?");
    let p = SqlProvider::connect(&with_query(&url, "create_tables=false"))
        .await
        .expect("the tables exist: nothing to create");
    let g = p
        .lock("least-privilege", LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
    let missing = SqlProvider::connect(&with_query(&url, "create_tables=false&table=elsewhere"))
        .await
        .expect_err("no tables under that prefix");
    assert!(
        matches!(missing, dlock_core::Error::Config { .. })
            && missing.to_string().contains("elsewhere_meta"),
        "{missing}"
    );
    drop(p);
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&db)
        .await
        .unwrap();
}

/// Tables under dlock's names that are not dlock's, or of another layout, are refused at
/// connect with a clear error rather than used: a user-made `<prefix>_holds` without dlock's
/// columns (`CREATE TABLE IF NOT EXISTS` keeps it as it is), and tables whose recorded schema
/// version is not this dlock's.
#[tokio::test]
async fn tables_of_another_shape_or_version_are_refused() {
    let (url, path) = sqlite_url("unique-insert");
    std::fs::File::create(&path).unwrap(); // an empty file is an empty database
    let db = admin(&url).await;
    sqlx::query("CREATE TABLE dlock_holds (name TEXT)")
        .execute(&db)
        .await
        .unwrap();
    let e = SqlProvider::connect(&url)
        .await
        .expect_err("a holds table of another shape");
    assert!(
        matches!(e, dlock_core::Error::Config { .. }) && e.to_string().contains("dlock_holds"),
        "{e}"
    );
    sqlx::query("DROP TABLE dlock_holds")
        .execute(&db)
        .await
        .unwrap();
    drop(SqlProvider::connect(&url).await.unwrap());
    sqlx::query("UPDATE dlock_meta SET value = '99' WHERE name = 'schema'")
        .execute(&db)
        .await
        .unwrap();
    let e = SqlProvider::connect(&url)
        .await
        .expect_err("another schema version");
    assert!(e.to_string().contains("schema version 99"), "{e}");
    db.close().await;
    remove_sqlite(&path);
}

/// `from_pool` takes the strategy, the prefix and `create_tables` from the config: on a new
/// SQLite file, `create_tables=false` is refused naming the missing table, the default
/// creates them (on the store a URL of the file names), and a config of another database
/// family than the pool's is refused rather than read as the pool's.
#[tokio::test]
async fn from_pool_reads_its_config() {
    use dlock_sql::SqlConfig;
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
    let file =
        std::env::temp_dir().join(format!("dlock-pool-{}.db", uuid::Uuid::new_v4().simple()));
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    let url = format!("sqlite://{}", file.display());
    let config = SqlConfig::from_url(&url).unwrap();

    let missing = SqlProvider::from_pool(pool.clone(), &config.clone().with_create_tables(false))
        .await
        .expect_err("no tables yet, and none to be made");
    assert!(
        matches!(missing, dlock_core::Error::Config { .. })
            && missing.to_string().contains("dlock_meta"),
        "{missing}"
    );

    let p = SqlProvider::from_pool(
        pool.clone(),
        &config.clone().with_strategy(Strategy::Optimistic),
    )
    .await
    .unwrap();
    // The same store as a provider on the file by URL.
    let by_url = SqlProvider::connect(&format!("{url}?strategy=optimistic"))
        .await
        .unwrap();
    assert_eq!(p.store_id(), by_url.store_id());

    // A strategy SQLite does not offer is refused as unsupported, before anything opens.
    let advisory_here = config.clone().with_strategy(Strategy::Advisory);
    let e = SqlProvider::from_pool(pool.clone(), &advisory_here)
        .await
        .expect_err("advisory on SQLite");
    assert!(matches!(e, dlock_core::Error::Unsupported { .. }), "{e}");
    let get_lock_here = config.clone().with_strategy(Strategy::GetLock);
    let e = SqlProvider::from_pool(pool.clone(), &get_lock_here)
        .await
        .expect_err("get-lock on SQLite");
    assert!(
        matches!(e, dlock_core::Error::Unsupported { .. }) && e.to_string().contains("get-lock"),
        "{e}"
    );

    let other = SqlConfig::from_url("postgres://localhost").unwrap();
    let e = SqlProvider::from_pool(pool, &other)
        .await
        .expect_err("a PostgreSQL config for a SQLite pool");
    assert!(
        matches!(e, dlock_core::Error::Config { .. }) && e.to_string().contains("postgres"),
        "{e}"
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}
