//! A provider's line to the store, and its renewals in batches.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::Batcher;
use dlock_core::{LockName, Result};

use crate::BACKEND;
use crate::store::Store;

/// One provider's line to the store: cut it and that provider (and its clones) can no longer
/// reach the store, like a client partitioned from its server. The provider's renewals go
/// over it in batches, one round trip for all the holds that come due together, as a server
/// backend pipelines them.
#[derive(Debug)]
pub(crate) struct Link {
    cut: AtomicBool,
    renewals: Batcher<Renewal, ()>,
}

/// One hold's renewal, as its batch carries it.
pub(crate) struct Renewal {
    pub(crate) key: LockName,
    pub(crate) id: u64,
    pub(crate) ttl: Duration,
}

impl Link {
    /// A provider's line to `store`.
    pub(crate) fn new(store: &Arc<Store>) -> Arc<Self> {
        let store = Arc::clone(store);
        Arc::new_cyclic(|link: &Weak<Self>| Self {
            cut: AtomicBool::new(false),
            renewals: Batcher::with_owner(BACKEND, Weak::clone(link), move |link, items| {
                let store = Arc::clone(&store);
                async move { store.renew_all(&link, items).await }
            }),
        })
    }

    pub(crate) fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    pub(crate) fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Sends `renewal` in this link's next batch.
    pub(crate) async fn renew(&self, renewal: Renewal, within: Duration) -> Result<()> {
        self.renewals.call(renewal, within).await
    }
}

impl Store {
    /// Renews a batch of one link's holds: one round trip, then each hold as `extend` would.
    async fn renew_all(&self, link: &Link, items: Vec<Renewal>) -> Vec<Result<()>> {
        self.latency().await;
        items
            .into_iter()
            .map(|r| {
                self.reachable(link)?;
                self.extend(&r.key, r.id, r.ttl)
            })
            .collect()
    }
}
