//! The conformance suite for every SQL strategy: MySQL/MariaDB at `DLOCK_MYSQL_URL` (four
//! strategies), PostgreSQL at `DLOCK_POSTGRES_URL` (three strategies) and SQLite on a
//! temporary file (two strategies); and providers made from the application's own sqlx pool
//! (`SqlProvider::from_pool`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_conformance::{Factory, Partition, ProxyPartition, async_trait, service_url};
use dlock_core::{DynLockProvider, Result};
use dlock_sql::SqlProvider;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};
use support::{prefix, with_query};

mod support;

struct SqlFactory {
    url: String,
    strategy: &'static str,
    /// The provider is made from a pool the test opens (`from_*_pool`), not from the URL.
    from_pool: bool,
    providers: Mutex<Vec<SqlProvider>>,
    _file: Option<TempFile>,
}

/// A SQLite file removed (with its WAL files) when the test ends.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        support::remove_sqlite(&self.0);
    }
}

impl SqlFactory {
    fn mysql(strategy: &'static str) -> Option<Self> {
        service_url("DLOCK_MYSQL_URL").map(|url| Self {
            // A for-update hold pins a connection: the cases hold up to 34 locks at once.
            url: with_query(
                &url,
                &format!("strategy={strategy}&pool=48&table={}", prefix(strategy)),
            ),
            strategy,
            from_pool: false,
            providers: Mutex::new(Vec::new()),
            _file: None,
        })
    }

    fn postgres(strategy: &'static str) -> Option<Self> {
        service_url("DLOCK_POSTGRES_URL").map(|url| Self {
            url: with_query(
                &url,
                &format!("strategy={strategy}&pool=48&table={}", prefix(strategy)),
            ),
            strategy,
            from_pool: false,
            providers: Mutex::new(Vec::new()),
            _file: None,
        })
    }

    fn sqlite(strategy: &'static str) -> Option<Self> {
        let path =
            std::env::temp_dir().join(format!("dlock-conf-{}.db", uuid::Uuid::new_v4().simple()));
        Some(Self {
            url: format!(
                "sqlite://{}?strategy={strategy}&table={}",
                path.display(),
                prefix(strategy)
            ),
            strategy,
            from_pool: false,
            providers: Mutex::new(Vec::new()),
            _file: Some(TempFile(path)),
        })
    }

    fn on_own_pool(self) -> Self {
        Self {
            from_pool: true,
            ..self
        }
    }

    /// A provider for `url`: from the URL, or from a pool opened on it as an application
    /// would (sqlx's defaults, none of dlock's settings).
    async fn provider(&self, url: &str) -> Result<SqlProvider> {
        if !self.from_pool {
            return SqlProvider::connect(url).await;
        }
        let strategy: dlock_sql::Strategy = self.strategy.parse()?;
        let base = url.split('?').next().unwrap();
        if self.is_postgres() {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(48)
                .connect(base)
                .await
                .unwrap();
            return support::on_pool(pool, strategy, &prefix(self.strategy), 48).await;
        }
        if self.is_sqlite() {
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(base.strip_prefix("sqlite://").unwrap())
                .create_if_missing(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            support::on_pool(pool, strategy, &prefix(self.strategy), 1).await
        } else {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(48)
                .connect(base)
                .await
                .unwrap();
            support::on_pool(pool, strategy, &prefix(self.strategy), 48).await
        }
    }

    /// A provider through a proxy the case can cut (`None` for SQLite, a file).
    async fn proxied(&self) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        if self.is_sqlite() {
            return None;
        }
        Some(
            async {
                let port = if self.is_postgres() { 5432 } else { 3306 };
                let (cut, url) = ProxyPartition::start(&self.url, port).await?;
                let p = self.provider(&url).await?;
                self.providers.lock().unwrap().push(p.clone());
                let p: DynLockProvider = Arc::new(p);
                Ok((p, Box::new(cut) as Box<dyn Partition>))
            }
            .await,
        )
    }

    fn is_sqlite(&self) -> bool {
        self.url.starts_with("sqlite:")
    }

    fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres")
    }

    /// `sql` with PostgreSQL's numbered placeholders where needed.
    fn q(&self, sql: &str) -> String {
        support::q(&self.url, sql)
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
        if self.is_postgres() {
            // for-update on PostgreSQL is held as an advisory lock.
            return self.advisory_residue(name).await;
        }
        let admin = self.admin().await;
        let hex: String = name.bytes().map(|b| format!("{b:02X}")).collect();
        let mut threads = std::collections::BTreeSet::new();
        let rows = sqlx::query(&format!(
            "SELECT DISTINCT t.trx_mysql_thread_id \
             FROM information_schema.INNODB_LOCKS l \
             JOIN information_schema.INNODB_TRX t ON t.trx_id = l.lock_trx_id \
             WHERE l.lock_table LIKE '%`{}_rows`' AND l.lock_data = ?",
            prefix(self.strategy)
        ))
        .bind(format!("0x{hex}"))
        .fetch_all(&admin)
        .await
        .unwrap();
        for row in rows {
            threads.insert(row.try_get::<i64, _>(0).unwrap());
        }
        threads.extend(self.holders_in_a_transaction(&admin, name).await);
        admin.close().await;
        threads.len()
    }

    /// MySQL: the server connections this case's providers know hold `name` whose
    /// transaction is still open (InnoDB's `INNODB_TRX`).
    async fn holders_in_a_transaction(&self, admin: &AnyPool, name: &str) -> Vec<i64> {
        let holders: Vec<u64> = self
            .providers
            .lock()
            .unwrap()
            .iter()
            .filter_map(|p| p.holder_connection_id(name))
            .collect();
        let mut open = Vec::new();
        for id in holders {
            let id = i64::try_from(id).unwrap();
            let n: i64 = sqlx::query(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?",
            )
            .bind(id)
            .fetch_one(admin)
            .await
            .unwrap()
            .try_get(0)
            .unwrap();
            if n > 0 {
                open.push(id);
            }
        }
        open
    }
}

impl SqlFactory {
    /// MySQL named locks (get-lock): the session that holds `name`'s lock, the sessions whose
    /// statement waits in `GET_LOCK` for it (a cancelled waiter whose statement still waits
    /// on the server counts), and an open transaction on a holder's session (a token's
    /// INSERT left uncommitted would hold the fence row). A waiting statement spells the name
    /// in hexadecimal digits, as the holder's server-wide lock name is computed from it.
    async fn get_lock_residue(&self, name: &str) -> usize {
        let admin = self.admin().await;
        let t = prefix(self.strategy);
        let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
        let key = format!(
            "SHA2(CONCAT_WS(X'00', CAST(LOWER(DATABASE()) AS BINARY), CAST('{t}' AS BINARY), \
             CAST(X'{hex}' AS BINARY)), 256)"
        );
        let held: Option<i64> = sqlx::query(&format!("SELECT IS_USED_LOCK({key})"))
            .fetch_one(&admin)
            .await
            .unwrap()
            .try_get(0)
            .unwrap();
        let waiting: i64 = sqlx::query(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE ID <> CONNECTION_ID() AND INFO LIKE CONCAT('%GET_LOCK(%', ?, '%')",
        )
        .bind(format!("X'{hex}'"))
        .fetch_one(&admin)
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
        let open = self.holders_in_a_transaction(&admin, name).await.len();
        admin.close().await;
        usize::from(held.is_some()) + usize::try_from(waiting).unwrap() + open
    }

    /// PostgreSQL advisory locks: the sessions that hold or wait for `name`'s key, from the
    /// lock manager (a cancelled waiter whose statement still waits counts).
    async fn advisory_residue(&self, name: &str) -> usize {
        let admin = self.admin().await;
        let t = prefix(self.strategy);
        let key: Option<i32> = sqlx::query(&format!("SELECT id FROM {t}_names WHERE name = $1"))
            .bind(name.as_bytes())
            .fetch_optional(&admin)
            .await
            .unwrap()
            .map(|row| row.try_get(0).unwrap());
        let n: i64 = match key {
            Some(key) => sqlx::query(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND classid = 1684828003 AND objid = $1::INTEGER::OID AND objsubid = 2",
            )
            .bind(key)
            .fetch_one(&admin)
            .await
            .unwrap()
            .try_get(0)
            .unwrap(),
            None => 0,
        };
        admin.close().await;
        usize::try_from(n).unwrap()
    }
}

