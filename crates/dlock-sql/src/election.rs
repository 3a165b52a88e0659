//! The election: the mutex of the name (in the provider's strategy), whose holder leads, and
//! the leader's proposal in `<t>_elections` (name, term, proposal). A campaigner that is
//! granted the lock posts its proposal for its term (the lock's fencing token); a post never
//! replaces the proposal of a later term. A reader takes the proposal only when its term is
//! the lock's last token and the lock is held, so a proposal outlived by its term is never
//! the leader's. Between a grant and its post the leader is seen with an empty proposal.

use std::sync::Arc;

use dlock_core::backend::{RawElection, RawLock, Request};
use dlock_core::{Error, FencingToken, Leader, LockGuard, LockName, Result, async_trait};

use crate::Inner;
use crate::config::Dialect;
use crate::db::query;
use crate::handles::SqlMutex;
use crate::sql::Tables;
use crate::strategy::LockStrategy;

/// The statements of the proposals' table.
#[derive(Debug)]
pub(crate) struct ElectionSql {
    /// Posts a proposal unless one of a later term is there (`?`: name, term, proposal).
    post: String,
    /// The proposal and its term (`?`: name).
    read: String,
}

impl ElectionSql {
    pub(crate) fn new(s: Tables<'_>) -> Self {
        let t = s.prefix;
        let insert = format!("INSERT INTO {t}_elections (name, term, proposal) VALUES (?, ?, ?)");
        let post = match s.dialect {
            // The proposal is assigned first: it reads the term the row had.
            Dialect::MySql => format!(
                "{insert} ON DUPLICATE KEY UPDATE \
                 proposal = IF(VALUES(term) >= term, VALUES(proposal), proposal), \
                 term = GREATEST(term, VALUES(term))"
            ),
            Dialect::Postgres | Dialect::Sqlite => format!(
                "{insert} ON CONFLICT (name) DO UPDATE SET term = excluded.term, \
                 proposal = excluded.proposal WHERE {t}_elections.term <= excluded.term"
            ),
        };
        Self {
            post: s.stmt(post),
            read: s.stmt(format!(
                "SELECT term, proposal FROM {t}_elections WHERE name = ?"
            )),
        }
    }
}

/// The raw election of one name. It is the mutex of that name: a lock and a campaign there
/// exclude each other.
#[derive(Debug)]
pub struct SqlElection {
    pub(crate) mutex: SqlMutex,
    pub(crate) strategy: Arc<dyn LockStrategy>,
    pub(crate) inner: Arc<Inner>,
    pub(crate) sql: Arc<ElectionSql>,
    pub(crate) name: LockName,
}

impl SqlElection {
    /// Posts `proposal` for `term`.
    async fn post(&self, term: FencingToken, proposal: &[u8]) -> Result<()> {
        let term = i64::try_from(term.get()).unwrap_or(i64::MAX);
        query(&self.sql.post)
            .bind(self.name.as_str().as_bytes())
            .bind(term)
            .bind(proposal)
            .execute(&self.inner.pool)
            .await
            .map_err(self.inner.err("post the proposal"))?;
        Ok(())
    }

    /// The term of the lock's holder now, if it is held.
    async fn term(&self) -> Result<Option<u64>> {
        let status = self.strategy.describe(&self.name).await?;
        Ok(status.last_token.filter(|_| status.is_held()))
    }
}

#[async_trait]
impl RawElection for SqlElection {
    async fn campaign(&self, req: &Request<'_>, proposal: &[u8]) -> Result<Option<LockGuard>> {
        let Some(guard) = self.mutex.acquire(req).await? else {
            return Ok(None);
        };
        // An error drops the guard, which releases it.
        self.post(guard.fencing_token(), proposal).await?;
        Ok(Some(guard))
    }

    /// Posts, then checks that the lock is still held in this term: a proposal posted by a
    /// leader deposed meanwhile is never read as the leader's.
    async fn proclaim(&self, leadership: &LockGuard, proposal: &[u8]) -> Result<()> {
        let term = leadership.fencing_token();
        self.post(term, proposal).await?;
        if self.term().await? == Some(term.get()) {
            Ok(())
        } else {
            Err(Error::lock_lost(self.name.as_str()))
        }
    }

    async fn leader(&self) -> Result<Option<Leader>> {
        let Some(term) = self.term().await? else {
            return Ok(None);
        };
        let err = self.inner.err("read the leader's proposal");
        let row = query(&self.sql.read)
            .bind(self.name.as_str().as_bytes())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(err)?;
        let proposal = match row {
            Some(row) if u64::try_from(row.int(0).map_err(err)?).ok() == Some(term) => {
                row.bytes(1).map_err(err)?
            }
            _ => Vec::new(),
        };
        Ok(Some(Leader::new(FencingToken::new(term), proposal)))
    }
}
