//! The election: a fair mutex hold whose grant records the campaigner's proposal in the same
//! step, so the store never shows a leader without its proposal.

use dlock_core::backend::{RawElection, Request};
use dlock_core::{FencingToken, Leader, LockGuard, LockName, Result, async_trait};

use crate::handles::Client;
use crate::store::{Kind, Mode, Want};

/// The raw election of one name: campaigners queue in the order they came, as on etcd and
/// ZooKeeper. It shares the name with the mutex of that name (they exclude each other, as
/// `etcdctl lock` and `etcdctl elect` do).
#[derive(Debug)]
pub struct MemoryElection {
    pub(crate) client: Client,
    pub(crate) name: LockName,
}

#[async_trait]
impl RawElection for MemoryElection {
    async fn campaign(&self, req: &Request<'_>, proposal: &[u8]) -> Result<Option<LockGuard>> {
        let want = Want {
            owner: self.client.store.next_id(),
            kind: Kind::Mutex,
            mode: Mode::Exclusive,
            fair: true,
            lease: req.options.lease,
        };
        self.client
            .store
            .acquire(
                &self.client.link,
                req.name,
                want,
                req.deadline,
                Some(proposal),
            )
            .await
    }

    async fn proclaim(&self, leadership: &LockGuard, proposal: &[u8]) -> Result<()> {
        self.client.store.reachable(&self.client.link)?;
        let term = leadership.fencing_token().get();
        if self.client.store.proclaim(&self.name, term, proposal) {
            Ok(())
        } else {
            Err(dlock_core::Error::lock_lost(self.name.as_str()))
        }
    }

    async fn leader(&self) -> Result<Option<Leader>> {
        self.client.store.reachable(&self.client.link)?;
        Ok(self
            .client
            .store
            .leader(&self.name)
            .map(|(term, proposal)| {
                Leader::new(
                    FencingToken::new(term),
                    proposal.as_deref().map(<[u8]>::to_vec).unwrap_or_default(),
                )
            }))
    }
}
