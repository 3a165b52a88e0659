//! The mutex: Curator's `InterProcessMutex` layout, for reentrant and non-reentrant handles
//! alike (re-entry is the core's, so each acquisition is a node of its own).

use std::sync::Arc;

use dlock_core::backend::{RawLock, Request};
use dlock_core::{LockGuard, LockName, Result, async_trait};

use crate::contend::{Recipe, Role, exclusive};
use crate::kinds::{Apart, LOCK_MARKERS};
use crate::nodes::LOCK;
use crate::session::Session;

/// The raw mutex of a [`ZkProvider`](crate::ZkProvider): Curator's `InterProcessMutex`
/// layout. A `reentrant(false)` handle uses it too, so every mutex of a name excludes every
/// other (Curator's non-reentrant `InterProcessSemaphoreMutex`, a one-lease semaphore, is a
/// semaphore to dlock).
///
/// One acquisition at `path` creates `_c_{uuid}-lock-{seq}` and holds when first among every
/// lock node of the name (mutex, read and write nodes alike), else watches the predecessor.
#[derive(Debug)]
pub struct ZkMutex {
    session: Arc<Session>,
    path: String,
}

impl ZkMutex {
    /// The mutex whose nodes live under `path`.
    pub(crate) fn new(session: &Arc<Session>, path: String) -> Self {
        Self {
            session: Arc::clone(session),
            path,
        }
    }
}

#[async_trait]
impl RawLock for ZkMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        exclusive(&self.session, recipe(req.name, &self.path), req).await
    }
}

/// The mutex's recipe for `name`, its nodes under `dir`.
pub(crate) fn recipe<'a>(name: &'a LockName, dir: &'a str) -> Recipe<'a> {
    Recipe {
        name,
        dir,
        marker: LOCK,
        markers: LOCK_MARKERS,
        role: Role::Exclusive,
        apart: Apart::FromSemaphore,
        then_list: None,
        data: &[],
    }
}
