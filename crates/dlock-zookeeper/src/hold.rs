//! What every recipe shares: creating a protected sequential node, waiting for its turn with a
//! watch on one other node, undoing all of it when the acquisition is dropped, and the hold a
//! granted node becomes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::future::Future;

use dlock_core::backend::{Backoff, Deadline, Hold, HoldSignal, NewHold, later};
use dlock_core::{
    Error, FencingToken, Lease, LockGuard, LockKind, LockName, LossReason, Result, async_trait,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::error::{for_hold, from_zk, is_transient, unexpected};
use crate::nodes::{self, LEASE, LEASES, LOCK, LOCKS, READ, Standing, WRITE};
use crate::session::Session;

/// How many times an acquisition recreates its node after finding it gone (Curator retries
/// the same way when its node vanished, e.g. deleted by an operator).
const RECREATES: usize = 5;

/// How many times a create is retried after `NoNode` (parents missing, or a container parent
/// removed by the server in between).
const PARENT_RETRIES: usize = 8;

/// How long a waiter that gives up at its deadline waits for the server to answer the delete
/// of its node, which is what confirms that the lock is still held (see [`give_up`]): below
/// the core's cut-off of a timed call (`CALL_GRACE`), so the backend gives its own answer.
const UNDO_GRACE: Duration = Duration::from_secs(1);

/// Pauses between attempts of an acquisition that failed with a retryable error.
const ATTEMPT_PAUSE_MIN: Duration = Duration::from_millis(50);
const ATTEMPT_PAUSE_MAX: Duration = Duration::from_secs(2);

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
    /// The session that owns it (its `ephemeralOwner`).
    pub(crate) session: i64,
    /// When the call that showed the node holds (the listing, or the create) was sent: the
    /// client's lease runs from there.
    pub(crate) granted: Instant,
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

    /// Undoes in the background.
    pub(crate) fn undo_in_background(&mut self) {
        let state = std::mem::replace(&mut self.state, UndoState::Idle);
        let _ = spawn_undo(&self.session, state);
    }

    /// Undoes now and waits at most `grace` for it (it finishes in the background otherwise):
    /// true if the server answered the undo's calls within `grace` (or there was nothing to
    /// undo).
    pub(crate) async fn undo_within(&mut self, grace: Duration) -> bool {
        let state = std::mem::replace(&mut self.state, UndoState::Idle);
        match spawn_undo(&self.session, state) {
            None => true,
            Some(task) => matches!(tokio::time::timeout(grace, task).await, Ok(Ok(true))),
        }
    }
}

impl Drop for NodeUndo {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut self.state, UndoState::Idle);
        let _ = spawn_undo(&self.session, state);
    }
}

/// Runs the undo of `state` in a task of its own; the task says whether the server answered
/// (the node is gone, or was not there).
fn spawn_undo(session: &Arc<Session>, state: UndoState) -> Option<tokio::task::JoinHandle<bool>> {
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
        if let Err(e) = &result {
            tracing::warn!(?state, error = %e, "could not delete the node of an abandoned acquisition; the session's end removes it");
        }
        result.is_ok()
    }))
}

/// Ends a wait that reached its deadline: deletes our node and says the lock is held
/// (`Ok(())`, the caller answers `Ok(None)`) only if the server answered that delete within
/// [`UNDO_GRACE`]. ZooKeeper sends a session's watch events before its answers to later
/// requests, so an answered delete with no event before it means the node we waited on was
/// still there. A session that is not connected, or a delete left unanswered, is a retryable
/// error: nothing says the lock is held. The delete then goes on in the background.
pub(crate) async fn give_up(session: &Session, undo: &mut NodeUndo, dir: &str) -> Result<()> {
    if !session.is_connected() {
        undo.undo_in_background();
        return Err(Error::no_answer(
            BACKEND,
            format!(
                "the wait under {dir} reached its deadline while the session to ZooKeeper was \
                 not connected: nothing says the lock is held"
            ),
        ));
    }
    if undo.undo_within(UNDO_GRACE).await {
        return Ok(());
    }
    Err(Error::no_answer(
        BACKEND,
        format!(
            "the wait under {dir} reached its deadline and the server did not answer within \
             {UNDO_GRACE:?}: nothing says the lock is held"
        ),
    ))
}

