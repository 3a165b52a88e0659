//! The conformance suite for every SQL strategy: MySQL/MariaDB at `DLOCK_MYSQL_URL` (three
//! strategies) and SQLite on a temporary file (two strategies).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_conformance::{Factory, Partition, ProxyPartition, async_trait, service_url};
use dlock_core::{DynLockProvider, Result};
use dlock_sql::SqlProvider;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};

struct SqlFactory {
    url: String,
    strategy: &'static str,
    providers: Mutex<Vec<SqlProvider>>,
    _file: Option<TempFile>,
}

/// A SQLite file removed (with its WAL files) when the test ends.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

impl SqlFactory {
    fn mysql(strategy: &'static str) -> Option<Self> {
        service_url("DLOCK_MYSQL_URL").map(|url| Self {
            // A for-update hold pins a connection: the cases hold up to 34 locks at once.
            url: format!("{url}?strategy={strategy}&pool=48"),
            strategy,
            providers: Mutex::new(Vec::new()),
            _file: None,
        })
    }

    fn sqlite(strategy: &'static str) -> Option<Self> {
        let path =
            std::env::temp_dir().join(format!("dlock-conf-{}.db", uuid::Uuid::new_v4().simple()));
        Some(Self {
            url: format!("sqlite://{}?strategy={strategy}", path.display()),
            strategy,
            providers: Mutex::new(Vec::new()),
            _file: Some(TempFile(path)),
        })
    }

    fn is_sqlite(&self) -> bool {
        self.url.starts_with("sqlite:")
    }

    async fn admin(&self) -> AnyPool {
        sqlx::any::install_default_drivers();
        let url = self.url.split('?').next().unwrap();
        AnyPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .unwrap()
    }
}

impl SqlFactory {
    /// The server's transactions that hold or wait for `name`'s row: those in a lock wait on
    /// the row (and the ones they wait for) from InnoDB's lock tables, and the holders this
    /// case's providers know of whose transaction is still open. A cancelled waiter whose
    /// statement still waits on the server counts.
    async fn for_update_residue(&self, name: &str) -> usize {
        let admin = self.admin().await;
        let hex: String = name.bytes().map(|b| format!("{b:02X}")).collect();
        let mut threads = std::collections::BTreeSet::new();
        let rows = sqlx::query(
            "SELECT DISTINCT t.trx_mysql_thread_id \
             FROM information_schema.INNODB_LOCKS l \
             JOIN information_schema.INNODB_TRX t ON t.trx_id = l.lock_trx_id \
             WHERE l.lock_table LIKE '%`dlock_rows`' AND l.lock_data = ?",
        )
        .bind(format!("0x{hex}"))
        .fetch_all(&admin)
        .await
        .unwrap();
        for row in rows {
            threads.insert(row.try_get::<i64, _>(0).unwrap());
        }
        let holders: Vec<u64> = self
            .providers
            .lock()
            .unwrap()
            .iter()
            .filter_map(|p| p.holder_connection_id(name))
            .collect();
        for id in holders {
            let open: i64 = sqlx::query(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?",
            )
            .bind(i64::try_from(id).unwrap())
            .fetch_one(&admin)
            .await
            .unwrap()
            .try_get(0)
            .unwrap();
            if open > 0 {
                threads.insert(i64::try_from(id).unwrap());
            }
        }
        admin.close().await;
        threads.len()
    }
}

#[async_trait]
impl Factory for SqlFactory {
    fn label(&self) -> String {
        let db = if self.is_sqlite() { "sqlite" } else { "mysql" };
        format!("{db}/{}", self.strategy)
    }

    async fn connect(&self) -> Result<DynLockProvider> {
        let p = SqlProvider::connect(&self.url).await?;
        self.providers.lock().unwrap().push(p.clone());
        Ok(Arc::new(p))
    }

    /// MySQL through a proxy; a SQLite file cannot be cut off.
    async fn connect_partitionable(&self) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        if self.is_sqlite() {
            return None;
        }
        Some(
            async {
                let (cut, url) = ProxyPartition::start(&self.url, 3306).await?;
                let p = SqlProvider::connect(&url).await?;
                self.providers.lock().unwrap().push(p.clone());
                let p: DynLockProvider = Arc::new(p);
                Ok((p, Box::new(cut) as Box<dyn Partition>))
            }
            .await,
        )
    }

    fn short_lease(&self) -> Duration {
        Duration::from_millis(800)
    }

    /// For-update: the server-side lease is the short lease in whole seconds.
    fn holder_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn force_expire(&self, name: &str) -> Option<Result<()>> {
        let admin = self.admin().await;
        match self.strategy {
            "unique-insert" => {
                sqlx::query("DELETE FROM dlock_holds WHERE name = ?")
                    .bind(name.as_bytes())
                    .execute(&admin)
                    .await
                    .unwrap();
            }
            "optimistic" => {
                sqlx::query("UPDATE dlock_versions SET owner = '', expires_at = 0 WHERE name = ?")
                    .bind(name.as_bytes())
                    .execute(&admin)
                    .await
                    .unwrap();
            }
            _ => {
                // for-update: kill the connection that holds the row lock.
                let id = self
                    .providers
                    .lock()
                    .unwrap()
                    .iter()
                    .find_map(|p| p.holder_connection_id(name))
                    .expect("a holder connection");
                sqlx::query(&format!("KILL {id}"))
                    .execute(&admin)
                    .await
                    .unwrap();
            }
        }
        admin.close().await;
        Some(Ok(()))
    }

    async fn residue(&self, name: &str) -> Option<Result<usize>> {
        let query = match self.strategy {
            "unique-insert" => "SELECT COUNT(*) FROM dlock_holds WHERE name = ?",
            "optimistic" => "SELECT COUNT(*) FROM dlock_versions WHERE name = ? AND owner <> ''",
            _ => return Some(Ok(self.for_update_residue(name).await)),
        };
        let admin = self.admin().await;
        let n: i64 = sqlx::query(query)
            .bind(name.as_bytes())
            .fetch_one(&admin)
            .await
            .unwrap()
            .try_get(0)
            .unwrap();
        admin.close().await;
        Some(Ok(usize::try_from(n).unwrap()))
    }
}

mod mysql_unique_insert {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::mysql("unique-insert"));
}

mod mysql_optimistic {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::mysql("optimistic"));
}

mod mysql_for_update {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::mysql("for-update"));
}

mod sqlite_unique_insert {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::sqlite("unique-insert"));
}

mod sqlite_optimistic {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::sqlite("optimistic"));
}