#[async_trait]
impl Factory for SqlFactory {
    fn label(&self) -> String {
        let db = if self.is_sqlite() {
            "sqlite"
        } else if self.is_postgres() {
            "postgres"
        } else {
            "mysql"
        };
        let own = if self.from_pool { " (own pool)" } else { "" };
        format!("{db}/{}{own}", self.strategy)
    }

    async fn connect(&self) -> Result<DynLockProvider> {
        let p = self.provider(&self.url).await?;
        self.providers.lock().unwrap().push(p.clone());
        Ok(Arc::new(p))
    }

    /// MySQL and PostgreSQL through a proxy; a SQLite file cannot be cut off.
    async fn connect_partitionable(&self) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        self.proxied().await
    }

    /// The same: the factory's URL shortens nothing (no lease, timeout or session setting;
    /// `pool=48` only makes room for the cases' many holds), so the holds take the default
    /// 30 s watchdog lease and, for-update and advisory, the server-side lease that follows
    /// it, as deployed.
    async fn connect_partitionable_as_deployed(
        &self,
    ) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        self.proxied().await
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
                let t = prefix(self.strategy);
                sqlx::query(&self.q(&format!("DELETE FROM {t}_holds WHERE name = ?")))
                    .bind(name.as_bytes())
                    .execute(&admin)
                    .await
                    .unwrap();
            }
            "optimistic" => {
                let t = prefix(self.strategy);
                sqlx::query(&self.q(&format!(
                    "UPDATE {t}_versions SET owner = '', expires_at = 0 WHERE name = ?"
                )))
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
                let kill = if self.is_postgres() {
                    format!("SELECT pg_terminate_backend({id})")
                } else {
                    format!("KILL {id}")
                };
                sqlx::query(&kill).execute(&admin).await.unwrap();
            }
        }
        admin.close().await;
        Some(Ok(()))
    }

    async fn residue(&self, name: &str) -> Option<Result<usize>> {
        let t = prefix(self.strategy);
        let query = match self.strategy {
            "unique-insert" => format!("SELECT COUNT(*) FROM {t}_holds WHERE name = ?"),
            "optimistic" => {
                format!("SELECT COUNT(*) FROM {t}_versions WHERE name = ? AND owner <> ''")
            }
            "advisory" => return Some(Ok(self.advisory_residue(name).await)),
            "get-lock" => return Some(Ok(self.get_lock_residue(name).await)),
            _ => return Some(Ok(self.for_update_residue(name).await)),
        };
        let admin = self.admin().await;
        let n: i64 = sqlx::query(&self.q(&query))
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

mod mysql_get_lock {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::mysql("get-lock"));
}

mod mysql_get_lock_own_pool {
    use super::*;
    dlock_conformance::conformance_tests!(
        SqlFactory::mysql("get-lock").map(SqlFactory::on_own_pool)
    );
}

mod sqlite_unique_insert {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::sqlite("unique-insert"));
}

mod sqlite_optimistic {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::sqlite("optimistic"));
}

mod mysql_for_update_own_pool {
    use super::*;
    dlock_conformance::conformance_tests!(
        SqlFactory::mysql("for-update").map(SqlFactory::on_own_pool)
    );
}

mod sqlite_unique_insert_own_pool {
    use super::*;
    dlock_conformance::conformance_tests!(
        SqlFactory::sqlite("unique-insert").map(SqlFactory::on_own_pool)
    );
}

mod postgres_advisory {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::postgres("advisory"));
}

mod postgres_unique_insert {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::postgres("unique-insert"));
}

mod postgres_optimistic {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::postgres("optimistic"));
}

mod postgres_for_update {
    use super::*;
    dlock_conformance::conformance_tests!(SqlFactory::postgres("for-update"));
}

mod postgres_for_update_own_pool {
    use super::*;
    dlock_conformance::conformance_tests!(
        SqlFactory::postgres("for-update").map(SqlFactory::on_own_pool)
    );
}
