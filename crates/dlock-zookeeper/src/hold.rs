//! What every recipe shares: creating a protected sequential node, waiting for its turn with a
//! watch on one other node, undoing all of it when the acquisition is dropped, and the hold a
//! granted node becomes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::{
    Error, FencingToken, Hold, HoldSignal, Lease, LockGuard, LockName, NewHold, Result, async_trait,
};
use tokio::time::{Instant, timeout_at};
use zookeeper_client as zk;

use crate::BACKEND;
use crate::error::{for_hold, from_zk, is_transient, unexpected};
use crate::nodes::{self, Standing};
use crate::session::Session;

/// How many times an acquisition recreates its node after finding it gone (Curator retries
/// the same way when its node vanished, e.g. deleted by an operator).
const RECREATES: usize = 5;

/// How many times a create is retried after `NoNode` (parents missing, or a container parent
/// removed by the server in between).
const PARENT_RETRIES: usize = 8;

/// A node this acquisition created.
#[derive(Debug, Clone)]
pub(crate) struct Created {
    /// The full path.
    pub(crate) path: String,
    /// The node name (last segment).
    pub(crate) node: String,
    /// Its sequence, as the server formatted it.
    pub(crate) seq: String,
    /// Its creation zxid: the fencing token.
    pub(crate) czxid: i64,
}

#[derive(Debug)]
enum UndoState {
    Idle,
    /// A create with this protection prefix was sent and its answer not seen.
    Creating {
        dir: String,
        prefix: String,
    },
    /// This node exists.
    Created(String),
}

/// Deletes what an acquisition created if it is dropped (cancelled, timed out, failed) before
/// the node became a hold. The delete runs in the background and retries connection losses
/// until done or the session is gone.
#[derive(Debug)]
pub(crate) struct NodeUndo {
    session: Arc<Session>,
    state: UndoState,
}

impl NodeUndo {
    pub(crate) fn new(session: &Arc<Session>) -> Self {
        Self {
            session: Arc::clone(session),
            state: UndoState::Idle,
        }
    }

    /// A create of exactly `path` is about to be sent: delete that path if dropped.
    pub(crate) fn creating_exact(&mut self, path: &str) {
        self.state = UndoState::Created(path.to_owned());
    }

    /// The node is a hold now (or gone): nothing to undo.
    pub(crate) fn disarm(&mut self) {
        self.state = UndoState::Idle;
    }

    /// Undoes now and waits for it; if this future is dropped the undo still finishes in the
    /// background.
    pub(crate) async fn undo_now(&mut self) {
        let state = std::mem::replace(&mut self.state, UndoState::Idle);
        if let Some(task) = spawn_undo(&self.session, state) {
            let _ = task.await;
        }
    }
}

impl Drop for NodeUndo {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut self.state, UndoState::Idle);
        let _ = spawn_undo(&self.session, state);
    }
}

fn spawn_undo(session: &Arc<Session>, state: UndoState) -> Option<tokio::task::JoinHandle<()>> {
    if matches!(state, UndoState::Idle) {
        return None;
    }
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let session = Arc::clone(session);
    Some(runtime.spawn(async move {
        let result = match &state {
            UndoState::Idle => Ok(false),
            UndoState::Creating { dir, prefix } => session.delete_by_prefix(dir, prefix).await,
            UndoState::Created(path) => session.delete_guaranteed(path).await,
        };
        if let Err(e) = result {
            tracing::warn!(?state, error = %e, "could not delete the node of an abandoned acquisition; the session's end removes it");
        }
    }))
}

