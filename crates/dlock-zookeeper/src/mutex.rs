//! The mutex: Curator's `InterProcessMutex` layout, for reentrant and non-reentrant handles
//! alike (re-entry is the core's, so each acquisition is a node of its own).

use std::sync::Arc;

use dlock_core::backend::{Deadline, RawLock, Request};
use dlock_core::{LockGuard, LockKind, LockName, LockOptions, Result, async_trait};

use crate::hold::{Apart, LOCK_MARKERS, NodeUndo, Recipe, Role, contend, grant, persist};
use crate::nodes::LOCK;
use crate::session::Session;

/// One `InterProcessMutex` acquisition at `path`: create `_c_{uuid}-lock-{seq}`, hold when
/// first among every lock node of the name (mutex, read and write nodes alike), else watch the
/// predecessor.
pub(crate) async fn acquire_mutex(
    session: &Arc<Session>,
    name: &LockName,
    path: &str,
    options: &LockOptions,
    deadline: Deadline,
) -> Result<Option<LockGuard>> {
    let mut undo = NodeUndo::new(session);
    let recipe = Recipe {
        name,
        dir: path,
        marker: LOCK,
        markers: LOCK_MARKERS,
        role: Role::Exclusive,
        apart: Apart::FromSemaphore,
    };
    Ok(contend(session, recipe, deadline, &mut undo)
        .await?
        .map(|created| {
            grant(
                session,
                name,
                LockKind::Mutex,
                &created,
                options.lease,
                &mut undo,
            )
        }))
}

/// A mutex: Curator's `InterProcessMutex` layout. A `reentrant(false)` handle uses it too,
/// so every mutex of a name excludes every other (Curator's non-reentrant
/// `InterProcessSemaphoreMutex`, a one-lease semaphore, is a semaphore to dlock).
#[derive(Debug)]
pub(crate) struct ZkMutex {
    pub(crate) session: Arc<Session>,
    pub(crate) path: String,
}

#[async_trait]
impl RawLock for ZkMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        persist(req.name, req.deadline, || {
            acquire_mutex(
                &self.session,
                req.name,
                &self.path,
                req.options,
                req.deadline,
            )
        })
        .await
    }
}
