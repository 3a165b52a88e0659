//! The semaphore: Curator's `InterProcessSemaphoreV2` with a fixed number of leases. Also the
//! non-reentrant mutex (`InterProcessSemaphoreMutex` is a one-lease `InterProcessSemaphoreV2`).

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{DistributedSemaphore, LockGuard, LockName, LockOptions, Result, async_trait};
use tokio::time::{Instant, timeout_at};
use tracing::Instrument;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::error::{from_zk, unexpected};
use crate::hold::{NodeUndo, Recipe, Role, contend, create_protected, grant};
use crate::mutex::{bounded, deadline, never_times_out};
use crate::nodes::{self, LEASE, LEASES, LOCK, LOCKS};
use crate::session::Session;

/// How many times a lease is created anew after it vanished while waiting.
const RECREATES: usize = 5;

/// One lease of `permits` at `path`: take the internal mutex at `{path}/locks`, create
/// `{path}/leases/_c_{uuid}-lease-{seq}`, and while there are more leases than permits wait for
/// the leases to change (still holding the internal mutex, so only one waiter watches);
/// then release the internal mutex.
pub(crate) async fn acquire_lease(
    session: &Arc<Session>,
    name: &LockName,
    path: &str,
    permits: u32,
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<Option<LockGuard>> {
    let started = Instant::now();
    let locks = format!("{path}/{LOCKS}");
    let leases = format!("{path}/{LEASES}");
    let mut internal = NodeUndo::new(session);
    let recipe = Recipe {
        dir: &locks,
        marker: LOCK,
        markers: &[LOCK],
        role: Role::Exclusive,
    };
    if contend(session, recipe, deadline, &mut internal)
        .await?
        .is_none()
    {
        return Ok(None);
    }
    let result = take_lease(session, name, &leases, permits, options, deadline, started).await;
    // Release the internal mutex (left armed in `internal` by `contend`).
    internal.undo_now().await;
    result
}

async fn take_lease(
    session: &Arc<Session>,
    name: &LockName,
    leases: &str,
    permits: u32,
    options: &LockOptions,
    deadline: Option<Instant>,
    started: Instant,
) -> Result<Option<LockGuard>> {
    let permits = usize::try_from(permits).unwrap_or(usize::MAX);
    let mut undo = NodeUndo::new(session);
    for _ in 0..RECREATES {
        let ours = create_protected(session, leases, LEASE, &mut undo).await?;
        loop {
            let (children, watcher) =
                match session.retrying(|| session.children_watch(leases)).await {
                    Ok(found) => found,
                    Err(zk::Error::NoNode) => break,
                    Err(e) => return Err(from_zk(&format!("list {leases}"), e)),
                };
            if !children.contains(&ours.node) {
                break;
            }
            let count = children
                .iter()
                .filter(|c| nodes::sequence(c, LEASE).is_some())
                .count();
            if count <= permits {
                return Ok(Some(grant(
                    session,
                    name,
                    &ours,
                    options.lease,
                    started,
                    &mut undo,
                )));
            }
            match deadline {
                Some(d) if Instant::now() >= d => {
                    undo.undo_now().await;
                    return Ok(None);
                }
                Some(d) => {
                    if timeout_at(d, watcher.changed()).await.is_err() {
                        undo.undo_now().await;
                        return Ok(None);
                    }
                }
                None => {
                    watcher.changed().await;
                }
            }
            session.woken();
        }
        undo.disarm();
    }
    Err(unexpected(format!(
        "the lease node of an acquisition under {leases} kept disappearing"
    )))
}

/// A semaphore handle.
#[derive(Debug)]
pub(crate) struct ZkSemaphore {
    session: Arc<Session>,
    name: LockName,
    path: String,
    permits: u32,
    options: LockOptions,
}

impl ZkSemaphore {
    pub(crate) fn new(
        session: Arc<Session>,
        name: LockName,
        path: String,
        permits: u32,
        options: LockOptions,
    ) -> Self {
        Self {
            session,
            name,
            path,
            permits,
            options,
        }
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("dlock.acquire", backend = BACKEND, semaphore = %self.name);
        bounded(
            deadline,
            acquire_lease(
                &self.session,
                &self.name,
                &self.path,
                self.permits,
                &self.options,
                deadline,
            ),
        )
        .instrument(span)
        .await
    }
}

#[async_trait]
impl DistributedSemaphore for ZkSemaphore {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn permits(&self) -> u32 {
        self.permits
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
