//! The election: the mutex of the name, whose holder leads, and the leader's proposal in a
//! hash beside it (`dlock_election:{name}`, in the lock's cluster slot). A campaigner that
//! is granted the lock posts its proposal for its term (the lock's fencing token); a reader
//! takes the proposal only when its term is the lock's last token and the lock is held, so a
//! proposal of an ended term is never the leader's. Between a grant and its post the leader
//! is seen with an empty proposal.

use dlock_core::backend::{RawElection, RawLock, Request};
use dlock_core::{Error, FencingToken, Leader, LockGuard, Result, async_trait};
use redis::Value;

use crate::call::{Call, read_held, text};
use crate::error::unexpected;
use crate::keys::prefix_name;
use crate::mutex::RedisMutex;
use crate::scripts::election::{LEADER, POST};

/// The raw election of one name. It is the mutex of that name: a lock and a campaign there
/// exclude each other.
#[derive(Debug)]
pub struct RedisElection {
    mutex: RedisMutex,
    /// The hash of the leader's proposal.
    proposal_key: String,
}

impl RedisElection {
    pub(crate) fn new(mutex: RedisMutex) -> Self {
        let proposal_key = prefix_name("dlock_election", &mutex.keys.name);
        Self {
            mutex,
            proposal_key,
        }
    }

    /// Posts `proposal` for `term`: false if the lock is not held in that term.
    async fn post(&self, term: FencingToken, proposal: &[u8]) -> Result<bool> {
        let call = Call::new("post the proposal", &POST)
            .key(self.mutex.keys.name.as_str())
            .key(self.mutex.keys.token.as_str())
            .key(self.proposal_key.as_str())
            .num(term.get())
            .arg(proposal);
        read_held("post the proposal", self.mutex.inner.call(&call).await?)
    }
}

#[async_trait]
impl RawElection for RedisElection {
    async fn campaign(&self, req: &Request<'_>, proposal: &[u8]) -> Result<Option<LockGuard>> {
        let Some(guard) = self.mutex.acquire(req).await? else {
            return Ok(None);
        };
        // A hold lost before the post is the core's to see (the guard says so); an error
        // drops the guard, which releases it.
        self.post(guard.fencing_token(), proposal).await?;
        Ok(Some(guard))
    }

    async fn proclaim(&self, leadership: &LockGuard, proposal: &[u8]) -> Result<()> {
        if self.post(leadership.fencing_token(), proposal).await? {
            Ok(())
        } else {
            Err(Error::lock_lost(leadership.name().as_str()))
        }
    }

    async fn leader(&self) -> Result<Option<Leader>> {
        let call = Call::new("read the leader", &LEADER)
            .key(self.mutex.keys.name.as_str())
            .key(self.mutex.keys.token.as_str())
            .key(self.proposal_key.as_str());
        let reply = self.mutex.inner.call(&call).await?;
        let items = match reply {
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
