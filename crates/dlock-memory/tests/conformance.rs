//! The conformance suite against the memory backend: once as is, and once with every store
//! call slowed down, so cancellation meets real await points.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_conformance::{Factory, Partition, async_trait};
use dlock_core::{DynLockProvider, Result};
use dlock_memory::MemoryProvider;

struct MemoryFactory {
    store: String,
    latency: Duration,
}

impl MemoryFactory {
    fn new(latency: Duration) -> Self {
        static STORES: AtomicU64 = AtomicU64::new(0);
        Self {
            store: format!("conformance-{}", STORES.fetch_add(1, Ordering::Relaxed)),
            latency,
        }
    }

    fn provider(&self) -> MemoryProvider {
        let p = MemoryProvider::named(&self.store);
        p.set_latency(self.latency);
        p
    }
}

/// The memory store's own partition hook.
struct Cut(MemoryProvider);

impl Partition for Cut {
    fn set_partitioned(&self, partitioned: bool) {
        self.0.set_partitioned(partitioned);
    }
}

#[async_trait]
impl Factory for MemoryFactory {
    fn label(&self) -> String {
        if self.latency.is_zero() {
            "memory".into()
        } else {
            format!("memory (latency {:?})", self.latency)
        }
    }

    async fn connect(&self) -> Result<DynLockProvider> {
        Ok(Arc::new(self.provider()))
    }

    async fn connect_partitionable(&self) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        let p = self.provider();
        Some(Ok((Arc::new(p.clone()), Box::new(Cut(p)))))
    }

    async fn connect_partitionable_as_deployed(
        &self,
    ) -> Option<Result<(DynLockProvider, Box<dyn Partition>)>> {
        self.connect_partitionable().await
    }

    fn short_lease(&self) -> Duration {
        Duration::from_millis(300)
    }

    fn slack(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn force_expire(&self, name: &str) -> Option<Result<()>> {
        self.provider().drop_holds(name);
        Some(Ok(()))
    }

    async fn residue(&self, name: &str) -> Option<Result<usize>> {
        let p = self.provider();
        Some(Ok(p.holders(name) + p.waiters(name)))
    }
}

mod memory {
    use super::*;
    dlock_conformance::conformance_tests!(Some(MemoryFactory::new(Duration::ZERO)));
}

mod memory_slow {
    use super::*;
    dlock_conformance::conformance_tests!(Some(MemoryFactory::new(Duration::from_millis(1))));
}
