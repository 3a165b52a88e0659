//! The mutex: Curator's `InterProcessMutex` (reentrant; re-entry is local) or, with
//! `reentrant(false)`, Curator's `InterProcessSemaphoreMutex` (a one-lease semaphore).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    DistributedLock, Error, LockGuard, LockName, LockOptions, Reentrancy, Result, async_trait,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::BACKEND;
use crate::hold::{NodeUndo, Recipe, Role, contend, grant};
use crate::nodes::LOCK;
use crate::semaphore;
use crate::session::Session;

/// How long past the caller's deadline server calls may run before a timed acquisition gives
/// up on them (the wait itself ends at the deadline; this bounds a hung call).
const CALL_GRACE: Duration = Duration::from_secs(2);

pub(crate) fn deadline(wait: Duration) -> Option<Instant> {
    Some(Instant::now() + wait)
}

/// An unbounded wait returned nothing, which the loop never does; reported, not panicked on.
pub(crate) fn never_times_out(name: &LockName) -> Error {
    Error::unbounded_wait_ended(BACKEND, name)
}

/// Bounds a timed acquisition: `Ok(None)` once `deadline` plus [`CALL_GRACE`] has passed
/// (whatever it created is deleted in the background by its undo guard).
pub(crate) async fn bounded<F>(deadline: Option<Instant>, acquire: F) -> Result<Option<LockGuard>>
where
    F: Future<Output = Result<Option<LockGuard>>>,
{
    match deadline {
        None => acquire.await,
        Some(d) => {
            let limit = d.max(Instant::now()) + CALL_GRACE;
            tokio::time::timeout_at(limit, acquire)
                .await
                .unwrap_or(Ok(None))
        }
    }
}

/// One `InterProcessMutex` acquisition at `path`: create `_c_{uuid}-lock-{seq}`, hold when
/// first, else watch the predecessor.
pub(crate) async fn acquire_mutex(
    session: &Arc<Session>,
    name: &LockName,
    path: &str,
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<Option<LockGuard>> {
    let started = Instant::now();
    let mut undo = NodeUndo::new(session);
    let recipe = Recipe {
        dir: path,
        marker: LOCK,
        markers: &[LOCK],
        role: Role::Exclusive,
    };
    Ok(contend(session, recipe, deadline, &mut undo)
        .await?
        .map(|created| grant(session, name, &created, options.lease, started, &mut undo)))
}

/// A mutex handle.
#[derive(Debug)]
pub(crate) struct ZkLock {
    session: Arc<Session>,
    name: LockName,
    path: String,
    options: LockOptions,
    reentrancy: Reentrancy,
}

impl ZkLock {
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
            reentrancy: Reentrancy::new(),
        }
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, lock = %self.name);
        async {
            if self.options.reentrant {
                let remote = || {
                    bounded(
                        deadline,
                        acquire_mutex(
                            &self.session,
                            &self.name,
                            &self.path,
                            &self.options,
                            deadline,
                        ),
                    )
                };
                self.reentrancy.acquire(deadline, remote).await
            } else {
                bounded(
                    deadline,
                    semaphore::acquire_lease(
                        &self.session,
                        &self.name,
                        &self.path,
                        1,
                        &self.options,
                        deadline,
                    ),
                )
                .await
            }
        }
        .instrument(span)
        .await
    }
}

#[async_trait]
impl DistributedLock for ZkLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn options(&self) -> &LockOptions {
        &self.options
    }

    fn store_id(&self) -> &str {
        &self.session.store_id
    }

    async fn acquire(&self) -> Result<LockGuard> {
        self.acquire_until(None)
            .await?
            .ok_or_else(|| never_times_out(&self.name))
    }

    async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(deadline(wait)).await
    }
}
