//! The stores a run measures: those of `--url`, or by default the embedded SQLite, memory://
//! and every store the environment names, each followed by its peer targets (Curator beside
//! ZooKeeper, sqlx's own advisory lock beside PostgreSQL's, rslock beside Redis).

use std::path::PathBuf;
use std::sync::Arc;

use dlock::DynLockProvider;

use super::{BenchOpts, curator};

/// A store under test.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) label: String,
    pub(super) url: String,
    /// What the workloads run through.
    pub(super) via: Via,
}

/// What a target's workloads run through: dlock, or a peer library's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    /// dlock.
    Dlock,
    /// Test only: dlock, but each client gets its own private store, so nothing is excluded
    /// (the benchmark's exclusion checker must see violations).
    Broken,
    /// Apache Curator (Java) against the ZooKeeper of `url`, which is empty when no zk://
    /// store is configured (the rows then say so).
    Curator,
    /// sqlx's own `PgAdvisoryLock` (W1 and W3) against the PostgreSQL of `url`.
    SqlxPg,
    /// rslock's Redlock (W1, W4 and W7) against the Redis of `url`.
    Rslock,
}

/// The backend column of the sqlx `PgAdvisoryLock` rows.
pub(super) const SQLX_PG: &str = "sqlx PgAdvisoryLock";

/// The backend column of the rslock rows.
pub(super) const RSLOCK: &str = "rslock";

impl Target {
    /// A store measured through dlock (`broken://`: the test's store without exclusion).
    pub(super) fn store(url: String) -> Self {
        if url == "broken://" {
            return Self {
                label: "broken (test)".into(),
                url,
                via: Via::Broken,
            };
        }
        Self {
            label: label_of(&url),
            url,
            via: Via::Dlock,
        }
    }

    /// The peer target `via` (Curator's or sqlx's lock) against the server of `url`.
    fn peer(via: Via, url: String) -> Self {
        let label = match via {
            Via::Curator => curator::LABEL,
            Via::Rslock => RSLOCK,
            _ => SQLX_PG,
        };
        Self {
            label: label.into(),
            url,
            via,
        }
    }

    /// Whether the workloads run through a peer library's lock, not dlock.
    pub(super) fn is_peer(&self) -> bool {
        matches!(self.via, Via::Curator | Via::SqlxPg | Via::Rslock)
    }

    /// A new client of the store: its own connections (a private store if `broken`).
    pub(super) async fn client(&self) -> dlock::Result<DynLockProvider> {
        if self.via == Via::Broken {
            return Ok(Arc::new(dlock::memory::MemoryProvider::new()));
        }
        Ok(Arc::clone(dlock::connect(&self.url).await?.provider()))
    }
}

/// The backend column of a store's rows: its scheme, and a SQL store's strategy.
fn label_of(url: &str) -> String {
    let scheme = url.split("://").next().unwrap_or("?");
    // A host list (`h1,h2`) is no URL host the `url` crate takes; the query is all we read.
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let param = |key: &str| {
        url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    };
    match scheme {
        "mysql" | "mariadb" | "sqlite" | "postgres" | "postgresql" => {
            let scheme = if scheme == "postgresql" {
                "postgres"
            } else {
                scheme
            };
            let strategy = param("strategy").unwrap_or_else(|| "unique-insert".into());
            format!("{scheme}/{strategy}")
        }
        "redis" | "rediss" if param("cluster").as_deref() == Some("true") => "redis-cluster".into(),
        other => other.to_owned(),
    }
}

