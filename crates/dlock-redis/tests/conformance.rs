//! The conformance suite against a real Redis server (`DLOCK_REDIS_URL`).

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::{Factory, async_trait, service_url};
use dlock_core::{DynLockProvider, Result};
use dlock_redis::RedisProvider;

struct RedisFactory {
    url: String,
}

impl RedisFactory {
    fn from_env() -> Option<Self> {
        service_url("DLOCK_REDIS_URL").map(|url| Self { url })
    }

    async fn admin(&self) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::open(self.url.as_str()).unwrap();
        client.get_multiplexed_async_connection().await.unwrap()
    }
}

#[async_trait]
impl Factory for RedisFactory {
    fn label(&self) -> String {
        "redis".into()
    }

    async fn connect(&self) -> Result<DynLockProvider> {
        Ok(Arc::new(RedisProvider::connect(&self.url).await?))
    }

    fn short_lease(&self) -> Duration {
        Duration::from_millis(600)
    }

    async fn force_expire(&self, name: &str) -> Option<Result<()>> {
        let mut c = self.admin().await;
        let _: () = redis::cmd("DEL")
            .arg(name)
            .query_async(&mut c)
            .await
            .unwrap();
        Some(Ok(()))
    }

    async fn residue(&self, name: &str) -> Option<Result<usize>> {
        let mut c = self.admin().await;
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg(name)
            .query_async(&mut c)
            .await
            .unwrap_or_default();
        let holds = fields.iter().filter(|f| *f != "mode").count();
        let queue: usize = redis::cmd("LLEN")
            .arg(format!("redisson_lock_queue:{{{name}}}"))
            .query_async(&mut c)
            .await
            .unwrap();
        Some(Ok(holds + queue))
    }
}

dlock_conformance::conformance_tests!(RedisFactory::from_env());
