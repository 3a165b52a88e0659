//! The election's proposals: the mutex of the name (in the provider's strategy) leads (the
//! core's [`PostedElection`]), and the leader's proposal is kept in `<t>_elections` (name,
//! term, proposal). A post never replaces the proposal of a later term. A reader takes the
//! proposal only when its term is the lock's last token and the lock is held, so a proposal
//! outlived by its term is never the leader's.

use std::sync::Arc;

use dlock_core::backend::{PostedElection, ProposalBoard};
use dlock_core::{FencingToken, Leader, LockName, Result, async_trait};

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

/// The raw election of one name: the mutex of that name (a lock and a campaign there
/// exclude each other) and its proposals.
pub type SqlElection = PostedElection<SqlMutex, SqlProposals>;

/// The proposals of one name's election.
#[derive(Debug)]
pub struct SqlProposals {
    pub(crate) strategy: Arc<dyn LockStrategy>,
    pub(crate) inner: Arc<Inner>,
    pub(crate) sql: Arc<ElectionSql>,
    pub(crate) name: LockName,
}

impl SqlProposals {
    /// The term of the lock's holder now, if it is held.
    async fn term(&self) -> Result<Option<u64>> {
        let status = self.strategy.describe(&self.name).await?;
        Ok(status.last_token.filter(|_| status.is_held()))
    }
}

#[async_trait]
impl ProposalBoard for SqlProposals {
    /// Posts, then asks whether the lock is still held in this term. On the pinned strategies
    /// a new holder's token moves just after its grant, so the term alone cannot tell the
    /// poster from the next holder for that moment: the core then asks the hold itself
    /// ([`LockGuard::verify`](dlock_core::LockGuard::verify)), which those strategies answer
    /// from the server's session.
    async fn post(&self, term: FencingToken, proposal: &[u8]) -> Result<bool> {
        let posted = i64::try_from(term.get()).unwrap_or(i64::MAX);
        query(&self.sql.post)
            .bind(self.name.as_str().as_bytes())
            .bind(posted)
            .bind(proposal)
            .execute(&self.inner.pool)
            .await
            .map_err(self.inner.err("post the proposal"))?;
        Ok(self.term().await? == Some(term.get()))
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