/// Whether the `failures`-th retryable failure in a row of one acquisition is logged as a
/// warning: the 5th, then the 10th, 20th, 40th … (fewer as an outage goes on).
fn worth_a_warning(failures: u32) -> bool {
    failures == 5
        || (failures >= 10 && failures.is_multiple_of(10) && (failures / 10).is_power_of_two())
}

/// Runs `attempt` (one acquisition) again after a retryable error while `deadline` allows,
/// with a growing pause: an unbounded `acquire()` waits out an outage, and a timed one
/// returns the last error at its deadline. A non-retryable error is returned at once.
pub(crate) async fn persist<F, Fut>(
    name: &LockName,
    deadline: Deadline,
    mut attempt: F,
) -> Result<Option<LockGuard>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<LockGuard>>>,
{
    let mut pause = Backoff::new(ATTEMPT_PAUSE_MIN, ATTEMPT_PAUSE_MAX);
    let mut failures = 0u32;
    loop {
        match attempt().await {
            Err(e) if e.is_retryable() && !deadline.has_passed() => {
                failures = failures.saturating_add(1);
                if worth_a_warning(failures) {
                    tracing::warn!(lock = %name, error = %e, failures, "zookeeper acquisition keeps failing; still retrying");
                } else {
                    tracing::debug!(lock = %name, error = %e, "zookeeper acquisition failed; retrying");
                }
                tokio::time::sleep_until(deadline.wake_after(pause.next_pause())).await;
                if deadline.has_passed() {
                    return Err(e);
                }
            }
            other => return other,
        }
    }
}

/// Creates `{dir}/{protected prefix}{marker}{seq}` as EPHEMERAL_SEQUENTIAL, creating missing
/// parents as containers, and after a connection loss finds the node by its protected prefix
/// instead of creating a second one (Curator's protection mode).
pub(crate) async fn create_protected(
    session: &Session,
    dir: &str,
    marker: &str,
    data: &[u8],
    undo: &mut NodeUndo,
) -> Result<Created> {
    Ok(create_listed(session, dir, marker, data, undo, &[])
        .await?
        .0)
}

/// [`create_protected`], with the children of each of `lists` asked for right behind the
/// create, in the same round trip: ZooKeeper answers a session's requests in the order they
/// were sent, so each listing sees the node. The listings come back only from the first
/// create, if it made the node (`None` for a listing that failed); otherwise the list is
/// empty and the caller lists for itself.
async fn create_listed(
    session: &Session,
    dir: &str,
    marker: &str,
    data: &[u8],
    undo: &mut NodeUndo,
    lists: &[&str],
) -> Result<(Created, Vec<Option<Vec<String>>>)> {
    let prefix = nodes::protected_prefix();
    let base = format!("{dir}/{prefix}{marker}");
    undo.state = UndoState::Creating {
        dir: dir.to_owned(),
        prefix: prefix.clone(),
    };
    let mut parent_tries = 0;
    let mut losses = 0;
    let mut lists = lists;
    loop {
        let sent = Instant::now();
        let mode = zk::CreateMode::EphemeralSequential;
        let (created, listed) = if lists.is_empty() {
            (session.create_with(&base, data, mode).await, Vec::new())
        } else {
            let (created, listed) = session.create_and_list(&base, data, mode, lists).await;
            (created, listed.into_iter().map(|l| l.ok()).collect())
        };
        lists = &[];
        match created {
            Ok((stat, seq)) => {
                let seq = seq.to_string();
                let node = format!("{prefix}{marker}{seq}");
                let path = format!("{dir}/{node}");
                undo.state = UndoState::Created(path.clone());
                let created = Created {
                    path,
                    node,
                    seq,
                    czxid: stat.czxid,
                    session: stat.ephemeral_owner,
                    granted: sent,
                };
                return Ok((created, listed));
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
                if let Some(found) = find_protected(session, dir, &prefix, marker).await? {
                    undo.state = UndoState::Created(found.path.clone());
                    return Ok((found, Vec::new()));
                }
            }
            Err(e) => return Err(from_zk(&format!("create {base}"), e)),
        }
    }
}

