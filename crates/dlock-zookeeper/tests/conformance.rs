//! The conformance suite against a real ZooKeeper (`DLOCK_ZK_URL`, from `scripts/services up`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::{Factory, Partition, ProxyPartition, async_trait, service_url};
use dlock_core::{DynLockProvider, Result};
use dlock_zookeeper::zookeeper_client as zk;
use dlock_zookeeper::{ZkConfig, ZkProvider};

use crate::support::{admin, recipe_children};

struct ZkFactory {
    url: String,
    config: ZkConfig,
}

impl ZkFactory {
    fn from_env() -> Option<Self> {
        service_url("DLOCK_ZK_URL").map(|url| Self {
            config: ZkConfig::from_url(&url).unwrap(),
            url,
        })
    }

    /// Every lock, read, write and lease node of `name` (full paths).
    async fn recipe_nodes(&self, admin: &zk::Client, name: &str) -> Vec<String> {
        let path = self.config.lock_path(name).unwrap();
        let mut found = Vec::new();
        for dir in [
            path.clone(),
            format!("{path}/locks"),
            format!("{path}/leases"),
        ] {
            let children = recipe_children(admin, &dir).await;
            found.extend(children.into_iter().map(|c| format!("{dir}/{c}")));
        }
        found
    }
}

#[async_trait]
impl Factory for ZkFactory {
    fn label(&self) -> String {
        "zookeeper".into()
    }

    async fn connect(&self) -> Result<DynLockProvider> {
        Ok(Arc::new(ZkProvider::connect(&self.url).await?))
    }

    /// Through a proxy, with a 2 s session, so the server lets the cut-off holder's nodes go
    /// well within the case's wait.
    async fn connect_partitionable(&self) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        Some(
            async {
                let (cut, url) =
                    ProxyPartition::start(&self.url, dlock_zookeeper::DEFAULT_PORT).await?;
                let url = format!("{url}?session_timeout_ms=2000");
                let p: DynLockProvider = Arc::new(ZkProvider::connect(&url).await?);
                Ok((p, Box::new(cut) as Box<dyn Partition>))
            }
            .await,
        )
    }

    /// Through a proxy, with the backend's default session timeout (none in the URL).
    async fn connect_partitionable_as_deployed(
        &self,
    ) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        Some(
            async {
                let (cut, url) =
                    ProxyPartition::start(&self.url, dlock_zookeeper::DEFAULT_PORT).await?;
                let p: DynLockProvider = Arc::new(ZkProvider::connect(&url).await?);
                Ok((p, Box::new(cut) as Box<dyn Partition>))
            }
            .await,
        )
    }

    fn short_lease(&self) -> Duration {
        Duration::from_millis(600)
    }

    async fn force_expire(&self, name: &str) -> Option<Result<()>> {
        let admin = admin(&self.url).await;
        for node in self.recipe_nodes(&admin, name).await {
            match admin.delete(&node, None).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => panic!("delete {node}: {e}"),
            }
        }
        Some(Ok(()))
    }

    async fn residue(&self, name: &str) -> Option<Result<usize>> {
        let admin = admin(&self.url).await;
        Some(Ok(self.recipe_nodes(&admin, name).await.len()))
    }
}

dlock_conformance::conformance_tests!(ZkFactory::from_env());