/// Creates `{dir}/{protected prefix}{marker}{seq}` as EPHEMERAL_SEQUENTIAL, creating missing
/// parents as containers, and after a connection loss finds the node by its protected prefix
/// instead of creating a second one (Curator's protection mode).
pub(crate) async fn create_protected(
    session: &Session,
    dir: &str,
    marker: &str,
    undo: &mut NodeUndo,
) -> Result<Created> {
    let prefix = nodes::protected_prefix();
    let base = format!("{dir}/{prefix}{marker}");
    undo.state = UndoState::Creating {
        dir: dir.to_owned(),
        prefix: prefix.clone(),
    };
    let mut parent_tries = 0;
    let mut losses = 0;
    loop {
        match session
            .create(&base, zk::CreateMode::EphemeralSequential)
            .await
        {
            Ok((stat, seq)) => {
                let seq = seq.to_string();
                let node = format!("{prefix}{marker}{seq}");
                let path = format!("{dir}/{node}");
                undo.state = UndoState::Created(path.clone());
                return Ok(Created {
                    path,
                    node,
                    seq,
                    czxid: stat.czxid,
                });
            }
            Err(zk::Error::NoNode) if parent_tries < PARENT_RETRIES => {
                parent_tries += 1;
                session
                    .ensure_parents(dir)
                    .await
                    .map_err(|e| from_zk(&format!("create parents of {dir}"), e))?;
            }
            Err(e) if is_transient(&e) && losses < 6 => {
                losses += 1;
                tokio::time::sleep(Duration::from_millis(20 << losses)).await;
                if let Some(found) = find_protected(session, dir, &prefix).await? {
                    undo.state = UndoState::Created(found.path.clone());
                    return Ok(found);
                }
            }
            Err(e) => return Err(from_zk(&format!("create {base}"), e)),
        }
    }
}

/// Looks for our node by its protected prefix after a create whose answer was lost.
async fn find_protected(session: &Session, dir: &str, prefix: &str) -> Result<Option<Created>> {
    let children = match session.retrying(|| session.children(dir)).await {
        Ok(c) => c,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(from_zk(&format!("list {dir}"), e)),
    };
    let Some(node) = children.into_iter().find(|c| c.starts_with(prefix)) else {
        return Ok(None);
    };
    let path = format!("{dir}/{node}");
    let stat = match session.retrying(|| session.exists(&path)).await {
        Ok(Some(stat)) => stat,
        Ok(None) => return Ok(None),
        Err(e) => return Err(from_zk(&format!("stat {path}"), e)),
    };
    let seq = node
        .rfind(|c: char| !c.is_ascii_digit())
        .map(|i| node[i + 1..].to_owned())
        .ok_or_else(|| unexpected(format!("protected node {path} has no sequence")))?;
    Ok(Some(Created {
        path,
        node,
        seq,
        czxid: stat.czxid,
    }))
}

/// How a contender decides it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Mutex, writer, the semaphore's internal lock: first among all contenders.
    Exclusive,
    /// Reader: no writer before it.
    Reader,
}

/// One kind of contender of a recipe: the directory its nodes live in, its own marker, the
/// markers of every node that competes with it, and its role.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recipe<'a> {
    pub(crate) dir: &'a str,
    pub(crate) marker: &'static str,
    pub(crate) markers: &'static [&'static str],
    pub(crate) role: Role,
}

/// Creates a node for `recipe` and waits until it holds, or until `deadline` (then the node
/// is deleted and `Ok(None)` returned). Each waiter watches exactly one node (its predecessor,
/// or a reader's first writer), so one release wakes one waiter.
///
/// The node is left to `undo` (still armed) on success: the caller disarms it when the node
/// becomes a hold.
pub(crate) async fn contend(
    session: &Session,
    recipe: Recipe<'_>,
    deadline: Option<Instant>,
    undo: &mut NodeUndo,
) -> Result<Option<Created>> {
    for _ in 0..RECREATES {
        let ours = create_protected(session, recipe.dir, recipe.marker, undo).await?;
        loop {
            let children = match session.retrying(|| session.children(recipe.dir)).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => break,
                Err(e) => return Err(from_zk(&format!("list {}", recipe.dir), e)),
            };
            let sorted = nodes::contenders(children, recipe.markers);
            let standing = match recipe.role {
                Role::Exclusive => nodes::exclusive_standing(&sorted, &ours.node),
                Role::Reader => nodes::reader_standing(&sorted, &ours.node),
            };
            let watch = match standing {
                Standing::Granted => return Ok(Some(ours)),
                Standing::Missing => break,
                Standing::Watch(node) => format!("{}/{node}", recipe.dir),
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                undo.undo_now().await;
                return Ok(None);
            }
            let watcher = match session.retrying(|| session.data_watch(&watch)).await {
                Ok(w) => w,
                // Gone between the listing and the watch: look again at once.
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(from_zk(&format!("watch {watch}"), e)),
            };
            match deadline {
                None => {
                    watcher.changed().await;
                }
                Some(d) => {
                    if timeout_at(d, watcher.changed()).await.is_err() {
                        undo.undo_now().await;
                        return Ok(None);
                    }
                }
            }
            session.woken();
        }
        tracing::debug!(node = %ours.path, "our node is gone; creating a new one");
        undo.disarm();
    }
    Err(unexpected(format!(
        "the node of an acquisition under {} kept disappearing",
        recipe.dir
    )))
}