/// Looks for our node by its protected prefix after a create whose answer was lost.
async fn find_protected(
    session: &Session,
    dir: &str,
    prefix: &str,
    marker: &str,
) -> Result<Option<Created>> {
    let sent = Instant::now();
    // The client may have reconnected to a follower that has not applied our create yet:
    // catch it up first, or we would miss our node and create a second one (review M3b).
    match session.retrying(|| session.sync(dir)).await {
        Ok(()) => {}
        Err(zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(from_zk(&format!("sync {dir}"), e)),
    }
    let children = match session.retrying(|| session.children(dir)).await {
        Ok(c) => c,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(from_zk(&format!("list {dir}"), e)),
    };
    // Curator's protected mode (review M3): a node with our prefix counts only if the current
    // session owns it (one left by an earlier session is deleted: that session's expiry would
    // take it away under a live hold), and only one is kept (a second create after a lost
    // answer can leave two: the others are deleted, or one would wait on itself).
    let ours = session.client().session_id().0;
    let mut found = None;
    for node in children.into_iter().filter(|c| c.starts_with(prefix)) {
        let path = format!("{dir}/{node}");
        let stat = match session.retrying(|| session.exists(&path)).await {
            Ok(Some(stat)) => stat,
            Ok(None) => continue,
            Err(e) => return Err(from_zk(&format!("stat {path}"), e)),
        };
        if found.is_none() && stat.ephemeral_owner == ours {
            found = Some((path, node, stat));
            continue;
        }
        tracing::debug!(node = %path, "deleting a protected node of an earlier try or session");
        match session.retrying(|| session.delete(&path)).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(from_zk(&format!("delete {path}"), e)),
        }
    }
    let Some((path, node, stat)) = found else {
        return Ok(None);
    };
    let seq = nodes::sequence(&node, marker)
        .ok_or_else(|| unexpected(format!("protected node {path} has no sequence")))?
        .to_owned();
    Ok(Some(Created {
        path,
        node,
        seq,
        czxid: stat.czxid,
        session: stat.ephemeral_owner,
        granted: sent,
    }))
}

/// How a contender decides it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Mutex, writer, the semaphore's internal lock: first among all contenders.
    Exclusive,
    /// Reader: no writer (or mutex) before it.
    Reader,
}

/// The other kind a contender must not share its name with. Locks (mutexes, readers and
/// writers) wait for each other in one queue; a lock and a semaphore cannot wait for each
/// other, so the later of the two is refused. Each side creates its node first and then
/// looks for the other's: ZooKeeper orders all writes, and a session reads what it wrote and
/// everything before it, so of two contenders that overlap at least one sees the other.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Apart<'a> {
    /// A lock at the name's node (`Recipe::dir`): refused while a semaphore holds or waits
    /// there (a node under its `locks` or `leases` children).
    FromSemaphore,
    /// The internal mutex of a semaphore whose name's node is this path: refused while a lock
    /// holds or waits there (a `lock-`, `__READ__` or `__WRIT__` node directly under it).
    FromLocks(&'a str),
}

/// One kind of contender of a recipe: the directory its nodes live in, its own marker, the
/// markers of every node that competes with it, its role, and the kind it keeps apart from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recipe<'a> {
    pub(crate) name: &'a LockName,
    pub(crate) dir: &'a str,
    pub(crate) marker: &'static str,
    pub(crate) markers: &'static [&'static str],
    pub(crate) role: Role,
    pub(crate) apart: Apart<'a>,
}

