//! The mutex: Curator's `InterProcessMutex` (reentrant; re-entry is local) or, with
//! `reentrant(false)`, Curator's `InterProcessSemaphoreMutex` (a one-lease semaphore).

use std::sync::Arc;

use dlock_core::backend::{Deadline, RawLock, Request};
use dlock_core::{LockGuard, LockKind, LockName, LockOptions, Result, async_trait};

use crate::hold::{NodeUndo, Recipe, Role, contend, grant};
use crate::nodes::LOCK;
use crate::semaphore;
use crate::session::Session;

/// One `InterProcessMutex` acquisition at `path`: create `_c_{uuid}-lock-{seq}`, hold when
/// first, else watch the predecessor.
pub(crate) async fn acquire_mutex(
    session: &Arc<Session>,
    name: &LockName,
    path: &str,
    options: &LockOptions,
    deadline: Deadline,
) -> Result<Option<LockGuard>> {
    let mut undo = NodeUndo::new(session);
    let recipe = Recipe {
        dir: path,
        marker: LOCK,
        markers: &[LOCK],
        role: Role::Exclusive,
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

/// A mutex: Curator's `InterProcessMutex` (re-entry is the core's, so each call is one node),
/// or with `reentrant(false)` Curator's `InterProcessSemaphoreMutex`.
#[derive(Debug)]
pub(crate) struct ZkMutex {
    pub(crate) session: Arc<Session>,
    pub(crate) path: String,
}

#[async_trait]
impl RawLock for ZkMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        if req.options.reentrant {
            acquire_mutex(
                &self.session,
                req.name,
                &self.path,
                req.options,
                req.deadline,
            )
            .await
        } else {
            semaphore::acquire_lease(
                &self.session,
                req.name,
                &self.path,
                1,
                LockKind::Mutex,
                req.options,
                req.deadline,
            )
            .await
        }
    }
}