/// The backend side of a hold: one node (a lock, read, write or lease node) to delete.
#[derive(Debug)]
pub(crate) struct ZkHold {
    session: Arc<Session>,
    name: LockName,
    path: String,
    registration: u64,
    /// When the lease ends as far as this hold knows (moved by renewals): a hold dropped
    /// without release (leaked) is deleted then, as if its lease ran out on a server.
    lease_end: Mutex<Instant>,
    released: AtomicBool,
}

/// Turns a granted node into a guard, disarming `undo`, with no await in between.
pub(crate) fn grant(
    session: &Arc<Session>,
    name: &LockName,
    created: &Created,
    lease: Lease,
    started: Instant,
    undo: &mut NodeUndo,
) -> LockGuard {
    undo.disarm();
    let signal = HoldSignal::new();
    let registration = session.register(name, &signal);
    let hold = ZkHold {
        session: Arc::clone(session),
        name: name.clone(),
        path: created.path.clone(),
        registration,
        lease_end: Mutex::new(started + lease.ttl()),
        released: AtomicBool::new(false),
    };
    LockGuard::new(NewHold::new(
        BACKEND,
        name.clone(),
        FencingToken::new(u64::try_from(created.czxid).unwrap_or(0)),
        lease,
        started,
        Arc::new(hold),
        signal,
    ))
}

#[async_trait]
impl Hold for ZkHold {
    async fn release(&self) -> Result<()> {
        self.released.store(true, Ordering::SeqCst);
        self.session.unregister(self.registration);
        let limit = self.session.config.session_timeout;
        match tokio::time::timeout(limit, self.session.delete_guaranteed(&self.path)).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(Error::lock_lost(&self.name)),
            Ok(Err(e)) => Err(for_hold(&self.name, &format!("delete {}", self.path), e)),
            Err(_elapsed) => {
                // Keep trying in the background until the server answers or the session ends.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let session = Arc::clone(&self.session);
                    let path = self.path.clone();
                    runtime.spawn(async move {
                        let _ = session.delete_guaranteed(&path).await;
                    });
                }
                Err(from_zk(
                    &format!("delete {} (still retrying in the background)", self.path),
                    zk::Error::ConnectionLoss,
                ))
            }
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let started = Instant::now();
        match self.session.exists(&self.path).await {
            Ok(Some(_)) => {
                *self
                    .lease_end
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = started + ttl;
                Ok(())
            }
            Ok(None) => Err(Error::lock_lost(&self.name)),
            Err(e) => Err(for_hold(&self.name, &format!("exists {}", self.path), e)),
        }
    }
}

impl Drop for ZkHold {
    fn drop(&mut self) {
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        self.session.unregister(self.registration);
        // Leaked: nobody renews it any more. End it when its lease would have run out.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = Arc::clone(&self.session);
        let path = std::mem::take(&mut self.path);
        let end = *self
            .lease_end
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        runtime.spawn(async move {
            tokio::time::sleep_until(end).await;
            if let Err(e) = session.delete_guaranteed(&path).await {
                tracing::debug!(path, error = %e, "could not delete a leaked hold; the session's end removes it");
            }
        });
    }
}