/// The markers of every lock node at a name: a mutex node counts as a writer, so a mutex, a
/// reader and a writer of one name wait for each other in the one sequence of that node's
/// children.
pub(crate) const LOCK_MARKERS: &[&str] = &[LOCK, READ, WRITE];

/// Whether a semaphore holds or waits at the name whose node is `dir`, whose children are
/// `children`: only if the semaphore's `locks` or `leases` parents are there (they stay a
/// while after their last node goes) is there anything more to ask. The internal mutex is
/// listed before the leases: a semaphore waiter takes its lease before it lets the internal
/// mutex go, so one of the two listings sees it.
async fn semaphore_at(session: &Session, dir: &str, children: &[String]) -> Result<bool> {
    for (sub, marker) in [(LOCKS, LOCK), (LEASES, LEASE)] {
        if !children.iter().any(|c| c == sub) {
            continue;
        }
        let path = format!("{dir}/{sub}");
        match session.retrying(|| session.children(&path)).await {
            Ok(c) if c.iter().any(|c| nodes::sequence(c, marker).is_some()) => return Ok(true),
            Ok(_) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(from_zk(&format!("list {path}"), e)),
        }
    }
    Ok(false)
}

/// Whether the name's node `path` has lock nodes, `children` if it was already listed after
/// our create.
async fn locks_at(session: &Session, path: &str, children: Option<Vec<String>>) -> Result<bool> {
    let children = match children {
        Some(c) => c,
        None => match session.retrying(|| session.children(path)).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(from_zk(&format!("list {path}"), e)),
        },
    };
    Ok(!nodes::contenders(children, LOCK_MARKERS).is_empty())
}

/// Runs `step` of an acquisition that waits until `deadline`, for at most [`UNDO_GRACE`] past
/// it: a server that has not answered by then is a retryable error (the core would cut the
/// call off a little later anyway), and what the step created is deleted in the background
/// by its undo.
pub(crate) async fn by_deadline<T>(
    deadline: Deadline,
    dir: &str,
    step: impl Future<Output = Result<T>>,
) -> Result<T> {
    match deadline.with_grace(UNDO_GRACE).run(step).await {
        Some(answer) => answer,
        None => Err(Error::no_answer(
            BACKEND,
            format!(
                "no answer from ZooKeeper about {dir} by the deadline and {UNDO_GRACE:?} more: \
                 nothing says the lock is held"
            ),
        )),
    }
}

/// Creates a node for `recipe` and waits until it holds, or until `deadline` (then the node
/// is deleted and `Ok(None)` returned if the server says the lock is still held: see
/// [`give_up`]). Each waiter watches exactly one node (its predecessor, or a reader's first
/// writer), so one release wakes one waiter. Bounded by [`by_deadline`].
///
/// The node is left to `undo` (still armed) on success: the caller disarms it when the node
/// becomes a hold.
pub(crate) async fn contend(
    session: &Session,
    recipe: Recipe<'_>,
    deadline: Deadline,
    undo: &mut NodeUndo,
) -> Result<Option<Created>> {
    let answer = by_deadline(
        deadline,
        recipe.dir,
        contend_until(session, recipe, deadline, undo),
    )
    .await;
    if answer.is_err() {
        undo.undo_in_background();
    }
    answer
}

