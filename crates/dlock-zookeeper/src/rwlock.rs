//! The read-write lock: Curator's `InterProcessReadWriteLock` layout, with a downgrade that
//! stays correct after the write is released (the CURATOR-621 fix of Curator 5.5).

use std::sync::{Arc, Mutex, PoisonError};

use dlock_core::backend::{Deadline, RawReadWriteLock, Request};
use dlock_core::{LockGuard, LockKind, LockName, LockOptions, Result, async_trait};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::from_zk;
use crate::hold::{Apart, Created, LOCK_MARKERS, NodeUndo, Recipe, Role, contend, grant, persist};
use crate::nodes::{self, READ, WRITE};
use crate::session::Session;

/// A read-write lock.
#[derive(Debug)]
pub(crate) struct ZkReadWrite {
    pub(crate) session: Arc<Session>,
    pub(crate) path: String,
    /// This owner's current write node, for downgrades.
    pub(crate) write_node: Mutex<Option<WriteNode>>,
}

/// The write node a downgrade reads under.
#[derive(Debug, Clone)]
pub(crate) struct WriteNode {
    seq: String,
    path: String,
    czxid: i64,
}

impl ZkReadWrite {
    /// Readers and writers queue with the name's mutex nodes, which count as writers.
    fn recipe<'a>(&'a self, name: &'a LockName, marker: &'static str, role: Role) -> Recipe<'a> {
        Recipe {
            name,
            dir: &self.path,
            marker,
            markers: LOCK_MARKERS,
            role,
            apart: Apart::FromSemaphore,
        }
    }

    /// A read hold for the owner of the write hold: a plain EPHEMERAL node
    /// `_c_{uuid}-__READ__{writer's sequence}`, which sorts at the writer's place, so that
    /// after the write is released no writer queued behind it gets in while this read lasts.
    ///
    /// The write node must still exist once the read node does (review H1): a writer queued
    /// behind it is only granted after seeing it deleted, and so then sees this read node too.
    /// If it is gone (released by another task of this owner, or expired meanwhile), the read
    /// node is removed and `None` says: contend as a plain reader. The read's fencing token is
    /// the write's (review M2): a writer queued behind the write has a later one.
    async fn downgrade(
        &self,
        name: &LockName,
        options: &LockOptions,
        write: &WriteNode,
    ) -> Result<Option<LockGuard>> {
        let writer_seq = &write.seq;
        let mut undo = NodeUndo::new(&self.session);
        let node = format!("{}{READ}{writer_seq}", nodes::protected_prefix());
        let path = format!("{}/{node}", self.path);
        undo.creating_exact(&path);
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
                undo.undo_now().await;
                return Ok(None);
            }
            Err(e) => {
                undo.undo_now().await;
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
            self.write_node
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        } else {
            None
        };
        if let Some(write) = write
            && let Some(guard) = self.downgrade(name, options, &write).await?
        {
            return Ok(Some(guard));
        }
        let mut undo = NodeUndo::new(&self.session);
        let granted = contend(
            &self.session,
            self.recipe(name, READ, Role::Reader),
            deadline,
            &mut undo,
        )
        .await?;
        Ok(granted.map(|c| {
            grant(
                &self.session,
                name,
                LockKind::Read,
                &c,
                options.lease,
                &mut undo,
            )
        }))
    }

    async fn write_remote(
        &self,
        name: &LockName,
        options: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<LockGuard>> {
        let mut undo = NodeUndo::new(&self.session);
        let granted = contend(
            &self.session,
            self.recipe(name, WRITE, Role::Exclusive),
            deadline,
            &mut undo,
        )
        .await?;
        Ok(granted.map(|c| {
            *self
                .write_node
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(WriteNode {
                seq: c.seq.clone(),
                path: c.path.clone(),
                czxid: c.czxid,
            });
            grant(
                &self.session,
                name,
                LockKind::Write,
                &c,
                options.lease,
                &mut undo,
            )
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
