//! The read-write lock: Curator's `InterProcessReadWriteLock` layout, with a downgrade that
//! stays correct after the write is released (the CURATOR-621 fix of Curator 5.5).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::{
    DistributedReadWriteLock, Error, LockGuard, LockName, LockOptions, Reentrancy, Result,
    async_trait,
};
use tokio::time::Instant;
use tracing::Instrument;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::error::from_zk;
use crate::hold::{Created, NodeUndo, Recipe, Role, contend, grant};
use crate::mutex::{bounded, deadline, never_times_out};
use crate::nodes::{self, READ, WRITE};
use crate::session::Session;

/// A read-write lock handle.
#[derive(Debug)]
pub(crate) struct ZkReadWriteLock {
    session: Arc<Session>,
    name: LockName,
    path: String,
    options: LockOptions,
    read: Reentrancy,
    write: Reentrancy,
    /// The sequence of this owner's current write node, for downgrades.
    write_seq: Mutex<Option<String>>,
}

impl ZkReadWriteLock {
    pub(crate) fn new(
        session: Arc<Session>,
        name: LockName,
        path: String,
        options: LockOptions,
    ) -> Self {
        Self {
            session,
            name,
            path,
            options,
            read: Reentrancy::new(),
            write: Reentrancy::new(),
            write_seq: Mutex::new(None),
        }
    }

    fn recipe(&self, marker: &'static str, role: Role) -> Recipe<'_> {
        Recipe {
            dir: &self.path,
            marker,
            markers: &[READ, WRITE],
            role,
        }
    }

    /// A read hold for the owner of the write hold: a plain EPHEMERAL node
    /// `_c_{uuid}-__READ__{writer's sequence}`, which sorts at the writer's place, so that
    /// after the write is released no writer queued behind it gets in while this read lasts.
    async fn downgrade(&self, writer_seq: &str) -> Result<Option<LockGuard>> {
        let started = Instant::now();
        let mut undo = NodeUndo::new(&self.session);
        let node = format!("{}{READ}{writer_seq}", nodes::protected_prefix());
        let path = format!("{}/{node}", self.path);
        undo.creating_exact(&path);
        let (stat, _) = self
            .session
            .create(&path, zk::CreateMode::Ephemeral)
            .await
            .map_err(|e| from_zk(&format!("create {path}"), e))?;
        let created = Created {
            path,
            node,
            seq: writer_seq.to_owned(),
            czxid: stat.czxid,
        };
        Ok(Some(grant(
            &self.session,
            &self.name,
            &created,
            self.options.lease,
            started,
            &mut undo,
        )))
    }

    async fn read_remote(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let writer_seq = if self.write.is_held() {
            self.write_seq
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        } else {
            None
        };
        if let Some(seq) = writer_seq {
            return self.downgrade(&seq).await;
        }
        let started = Instant::now();
        let mut undo = NodeUndo::new(&self.session);
        let granted = contend(
            &self.session,
            self.recipe(READ, Role::Reader),
            deadline,
            &mut undo,
        )
        .await?;
        Ok(granted.map(|c| {
            grant(
                &self.session,
                &self.name,
                &c,
                self.options.lease,
                started,
                &mut undo,
            )
        }))
    }

    async fn write_remote(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let started = Instant::now();
        let mut undo = NodeUndo::new(&self.session);
        let granted = contend(
            &self.session,
            self.recipe(WRITE, Role::Exclusive),
            deadline,
            &mut undo,
        )
        .await?;
        Ok(granted.map(|c| {
            *self
                .write_seq
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(c.seq.clone());
            grant(
                &self.session,
                &self.name,
                &c,
                self.options.lease,
                started,
                &mut undo,
            )
        }))
    }

    async fn read_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, lock = %self.name, mode = "read");
        let remote = || bounded(deadline, self.read_remote(deadline));
        self.read.acquire(deadline, remote).instrument(span).await
    }

    async fn write_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        if self.read.is_held() && !self.write.is_held() {
            return Err(Error::WouldDeadlock {
                name: self.name.to_string(),
                reason: "this handle holds the read lock; release it before asking for the \
                         write lock"
                    .into(),
            });
        }
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, lock = %self.name, mode = "write");
        let remote = || bounded(deadline, self.write_remote(deadline));
        self.write.acquire(deadline, remote).instrument(span).await
    }
}

#[async_trait]
impl DistributedReadWriteLock for ZkReadWriteLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn options(&self) -> &LockOptions {
        &self.options
    }

    fn store_id(&self) -> &str {
        &self.session.store_id
    }

    async fn read(&self) -> Result<LockGuard> {
        self.read_until(None)
            .await?
            .ok_or_else(|| never_times_out(&self.name))
    }

    async fn try_read(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.read_until(deadline(wait)).await
    }

    async fn write(&self) -> Result<LockGuard> {
        self.write_until(None)
            .await?
            .ok_or_else(|| never_times_out(&self.name))
    }

    async fn try_write(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.write_until(deadline(wait)).await
    }
}