async fn contend_until(
    session: &Session,
    recipe: Recipe<'_>,
    deadline: Deadline,
    undo: &mut NodeUndo,
) -> Result<Option<Created>> {
    let lists: Vec<&str> = match recipe.apart {
        Apart::FromSemaphore => vec![recipe.dir],
        Apart::FromLocks(name_path) => vec![recipe.dir, name_path],
    };
    for _ in 0..RECREATES {
        let (mut ours, listed) =
            create_listed(session, recipe.dir, recipe.marker, &[], undo, &lists).await?;
        let mut listed = listed.into_iter();
        let mut prelisted = listed.next().flatten();
        let mut apart_checked = false;
        if let Apart::FromLocks(name_path) = recipe.apart {
            if locks_at(session, name_path, listed.next().flatten()).await? {
                undo.undo_now().await;
                return Err(in_use(recipe.name, "a lock (a mutex or a read-write lock)"));
            }
            apart_checked = true;
        }
        loop {
            // The first listing went out with the create (and so did the lease's start).
            let (listed, children) = match prelisted.take() {
                Some(children) => (ours.granted, children),
                None => {
                    let listed = Instant::now();
                    match session.retrying(|| session.children(recipe.dir)).await {
                        Ok(c) => (listed, c),
                        Err(zk::Error::NoNode) => break,
                        Err(e) => return Err(from_zk(&format!("list {}", recipe.dir), e)),
                    }
                }
            };
            if !apart_checked {
                apart_checked = true;
                if semaphore_at(session, recipe.dir, &children).await? {
                    undo.undo_now().await;
                    return Err(in_use(recipe.name, "a semaphore"));
                }
            }
            let sorted = nodes::contenders(children, recipe.markers);
            let standing = match recipe.role {
                Role::Exclusive => nodes::exclusive_standing(&sorted, &ours.node),
                Role::Reader => nodes::reader_standing(&sorted, &ours.node),
            };
            let watch = match standing {
                Standing::Granted => {
                    ours.granted = listed;
                    return Ok(Some(ours));
                }
                Standing::Missing => break,
                Standing::Watch(node) => format!("{}/{node}", recipe.dir),
            };
            if deadline.has_passed() {
                give_up(session, undo, recipe.dir).await?;
                return Ok(None);
            }
            let watcher = match session.retrying(|| session.data_watch(&watch)).await {
                Ok(w) => w,
                // Gone between the listing and the watch: look again at once.
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(from_zk(&format!("watch {watch}"), e)),
            };
            if deadline.run(watcher.changed()).await.is_none() {
                give_up(session, undo, recipe.dir).await?;
                return Ok(None);
            }
            session.woken();
        }
        tracing::debug!(node = %ours.path, "our node is not among the contenders; creating a new one");
        // Delete it by its path (a no-op if it is gone): a node of ours that the listing could
        // not place must not stay behind, owned by our live session (review M5).
        undo.undo_now().await;
    }
    Err(unexpected(format!(
        "the node of an acquisition under {} kept disappearing",
        recipe.dir
    )))
}

/// The refusal of a request for a name that another kind uses.
fn in_use(name: &LockName, kind: &str) -> Error {
    Error::invalid_argument(
        "name",
        format!(
            "name {:?} is in use as {kind}: a semaphore and a lock cannot share a name while \
             either is held or awaited",
            name.as_str()
        ),
    )
}

/// The backend side of a hold: one node (a lock, read, write or lease node) to delete.
#[derive(Debug)]
pub(crate) struct ZkHold {
    session: Arc<Session>,
    name: LockName,
    path: String,
    /// The session that owns the node: once it is no longer live, the node is gone with it.
    node_session: i64,
    registration: u64,
    /// The hold's loss signal: a renewal that meets the session's expiry says so.
    signal: HoldSignal,
    /// When the lease ends as far as this hold knows (moved by renewals): a hold dropped
    /// without release (leaked) is deleted then, as if its lease ran out on a server.
    lease_end: Mutex<Instant>,
    released: AtomicBool,
}

