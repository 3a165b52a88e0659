//! The election: the layout of Curator's `LeaderLatch`. A campaigner creates
//! `{path}/_c_{uuid}-latch-{seq}` (EPHEMERAL_SEQUENTIAL) with its proposal as the data (a
//! latch participant's id); the node first by sequence leads, and its creation zxid is the
//! term (the fencing token). Curator's `LeaderLatch` on the same path campaigns beside dlock,
//! and its `getLeader()` reads a dlock leader's proposal as the participant's id. Latch nodes
//! and lock nodes ignore each other: an election and a lock of one name are apart, as they
//! are in Curator.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{RawElection, Request};
use dlock_core::{Error, FencingToken, Leader, LockGuard, Result, async_trait};
use zookeeper_client as zk;

use crate::contend::{Recipe, Role, exclusive};
use crate::error::from_zk;
use crate::kinds::Apart;
use crate::nodes::{self, LATCH};
use crate::session::Session;

/// How many times a read of the leader starts over when the first node went between the
/// listing and the read of its data.
const REREADS: usize = 5;

/// The longest an observer waits on the watches before it asks again: a watch is lost with
/// its connection, and the next look sets it again.
const WATCH_AT_MOST: Duration = Duration::from_secs(1);

/// The raw election of a [`ZkProvider`](crate::ZkProvider) at one path.
#[derive(Debug)]
pub struct ZkElection {
    session: Arc<Session>,
    path: String,
}

impl ZkElection {
    /// The election whose nodes live under `path`.
    pub(crate) fn new(session: &Arc<Session>, path: String) -> Self {
        Self {
            session: Arc::clone(session),
            path,
        }
    }

    /// The leader's node: its path, data and stat; `None` when nobody campaigns.
    async fn first(&self) -> Result<Option<(String, Vec<u8>, zk::Stat)>> {
        for _ in 0..REREADS {
            let sorted = nodes::contenders(self.session.list(&self.path).await?, &[LATCH]);
            let Some(first) = sorted.first() else {
                return Ok(None);
            };
            let node = format!("{}/{}", self.path, first.node);
            match self
                .session
                .retrying(|| self.session.data_and_stat(&node))
                .await
            {
                Ok((data, stat)) => return Ok(Some((node, data, stat))),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(from_zk(&format!("read {node}"), e)),
            }
        }
        Err(Error::backend_failed(
            crate::BACKEND,
            format!(
                "the leader of {} changed {REREADS} times while it was read",
                self.path
            ),
            true,
        ))
    }

    fn not_leader(&self) -> Error {
        Error::lock_lost(&self.path)
    }
}

#[async_trait]
impl RawElection for ZkElection {
    async fn campaign(&self, req: &Request<'_>, proposal: &[u8]) -> Result<Option<LockGuard>> {
        let recipe = Recipe {
            name: req.name,
            dir: &self.path,
            marker: LATCH,
            markers: &[LATCH],
            role: Role::Exclusive,
            apart: Apart::FromSemaphore,
            then_list: None,
            data: proposal,
        };
        exclusive(&self.session, recipe, req).await
    }

    /// Sets the leader's node's data, at the version just read: only while the first node is
    /// the one created in this term.
    async fn proclaim(&self, leadership: &LockGuard, proposal: &[u8]) -> Result<()> {
        let term = leadership.fencing_token().get();
        for _ in 0..REREADS {
            let Some((node, _, stat)) = self.first().await? else {
                return Err(self.not_leader());
            };
            if u64::try_from(stat.czxid).ok() != Some(term) {
                return Err(self.not_leader());
            }
            match self.session.set_data(&node, proposal, stat.version).await {
                Ok(()) => return Ok(()),
                // Set by another proclaim of this leadership meanwhile: read again.
                Err(zk::Error::BadVersion) => {}
                Err(zk::Error::NoNode) => return Err(self.not_leader()),
                Err(e) => return Err(from_zk(&format!("proclaim at {node}"), e)),
            }
        }
        Err(Error::backend_failed(
            crate::BACKEND,
            format!("the proposal at {} kept changing", self.path),
            true,
        ))
    }

    async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.first().await?.and_then(|(_, data, stat)| {
            let term = u64::try_from(stat.czxid).ok()?;
            Some(Leader::new(FencingToken::new(term), data))
        }))
    }

    /// Watches the children of the election (a new first node, the leader's going) and the
    /// leader's node (a proclaim), for at most a second (a watch is lost with its connection).
    /// The leader read with the watches set is compared with `seen` first: a change between
    /// the caller's read and the watches is not waited for.
    async fn changed(&self, seen: Option<&Leader>) -> Result<()> {
        let watched = async {
            let Ok((children, on_children)) = self.session.children_watch(&self.path).await else {
                // No election node yet: a campaigner's create is what comes next.
                return tokio::time::sleep(dlock_core::backend::POLL).await;
            };
            let sorted = nodes::contenders(children, &[LATCH]);
            let Some(first) = sorted.first() else {
                if seen.is_none() {
                    on_children.changed().await;
                }
                return;
            };
            let node = format!("{}/{}", self.path, first.node);
            let Ok((data, stat, on_data)) = self.session.data_and_watch(&node).await else {
                // The leader's node went meanwhile: a change.
                return;
            };
            let now = u64::try_from(stat.czxid)
                .ok()
                .map(|term| Leader::new(FencingToken::new(term), data));
            if now.as_ref() != seen {
                return;
            }
            tokio::select! {
                _ = on_children.changed() => {}
                _ = on_data.changed() => {}
            }
        };
        let _ = tokio::time::timeout(WATCH_AT_MOST, watched).await;
        Ok(())
    }
}
