//! The conformance suite against a real etcd: one member (`DLOCK_ETCD_URL`) and a 3-member
//! cluster (`DLOCK_ETCD_CLUSTER_URL`), both from `scripts/services up etcd etcd-cluster`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::{Factory, Partition, async_trait, service_url};
use dlock_core::{DynLockProvider, Result};
use dlock_etcd::etcd_client::{Client, DeleteOptions, GetOptions};
use dlock_etcd::{EtcdConfig, EtcdProvider};

use crate::support::{SHORT_TTL, behind_partition, with_ttl};

/// Clients of one etcd store (a member or a cluster) for the suite.
struct EtcdFactory {
    label: &'static str,
    url: String,
    config: EtcdConfig,
}

impl EtcdFactory {
    fn from_env(var: &str, label: &'static str) -> Option<Self> {
        service_url(var).map(|url| Self {
            label,
            config: EtcdConfig::from_url(&url).unwrap(),
            url,
        })
    }

    /// A separate client for the test's own calls.
    async fn admin(&self) -> Client {
        Client::connect(&self.config.endpoints, None).await.unwrap()
    }

    /// A client through a proxy of its own in front of the first member, with the store's
    /// prefix; `query` (`""` or `?…`) is added to its URL.
    async fn behind_proxy(&self, query: &str) -> Result<(DynLockProvider, Box<dyn Partition>)> {
        let (cut, p) = behind_partition(&self.url, query).await?;
        Ok((Arc::new(p), Box::new(cut)))
    }

    /// The key range of lock `name`.
    fn range(&self, name: &str) -> String {
        format!("{}/", self.config.etcd_lock_name(name).unwrap())
    }
}

#[async_trait]
impl Factory for EtcdFactory {
    fn label(&self) -> String {
        self.label.into()
    }

    async fn connect(&self) -> Result<DynLockProvider> {
        Ok(Arc::new(EtcdProvider::connect(&self.url).await?))
    }

    /// Through a proxy in front of the first member, with a 2 s lease, so the server lets
    /// the cut-off holder's keys go well within the case's wait.
    async fn connect_partitionable(&self) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        Some(self.behind_proxy(&with_ttl("", SHORT_TTL)).await)
    }

    /// Through a proxy in front of the first member, with the default lease time-to-live.
    async fn connect_partitionable_as_deployed(
        &self,
    ) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        Some(self.behind_proxy("").await)
    }

    fn holder_timeout(&self) -> Duration {
        SHORT_TTL
    }

    async fn force_expire(&self, name: &str) -> Option<Result<()>> {
        let mut admin = self.admin().await;
        admin
            .delete(self.range(name), Some(DeleteOptions::new().with_prefix()))
            .await
            .unwrap();
        Some(Ok(()))
    }

    async fn residue(&self, name: &str) -> Option<Result<usize>> {
        let mut admin = self.admin().await;
        let resp = admin
            .get(
                self.range(name),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .unwrap();
        Some(Ok(usize::try_from(resp.count()).unwrap()))
    }
}

mod member {
    use super::EtcdFactory;
    dlock_conformance::conformance_tests!(EtcdFactory::from_env("DLOCK_ETCD_URL", "etcd"));
}

mod cluster {
    use super::EtcdFactory;
    dlock_conformance::conformance_tests!(EtcdFactory::from_env(
        "DLOCK_ETCD_CLUSTER_URL",
        "etcd-cluster"
    ));
}