/// Turns a granted node into a guard, disarming `undo`, with no await in between.
pub(crate) fn grant(
    session: &Arc<Session>,
    name: &LockName,
    kind: LockKind,
    created: &Created,
    lease: Lease,
    undo: &mut NodeUndo,
) -> LockGuard {
    undo.disarm();
    let signal = HoldSignal::new();
    let (registration, horizon) = session.register(name, &signal, created.session);
    let hold = ZkHold {
        session: Arc::clone(session),
        name: name.clone(),
        path: created.path.clone(),
        node_session: created.session,
        registration,
        signal: signal.clone(),
        lease_end: Mutex::new(later(created.granted, lease.ttl())),
        released: AtomicBool::new(false),
    };
    let new = NewHold::new(
        BACKEND,
        kind,
        name.clone(),
        FencingToken::new(u64::try_from(created.czxid).unwrap_or(0)),
        lease,
        created.granted,
        Arc::new(hold),
    )
    .with_signal(signal);
    LockGuard::new(match horizon {
        Some(h) => new.with_horizon(h),
        None => new,
    })
}

impl ZkHold {
    /// Whether the node went with its expired session (seen by the session's watcher or by a
    /// renewal that met the expiry first): then there is nothing to delete.
    fn gone_with_session(&self) -> bool {
        !self.session.is_live(self.node_session)
            || self.signal.reason() == Some(LossReason::SessionExpired)
    }
}

#[async_trait]
impl Hold for ZkHold {
    async fn release(&self) -> Result<()> {
        self.released.store(true, Ordering::SeqCst);
        self.session.unregister(self.registration);
        if self.gone_with_session() {
            // Its session expired: the node went with it, nothing to delete.
            return Err(Error::lock_lost(&self.name));
        }
        // As long as the server keeps the session of a client it does not hear from.
        let limit = self.session.session_timeout();
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
        let sent = Instant::now();
        let expired = || {
            self.signal.mark_lost(LossReason::SessionExpired);
            Err(Error::lock_lost(&self.name))
        };
        if !self.session.is_live(self.node_session) {
            return expired();
        }
        match self.session.exists(&self.path).await {
            Ok(Some(_)) => {
                *self
                    .lease_end
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = later(sent, ttl);
                Ok(())
            }
            Ok(None) => Err(Error::lock_lost(&self.name)),
            // The renewal met the expiry before the session's state watcher did.
            Err(zk::Error::SessionExpired) => expired(),
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
        if self.gone_with_session() {
            // Gone with its session: no delete to send (review L3).
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ZkConfig;

    /// Review M3: protected-mode recovery takes only a node the current session owns, and
    /// deletes the rest with our prefix (an earlier session's, a duplicate of a retried
    /// create). It used to take the first node with the prefix, whoever owned it.
    #[tokio::test]
    async fn protected_mode_keeps_only_this_sessions_node() {
        let Some(url) = dlock_conformance::service_url("DLOCK_ZK_URL") else {
            return;
        };
        let config = ZkConfig::from_url(&url).unwrap();
        let session = Session::connect(config.clone()).await.unwrap();
        let other = zk::Client::connect(&config.connect_string()).await.unwrap();
        let dir = format!("/dlock-test/protected-{}", uuid::Uuid::new_v4().simple());
        session.ensure_parents(&dir).await.unwrap();
        let prefix = nodes::protected_prefix();
        let base = format!("{dir}/{prefix}{}", nodes::LOCK);
        let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        // An earlier session's node first, then two of ours.
        other.create(&base, &[], &mode).await.unwrap();
        session
            .create(&base, zk::CreateMode::EphemeralSequential)
            .await
            .unwrap();
        session
            .create(&base, zk::CreateMode::EphemeralSequential)
            .await
            .unwrap();
        let found = find_protected(&session, &dir, &prefix, nodes::LOCK)
            .await
            .unwrap()
            .expect("our node");
        let (_, stat) = other.get_data(&found.path).await.unwrap();
        assert_eq!(stat.ephemeral_owner, session.client().session_id().0);
        let left: Vec<String> = other
            .list_children(&dir)
            .await
            .unwrap()
            .into_iter()
            .filter(|c| c.starts_with(&prefix))
            .collect();
        assert_eq!(left.len(), 1, "the other nodes with our prefix: {left:?}");
        assert_eq!(left[0], found.node);
    }
}