/// The targets of a run, in order, and the scratch SQLite file of the default list (to remove
/// at the end).
pub(super) fn targets(opts: &BenchOpts) -> (Vec<Target>, Option<PathBuf>) {
    let mut urls = opts.urls.clone();
    let mut scratch = None;
    if urls.is_empty() {
        let file = std::env::temp_dir().join(format!("dlock-bench-{}.db", std::process::id()));
        urls.push(format!("sqlite://{}", file.display()));
        // One set of tables serves one strategy: optimistic gets its own prefix.
        urls.push(format!(
            "sqlite://{}?strategy=optimistic&table=dlock_optimistic",
            file.display()
        ));
        scratch = Some(file);
        // A named store: every client of the benchmark must share it.
        urls.push("memory://dlock-bench".into());
        for var in ["DLOCK_REDIS_URL", "DLOCK_ZK_URL", "DLOCK_ETCD_URL"] {
            if var == "DLOCK_ETCD_URL" && !cfg!(feature = "etcd") {
                // Not compiled in (it needs protoc to build): `--features etcd` adds it.
                continue;
            }
            if let Ok(url) = std::env::var(var) {
                urls.push(url);
            } else if var == "DLOCK_ZK_URL" {
                // Curator's place in the list: its rows say why they were skipped.
                urls.push(CURATOR_WITHOUT_ZK.into());
            }
        }
        for var in ["DLOCK_MYSQL_URL", "DLOCK_POSTGRES_URL"] {
            let Ok(url) = std::env::var(var) else {
                continue;
            };
            // One set of tables serves one strategy: each gets its own prefix.
            let pinned_own = if var == "DLOCK_POSTGRES_URL" {
                ("advisory", "dlock_advisory")
            } else {
                ("get-lock", "dlock_get_lock")
            };
            for (s, table) in [
                ("unique-insert", "dlock"),
                ("optimistic", "dlock_optimistic"),
                ("for-update", "dlock_for_update"),
            ]
            .into_iter()
            .chain([pinned_own])
            {
                let sep = if url.contains('?') { '&' } else { '?' };
                urls.push(format!("{url}{sep}strategy={s}&table={table}&pool=64"));
            }
        }
    }
    let mut targets = Vec::new();
    for url in urls {
        if url == CURATOR_WITHOUT_ZK {
            targets.push(Target::peer(Via::Curator, String::new()));
            continue;
        }
        let zk = url.starts_with("zk://");
        // sqlx's own advisory lock beside dlock's, on the same server.
        let advisory = cfg!(feature = "postgres")
            && url.starts_with("postgres")
            && url.contains("strategy=advisory");
        // rslock beside a single Redis server's rows (it has no cluster or Sentinel mode
        // of dlock's kind).
        let redis = cfg!(feature = "redis")
            && (url.starts_with("redis://") || url.starts_with("rediss://"))
            && !url.contains("cluster=true");
        targets.push(Target::store(url.clone()));
        if zk {
            targets.push(Target::peer(Via::Curator, url));
        } else if advisory {
            targets.push(Target::peer(Via::SqlxPg, url));
        } else if redis {
            targets.push(Target::peer(Via::Rslock, url));
        }
    }
    (targets, scratch)
}

/// Placeholder in the default URL list for the Curator target when DLOCK_ZK_URL is unset.
const CURATOR_WITHOUT_ZK: &str = "curator-without-zk";

#[cfg(test)]
mod tests {
    use super::label_of;

    #[test]
    fn labels_name_the_backend_and_strategy() {
        assert_eq!(label_of("sqlite:///tmp/x.db"), "sqlite/unique-insert");
        assert_eq!(
            label_of("mysql://u@h/db?strategy=for-update&pool=64"),
            "mysql/for-update"
        );
        assert_eq!(
            label_of("postgresql://u@h/db?pool=64&strategy=optimistic"),
            "postgres/optimistic"
        );
        assert_eq!(label_of("postgres://u@h/db"), "postgres/unique-insert");
        assert_eq!(label_of("redis://h:7000/?cluster=true"), "redis-cluster");
        assert_eq!(label_of("zk://h:2181"), "zk");
        // A key that only ends in `strategy` or a value that only holds `cluster=true` is not
        // the parameter.
        assert_eq!(
            label_of("mysql://u@h/db?table=my_strategy&x_strategy=for-update"),
            "mysql/unique-insert"
        );
        assert_eq!(label_of("redis://h/?name=cluster%3Dtrue"), "redis");
    }
}
