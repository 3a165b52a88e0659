//! The read-write lock: Curator's `InterProcessReadWriteLock` layout, with a downgrade that
//! stays correct after the write is released (the CURATOR-621 fix of Curator 5.5).

use std::sync::Arc;

use dlock_core::backend::{Deadline, Mutex, RawReadWriteLock, Request};
use dlock_core::{LockGuard, LockKind, LockName, LockOptions, Result, async_trait};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::contend::{Recipe, Role, acquire, persist};
use crate::create::Created;
use crate::error::from_zk;
use crate::hold::grant;
use crate::kinds::{Apart, LOCK_MARKERS};
use crate::nodes::{self, READ, WRITE};
use crate::session::Session;
use crate::undo::{self, Armed};

/// The raw read-write lock of a [`ZkProvider`](crate::ZkProvider): Curator's
/// `InterProcessReadWriteLock` layout, `__READ__` and `__WRIT__` nodes queued with the name's
/// mutex nodes (which count as writers).
#[derive(Debug)]
pub struct ZkReadWrite {
    session: Arc<Session>,
    path: String,
    /// This owner's current write node, for downgrades.
    write_node: Mutex<Option<WriteNode>>,
}

/// The write node a downgrade reads under.
#[derive(Debug, Clone)]
struct WriteNode {
    seq: String,
    path: String,
    czxid: i64,
}

impl ZkReadWrite {
    /// The read-write lock whose nodes live under `path`.
    pub(crate) fn new(session: &Arc<Session>, path: String) -> Self {
        Self {
            session: Arc::clone(session),
            path,
            write_node: Mutex::new(None),
        }
    }

    /// One attempt for a node with `marker` in `role`, granted as `kind`. Readers and writers
    /// queue with the name's mutex nodes, which count as writers.
    async fn contend(
        &self,
        name: &LockName,
        options: &LockOptions,
        marker: &'static str,
        role: Role,
        kind: LockKind,
        deadline: Deadline,
    ) -> Result<Option<(LockGuard, Created)>> {
        let recipe = Recipe {
            name,
            dir: &self.path,
            marker,
            markers: LOCK_MARKERS,
            role,
            apart: Apart::FromSemaphore,
            then_list: None,
            data: &[],
        };
        acquire(&self.session, recipe, kind, options.lease, deadline).await
    }

    /// A read hold for the owner of the write hold: a plain EPHEMERAL node
    /// `_c_{uuid}-__READ__{writer's sequence}`, which sorts at the writer's place, so that
    /// after the write is released no writer queued behind it gets in while this read lasts.
    ///
    /// The write node must still exist once the read node does: a writer queued behind it is
    /// only granted after seeing it deleted, and so then sees this read node too. If it is
    /// gone (released by another task of this owner, or expired meanwhile), the read node is
    /// removed and `None` says: contend as a plain reader. The read's fencing token is the
    /// write's: a writer queued behind the write has a later one.
    async fn downgrade(
        &self,
        name: &LockName,
        options: &LockOptions,
        write: &WriteNode,
    ) -> Result<Option<LockGuard>> {
        let writer_seq = &write.seq;
        let mut undo = undo::node_undo(&self.session);
        let node = format!("{}{READ}{writer_seq}", nodes::protected_prefix());
        let path = format!("{}/{node}", self.path);
        undo.arm(Armed::Created(path.clone()));
        let sent = Instant::now();
        // The session the read node is created on; if it expires meanwhile, the grant below
        // is lost on arrival (a false loss at worst, never a hold on a dead session).
        let node_session = self.session.client().session_id().0;
        match self
            .session
            .retrying(|| self.session.create(&path, zk::CreateMode::Ephemeral))
            .await
        {
            Ok(_) => {}
            // The write is gone and its parent was reaped: contend as a plain reader.
            Err(zk::Error::NoNode) => return Ok(None),
            // A retried create whose first try was applied: the node is ours.
            Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(from_zk(&format!("create {path}"), e)),
        }
        match self
            .session
            .retrying(|| self.session.exists(&write.path))
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => {
                undo.run_now().await;
                return Ok(None);
            }
            Err(e) => {
                undo.run_now().await;
                return Err(from_zk(&format!("check {}", write.path), e));
            }
        }
        let created = Created {
            path,
            node,
            seq: writer_seq.clone(),
            czxid: write.czxid,
            session: node_session,
            granted: sent,
        };
        Ok(Some(grant(
            &self.session,
            name,
            LockKind::Read,
            &created,
            options.lease,
            &mut undo,
        )))
    }

    async fn read_remote(
        &self,
        name: &LockName,
        options: &LockOptions,
        downgrade: bool,
        deadline: Deadline,
    ) -> Result<Option<LockGuard>> {
        let write = if downgrade {
            self.write_node.lock().clone()
        } else {
            None
        };
        if let Some(write) = write
            && let Some(guard) = self.downgrade(name, options, &write).await?
        {
            return Ok(Some(guard));
        }
        let granted = self
            .contend(name, options, READ, Role::Reader, LockKind::Read, deadline)
            .await?;
        Ok(granted.map(|(guard, _)| guard))
    }

    async fn write_remote(
        &self,
        name: &LockName,
        options: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<LockGuard>> {
        let granted = self
            .contend(
                name,
                options,
                WRITE,
                Role::Exclusive,
                LockKind::Write,
                deadline,
            )
            .await?;
        Ok(granted.map(|(guard, created)| {
            *self.write_node.lock() = Some(WriteNode {
                seq: created.seq,
                path: created.path,
                czxid: created.czxid,
            });
            guard
        }))
    }
}

#[async_trait]
impl RawReadWriteLock for ZkReadWrite {
    async fn read(&self, req: &Request<'_>, downgrade: bool) -> Result<Option<LockGuard>> {
        persist(req.name, req.deadline, || {
            self.read_remote(req.name, req.options, downgrade, req.deadline)
        })
        .await
    }

    async fn write(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        persist(req.name, req.deadline, || {
            self.write_remote(req.name, req.options, req.deadline)
        })
        .await
    }
}
