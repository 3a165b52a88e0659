//! The election's proposals: the mutex of the name leads (the core's
//! [`PostedElection`](dlock_core::backend::PostedElection)), and the leader's proposal is kept
//! in a hash beside it (`dlock_election:{name}`, in the lock's cluster slot). A post writes it
//! only while the lock is held in its term (the lock's last fencing token); a reader takes it
//! only when its term is the lock's last token and the lock is held, so a proposal of an
//! ended term is never the leader's.

use std::sync::Arc;

use dlock_core::backend::{PostedElection, ProposalBoard};
use dlock_core::{FencingToken, Leader, Result, async_trait};
use redis::Value;

use crate::call::{Call, read_held, text};
use crate::error::unexpected;
use crate::keys::{Keys, prefix_name};
use crate::mutex::RedisMutex;
use crate::scripts::election::{LEADER, POST};
use crate::shared::Inner;

/// The raw election of one name: the mutex of that name (a lock and a campaign there
/// exclude each other) and its proposals.
pub type RedisElection = PostedElection<RedisMutex, RedisProposals>;

/// The proposals of one name's election.
#[derive(Debug)]
pub struct RedisProposals {
    inner: Arc<Inner>,
    keys: Arc<Keys>,
    /// The hash of the leader's proposal.
    key: String,
}

impl RedisProposals {
    pub(crate) fn new(inner: Arc<Inner>, keys: Arc<Keys>) -> Self {
        let key = prefix_name("dlock_election", &keys.name);
        Self { inner, keys, key }
    }
}

#[async_trait]
impl ProposalBoard for RedisProposals {
    async fn post(&self, term: FencingToken, proposal: &[u8]) -> Result<bool> {
        let call = Call::new("post the proposal", &POST)
            .key(self.keys.name.as_str())
            .key(self.keys.token.as_str())
            .key(self.key.as_str())
            .num(term.get())
            .arg(proposal);
        read_held("post the proposal", self.inner.call(&call).await?)
    }

    async fn leader(&self) -> Result<Option<Leader>> {
        let call = Call::new("read the leader", &LEADER)
            .key(self.keys.name.as_str())
            .key(self.keys.token.as_str())
            .key(self.key.as_str());
        let items = match self.inner.call(&call).await? {
            Value::Nil => return Ok(None),
            Value::Array(items) => items,
            other => return Err(unexpected("read the leader", other)),
        };
        // A lock held without a fencing token (a Java `RLock`) has no term: no leader.
        let Some(term) = items
            .first()
            .and_then(text)
            .and_then(|t| t.parse::<u64>().ok())
        else {
            return Ok(None);
        };
        let posted = items
            .get(1)
            .and_then(text)
            .and_then(|t| t.parse::<u64>().ok());
        let proposal = match (posted, items.get(2)) {
            (Some(p), Some(Value::BulkString(bytes))) if p == term => bytes.clone(),
            _ => Vec::new(),
        };
        Ok(Some(Leader::new(FencingToken::new(term), proposal)))
    }
}
