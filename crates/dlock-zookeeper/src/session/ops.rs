//! What the recipes build from the counted calls: a call retried through connection losses,
//! a listing that treats a missing node as empty, parents created as containers, and the
//! deletes that must happen (Curator's guaranteed delete, and the delete of a node known only
//! by its protection prefix).

use std::future::Future;
use std::time::Duration;

use dlock_core::Result;
use dlock_core::backend::Backoff;
use zookeeper_client as zk;

use super::Session;
use crate::error::{from_zk, is_transient};

type ZkResult<T> = std::result::Result<T, zk::Error>;

/// How many times a read or a create is retried after a transient error.
const RETRIES: u32 = 6;
/// First pause before a retry; doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// The most nodes [`Session::ensure_parents`] creates: a name has at most 128 segments (255
/// bytes), so every valid name fits below it.
const MAX_PARENTS: usize = 256;

impl Session {
    /// Runs `call` again after transient errors (the client reconnects by itself), a few
    /// times with a growing pause.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut call: F) -> ZkResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ZkResult<T>>,
    {
        let mut pause = Backoff::new(RETRY_MIN, RETRY_MAX);
        let mut tries = 0;
        loop {
            match call().await {
                Err(e) if is_transient(&e) && tries < RETRIES => {
                    tries += 1;
                    tracing::debug!(error = %e, "zookeeper call failed; retrying");
                    pause.wait().await;
                }
                other => return other,
            }
        }
    }

    /// The children of `dir`, none if there is no such node, retrying transient errors.
    pub(crate) async fn list(&self, dir: &str) -> Result<Vec<String>> {
        match self.retrying(|| self.children(dir)).await {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(from_zk(&format!("list {dir}"), e)),
        }
    }

    /// Creates `dir` and its missing ancestors as CONTAINER nodes (Curator's
    /// `creatingParentContainersIfNeeded`).
    pub(crate) async fn ensure_parents(&self, dir: &str) -> ZkResult<()> {
        let mut stack = vec![dir.to_owned()];
        while let Some(path) = stack.last().cloned() {
            match self
                .retrying(|| self.create(&path, zk::CreateMode::Container))
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => {
                    stack.pop();
                }
                Err(zk::Error::NoNode) => match crate::nodes::parent(&path) {
                    Some(p) if stack.len() < MAX_PARENTS => stack.push(p.to_owned()),
                    _ => return Err(zk::Error::NoNode),
                },
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Deletes `path`, retrying transient errors until done or the session is gone (Curator's
    /// guaranteed delete). `Ok(false)`: there was no such node (and no earlier try of ours can
    /// have deleted it).
    pub(crate) async fn delete_guaranteed(&self, path: &str) -> ZkResult<bool> {
        let mut pause = Backoff::new(RETRY_MIN, RETRY_MAX);
        // Whether an earlier try may have deleted it and only its answer was lost: then a
        // NoNode is our own delete, not a loss (Curator ignores NoNode here). Only within one
        // session: a node gone with an expired session was lost, not deleted.
        let mut maybe_applied = false;
        let session = self.client().session_id().0;
        loop {
            match self.delete(path).await {
                Ok(()) => return Ok(true),
                Err(zk::Error::NoNode) => {
                    return Ok(maybe_applied && self.client().session_id().0 == session);
                }
                Err(e) if is_transient(&e) => {
                    maybe_applied = true;
                    tracing::debug!(path, error = %e, "delete failed; retrying");
                    pause.wait().await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Finds the nodes `dir/{prefix}...` by their protection prefix and deletes them: the
    /// cleanup of a create whose answer was never seen. Every node with the prefix goes: a
    /// create retried after a lost answer can have left two.
    pub(crate) async fn delete_by_prefix(&self, dir: &str, prefix: &str) -> ZkResult<bool> {
        let mut pause = Backoff::new(RETRY_MIN, RETRY_MAX);
        loop {
            match self.children(dir).await {
                Ok(children) => {
                    let mut deleted = false;
                    for node in children.iter().filter(|c| c.starts_with(prefix)) {
                        deleted |= self.delete_guaranteed(&format!("{dir}/{node}")).await?;
                    }
                    return Ok(deleted);
                }
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) if is_transient(&e) => {
                    pause.wait().await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
