//! The election: the layout of etcd's `concurrency.Election` (the recipe behind `etcdctl
//! elect`), which is its lock's with the proposal as the key's value. A campaigner puts
//! `{name}/{lease id in hex}` with its proposal and the provider's lease; the key with the
//! lowest create revision leads, and its create revision is the term (the fencing token).
//! `etcdctl elect NAME` and `etcdctl elect -l NAME` campaign and observe beside dlock.

use dlock_core::backend::{RawElection, Request};
use dlock_core::{Error, FencingToken, Leader, LockGuard, Result, async_trait};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::error::from_etcd;
use crate::keys::{first_created, range};
use crate::mutex::EtcdMutex;

/// The raw election of one name. It shares its keys with the mutex of that name (a lock and
/// a campaign there exclude each other, as `etcdctl lock` and `etcdctl elect` do).
#[derive(Debug)]
pub struct EtcdElection {
    pub(crate) mutex: EtcdMutex,
}

impl EtcdElection {
    /// The first key of the election by create revision, with its create revision.
    async fn first(&self) -> Result<Option<etcd_client::KeyValue>> {
        let session = &self.mutex.session;
        let range = range(&self.mutex.lock_name);
        session.counters.count(|s| &mut s.gets);
        let mut client = session.client();
        let resp = session
            .bounded(client.get(range.as_str(), Some(first_created())))
            .await
            .map_err(|e| from_etcd(&format!("read {range}"), e))?;
        Ok(resp.kvs().first().cloned())
    }

    fn not_leader(&self) -> Error {
        Error::lock_lost(&self.mutex.lock_name)
    }
}

#[async_trait]
impl RawElection for EtcdElection {
    async fn campaign(&self, req: &Request<'_>, proposal: &[u8]) -> Result<Option<LockGuard>> {
        self.mutex.contend(req, proposal).await
    }

    /// As `concurrency.Election.Proclaim`: the leader's key gets the proposal, in a
    /// transaction that holds only while that key is still the one of this term.
    async fn proclaim(&self, leadership: &LockGuard, proposal: &[u8]) -> Result<()> {
        let term = i64::try_from(leadership.fencing_token().get()).unwrap_or(i64::MAX);
        let Some(first) = self.first().await? else {
            return Err(self.not_leader());
        };
        if first.create_revision() != term {
            return Err(self.not_leader());
        }
        let key = first.key().to_vec();
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                term,
            )])
            .and_then([TxnOp::put(
                key,
                proposal,
                Some(PutOptions::new().with_lease(first.lease())),
            )]);
        let resp = self
            .mutex
            .session
            .txn(None, txn)
            .await
            .map_err(|e| from_etcd(&format!("proclaim in {}", self.mutex.lock_name), e))?;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(self.not_leader())
        }
    }

    async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.first().await?.and_then(|kv| {
            let term = u64::try_from(kv.create_revision()).ok()?;
            Some(Leader::new(FencingToken::new(term), kv.value()))
        }))
    }
}
