//! The conformance suite against a real Redis server (`DLOCK_REDIS_URL`), a real 3-master
//! Redis Cluster (`DLOCK_REDIS_CLUSTER_URL`) and a master with a replica behind three
//! Sentinels (`DLOCK_REDIS_SENTINEL_URL`), all from `scripts/services up`.

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::{Factory, Partition, ProxyPartition, async_trait, service_url};
use dlock_core::{DynLockProvider, Result};
use dlock_redis::RedisProvider;

mod support;

use support::patient;

struct RedisFactory {
    url: String,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Single,
    Cluster,
    Sentinel,
}

/// A plain connection for the test's own commands, to a server or a cluster.
enum Admin {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Admin {
    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        match self {
            Self::Single(c) => cmd.query_async(c).await.unwrap(),
            Self::Cluster(c) => cmd.query_async(c).await.unwrap(),
        }
    }
}

impl RedisFactory {
    fn from_env(var: &str) -> Option<Self> {
        service_url(var).map(|url| Self {
            kind: if url.starts_with("redis+sentinel://") {
                Kind::Sentinel
            } else if url.contains("cluster=true") {
                Kind::Cluster
            } else {
                Kind::Single
            },
            url,
        })
    }

    async fn admin(&self) -> Admin {
        match self.kind {
            Kind::Cluster => {
                let seed = self.url.split('?').next().unwrap();
                let client = redis::cluster::ClusterClient::new(vec![seed]).unwrap();
                Admin::Cluster(client.get_async_connection().await.unwrap())
            }
            Kind::Single => {
                let client = redis::Client::open(self.url.as_str()).unwrap();
                Admin::Single(patient(&client).await)
            }
            Kind::Sentinel => {
                // redis+sentinel://host:port,host:port/master: ask the Sentinels.
                let rest = self.url.trim_start_matches("redis+sentinel://");
                let (hosts, master) = rest.split_once('/').unwrap();
                let master = master.split(['/', '?']).next().unwrap();
                let sentinels: Vec<String> =
                    hosts.split(',').map(|h| format!("redis://{h}")).collect();
                let mut sentinel = redis::sentinel::SentinelClient::build(
                    sentinels,
                    master,
                    None,
                    redis::sentinel::SentinelServerType::Master,
                )
                .unwrap();
                let client = sentinel.async_get_client().await.unwrap();
                Admin::Single(patient(&client).await)
            }
        }
    }
}

#[async_trait]
impl Factory for RedisFactory {
    fn label(&self) -> String {
        match self.kind {
            Kind::Single => "redis".into(),
            Kind::Cluster => "redis-cluster".into(),
            Kind::Sentinel => "redis-sentinel".into(),
        }
    }

    async fn connect(&self) -> Result<DynLockProvider> {
        Ok(Arc::new(RedisProvider::connect(&self.url).await?))
    }

    async fn connect_partitionable(&self) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        if self.kind != Kind::Single {
            // A cluster client learns the nodes' own addresses from CLUSTER SLOTS, a Sentinel
            // client the master's from the Sentinels: a proxy in front of the URL's hosts
            // would not stand between the client and its data.
            return None;
        }
        Some(
            async {
                let (cut, url) = ProxyPartition::start(&self.url, 6379).await?;
                let p: DynLockProvider = Arc::new(RedisProvider::connect(&url).await?);
                Ok((p, Box::new(cut) as Box<dyn Partition>))
            }
            .await,
        )
    }

    /// Redis has no session setting: a provider with the URL's defaults is the deployed one
    /// (holds take the default 30 s watchdog lease).
    async fn connect_partitionable_as_deployed(
        &self,
    ) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        self.connect_partitionable().await
    }

    fn short_lease(&self) -> Duration {
        Duration::from_millis(600)
    }

    async fn force_expire(&self, name: &str) -> Option<Result<()>> {
        let _: i64 = self.admin().await.query(redis::cmd("DEL").arg(name)).await;
        Some(Ok(()))
    }

    async fn residue(&self, name: &str) -> Option<Result<usize>> {
        let mut c = self.admin().await;
        let kind: String = c.query(redis::cmd("TYPE").arg(name)).await;
        let holds = if kind == "hash" {
            let fields: Vec<String> = c.query(redis::cmd("HKEYS").arg(name)).await;
            fields.iter().filter(|f| *f != "mode").count()
        } else {
            0
        };
        // Fair waiters (each has a queue and a timeout entry: a leak of either counts) and
        // held semaphore permits.
        let queue: usize = c
            .query(redis::cmd("LLEN").arg(format!("redisson_lock_queue:{{{name}}}")))
            .await;
        let fair_timeouts: usize = c
            .query(redis::cmd("ZCARD").arg(format!("redisson_lock_timeout:{{{name}}}")))
            .await;
        let permits: usize = c
            .query(redis::cmd("ZCARD").arg(format!("{{{name}}}:timeout")))
            .await;
        Some(Ok(holds + queue.max(fair_timeouts) + permits))
    }
}

mod single {
    use super::*;
    dlock_conformance::conformance_tests!(RedisFactory::from_env("DLOCK_REDIS_URL"));
}

mod cluster {
    use super::*;
    dlock_conformance::conformance_tests!(RedisFactory::from_env("DLOCK_REDIS_CLUSTER_URL"));
}

mod sentinel {
    use super::*;
    dlock_conformance::conformance_tests!(RedisFactory::from_env("DLOCK_REDIS_SENTINEL_URL"));
}
