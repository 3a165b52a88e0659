//! How an acquisition waits its turn: one node per attempt, a watch on exactly one other node,
//! an answer by the deadline, and attempts made again through an outage.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{AcquireFn, Deadline, Retries};
use dlock_core::{Error, Lease, LockGuard, LockKind, LockName, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::create::{Created, create_listed};
use crate::error::{from_zk, unexpected};
use crate::hold::grant;
use crate::kinds::{Apart, in_use, locks_at, semaphore_at};
use crate::nodes::{self, Standing};
use crate::session::Session;
use crate::undo::{self, NodeUndo};

/// How many times an acquisition recreates its node after finding it gone (Curator retries
/// the same way when its node vanished, e.g. deleted by an operator).
const RECREATES: usize = 5;

/// How long a waiter that gives up at its deadline waits for the server to answer the delete
/// of its node, which is what confirms that the lock is still held (see [`give_up`]): below
/// the core's cut-off of a timed call (`CALL_GRACE`), so the backend gives its own answer.
const UNDO_GRACE: Duration = Duration::from_secs(1);

/// Pauses between attempts of an acquisition that failed with a retryable error.
const ATTEMPT_PAUSE_MIN: Duration = Duration::from_millis(50);
const ATTEMPT_PAUSE_MAX: Duration = Duration::from_secs(2);

/// How a contender decides it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Mutex, writer, the semaphore's internal lock: first among all contenders.
    Exclusive,
    /// Reader: no writer (or mutex) before it.
    Reader,
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
    /// A directory whose children the holder lists first thing once it holds (a semaphore's
    /// `leases`): listed in the create's round trip, and handed back with the node if the
    /// listing sent with it granted the node. That listing is as good as one sent after the
    /// grant: it was taken after the create, when every earlier node had gone, so it sees
    /// what their holders wrote before they let go.
    pub(crate) then_list: Option<&'a str>,
    /// The node's data: empty for locks, the proposal of an election's campaigner.
    pub(crate) data: &'a [u8],
}

/// A node that holds, and the children of its recipe's [`then_list`](Recipe::then_list)
/// where they came with the grant.
pub(crate) type Contended = (Created, Option<Vec<String>>);

/// Runs `attempt` (one acquisition) again after a retryable error while `deadline` allows,
/// with a growing pause: an unbounded `acquire()` waits out an outage, and a timed one
/// returns the last error at its deadline. A non-retryable error is returned at once.
pub(crate) async fn persist(
    name: &LockName,
    deadline: Deadline,
    mut attempt: impl AcquireFn<LockGuard>,
) -> Result<Option<LockGuard>> {
    let mut retries = Retries::new(ATTEMPT_PAUSE_MIN, ATTEMPT_PAUSE_MAX);
    loop {
        match attempt().await {
            Err(e) if e.is_retryable() && !deadline.has_passed() => {
                if retries.failed() {
                    let failures = retries.failures();
                    tracing::warn!(lock = %name, error = %e, failures, "zookeeper acquisition keeps failing; still retrying");
                } else {
                    tracing::debug!(lock = %name, error = %e, "zookeeper acquisition failed; retrying");
                }
                tokio::time::sleep_until(deadline.wake_after(retries.next_pause())).await;
                if deadline.has_passed() {
                    return Err(e);
                }
            }
            other => return other,
        }
    }
}

/// An exclusive hold of `recipe` (a mutex, an election) for `req`: attempts made again
/// through an outage ([`persist`]), each contending for a node ([`acquire`]).
pub(crate) async fn exclusive(
    session: &Arc<Session>,
    recipe: Recipe<'_>,
    req: &dlock_core::backend::Request<'_>,
) -> Result<Option<LockGuard>> {
    persist(req.name, req.deadline, || async {
        let granted = acquire(
            session,
            recipe,
            LockKind::Mutex,
            req.options.lease,
            req.deadline,
        )
        .await?;
        Ok(granted.map(|(guard, _)| guard))
    })
    .await
}

/// One attempt of a lock recipe: contends for a node of `recipe` and turns it into a guard of
/// `kind` with `lease` once it holds; also returns the node.
pub(crate) async fn acquire(
    session: &Arc<Session>,
    recipe: Recipe<'_>,
    kind: LockKind,
    lease: Lease,
    deadline: Deadline,
) -> Result<Option<(LockGuard, Created)>> {
    let mut undo = undo::node_undo(session);
    let Some((created, _)) = contend(session, recipe, deadline, &mut undo).await? else {
        return Ok(None);
    };
    let guard = grant(session, recipe.name, kind, &created, lease, &mut undo);
    Ok(Some((guard, created)))
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

/// Ends a wait that reached its deadline: deletes our node and says the lock is held
/// (`Ok(())`, the caller answers `Ok(None)`) only if the server answered that delete within
/// [`UNDO_GRACE`]. ZooKeeper sends a session's watch events before its answers to later
/// requests, so an answered delete with no event before it means the node we waited on was
/// still there. A session that is not connected, or a delete left unanswered, is a retryable
/// error: nothing says the lock is held. The delete then goes on in the background.
pub(crate) async fn give_up(session: &Arc<Session>, undo: &mut NodeUndo, dir: &str) -> Result<()> {
    if !session.is_connected() {
        undo::in_background(session, undo);
        return Err(Error::no_answer(
            BACKEND,
            format!(
                "the wait under {dir} reached its deadline while the session to ZooKeeper was \
                 not connected: nothing says the lock is held"
            ),
        ));
    }
    if undo::within(session, undo, UNDO_GRACE).await {
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

/// Creates a node for `recipe` and waits until it holds, or until `deadline` (then the node
/// is deleted and `Ok(None)` returned if the server says the lock is still held: see
/// [`give_up`]). Each waiter watches exactly one node (its predecessor, or a reader's first
/// writer), so one release wakes one waiter. Bounded by [`by_deadline`].
///
/// The node is left to `undo` (still armed) on success: the caller disarms it when the node
/// becomes a hold.
pub(crate) async fn contend(
    session: &Arc<Session>,
    recipe: Recipe<'_>,
    deadline: Deadline,
    undo: &mut NodeUndo,
) -> Result<Option<Contended>> {
    let answer = by_deadline(
        deadline,
        recipe.dir,
        contend_until(session, recipe, deadline, undo),
    )
    .await;
    if answer.is_err() {
        undo::in_background(session, undo);
    }
    answer
}

async fn contend_until(
    session: &Arc<Session>,
    recipe: Recipe<'_>,
    deadline: Deadline,
    undo: &mut NodeUndo,
) -> Result<Option<Contended>> {
    let mut lists: Vec<&str> = match recipe.apart {
        Apart::FromSemaphore => vec![recipe.dir],
        Apart::FromLocks(name_path) => vec![recipe.dir, name_path],
    };
    lists.extend(recipe.then_list);
    for _ in 0..RECREATES {
        let (mut ours, listed) = create_listed(
            session,
            recipe.dir,
            recipe.marker,
            recipe.data,
            undo,
            &lists,
        )
        .await?;
        let mut listed = listed.into_iter();
        let mut prelisted = listed.next().flatten();
        let mut apart_checked = false;
        if let Apart::FromLocks(name_path) = recipe.apart {
            if locks_at(session, name_path, listed.next().flatten()).await? {
                undo.run_now().await;
                return Err(in_use(recipe.name, "a lock (a mutex or a read-write lock)"));
            }
            apart_checked = true;
        }
        let mut then_listed = recipe.then_list.and_then(|_| listed.next().flatten());
        loop {
            // The first listing went out with the create (and so did the lease's start).
            let (listed, children) = match prelisted.take() {
                Some(children) => (ours.granted, children),
                None => {
                    then_listed = None;
                    let listed = Instant::now();
                    match session
                        .retrying(|| session.children_as(ours.session, recipe.dir))
                        .await
                    {
                        Ok(Some(c)) => (listed, c),
                        // Our node went with its session: queue again on the current one.
                        Ok(None) | Err(zk::Error::NoNode) => break,
                        Err(e) => return Err(from_zk(&format!("list {}", recipe.dir), e)),
                    }
                }
            };
            if !apart_checked {
                apart_checked = true;
                if semaphore_at(session, recipe.dir, &children).await? {
                    undo.run_now().await;
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
                    return Ok(Some((ours, then_listed)));
                }
                Standing::Missing => break,
                Standing::Watch(node) => format!("{}/{node}", recipe.dir),
            };
            if deadline.has_passed() {
                give_up(session, undo, recipe.dir).await?;
                return Ok(None);
            }
            let watcher = match session
                .retrying(|| session.data_watch(ours.session, &watch))
                .await
            {
                Ok(Some(w)) => w,
                // Our node went with its session: queue again on the current one.
                Ok(None) => break,
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
        tracing::debug!(node = %ours.path, "our node is not among the contenders, or went with its session; creating a new one");
        // Delete it by its path (a no-op if it is gone): a node of ours that the listing could
        // not place must not stay behind, owned by our live session, nor one of an ended
        // session that the server has not expired yet.
        undo.run_now().await;
    }
    Err(unexpected(format!(
        "the node of an acquisition under {} kept disappearing",
        recipe.dir
    )))
}

#[cfg(test)]
mod tests {
    use dlock_conformance::eventually;

    use super::*;
    use crate::nodes::LOCK;

    const LIMIT: Duration = Duration::from_secs(10);

    /// A waiter whose session ends between its create and its watch queues again on the new
    /// session: it does not watch its predecessor from the new session while its own node is
    /// gone (it would wait with no place in the queue, until the holder lets go).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_watch_is_set_only_on_the_session_of_the_waiters_node() {
        let Some(session) = Session::for_test().await else {
            return;
        };
        let connect = session.config.connect_string();
        let other = zk::Client::connect(&connect).await.unwrap();
        let dir = format!("/dlock-test/rewatch-{}", uuid::Uuid::new_v4().simple());
        session.ensure_parents(&dir).await.unwrap();
        let holder = format!("{dir}/{}{LOCK}", nodes::protected_prefix());
        let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let (_, seq) = other.create(&holder, &[], &mode).await.unwrap();
        let holder = format!("{holder}{seq}");
        // The waiter creates its node and then waits for the watch, held back here.
        let held_back = session.watch_gate.close().await;
        let waiter = {
            let (session, dir) = (Arc::clone(&session), dir.clone());
            tokio::spawn(async move {
                let name = LockName::new("rewatch").unwrap();
                let recipe = crate::mutex::recipe(&name, &dir);
                let mut undo = undo::node_undo(&session);
                let granted = contend(&session, recipe, Deadline::NEVER, &mut undo).await;
                undo.disarm();
                granted.map(|c| c.map(|(created, _)| created.session))
            })
        };
        let owners = || {
            let (other, dir) = (&other, &dir);
            async move {
                let mut owners = Vec::new();
                for node in other.list_children(dir).await.unwrap() {
                    if let Ok((_, stat)) = other.get_data(&format!("{dir}/{node}")).await {
                        owners.push(stat.ephemeral_owner);
                    }
                }
                owners
            }
        };
        let old = session.client().session_id().0;
        eventually(LIMIT, "the waiter waits to watch", || async {
            match session.watch_gate.arrived() {
                0 => Err("no watch yet"),
                _ => Ok(()),
            }
        })
        .await;
        assert!(owners().await.contains(&old), "the waiter's node");
        // The session ends (taken over and closed, as an expiry does) and a new one opens.
        let thief = zk::Client::connector()
            .with_session(session.client().session().clone())
            .connect(&connect)
            .await
            .unwrap();
        drop(thief);
        eventually(LIMIT, "a new session", || async {
            let now = session.client().session_id().0;
            if now != old { Ok(()) } else { Err(now) }
        })
        .await;
        let new = session.client().session_id().0;
        drop(held_back);
        eventually(LIMIT, "the waiter queued on the new session", || async {
            let owners = owners().await;
            if owners.len() == 2 && owners.contains(&new) {
                Ok(())
            } else {
                Err(owners)
            }
        })
        .await;
        assert!(!waiter.is_finished(), "the waiter ended: {waiter:?}");
        other.delete(&holder, None).await.unwrap();
        let granted = tokio::time::timeout(LIMIT, waiter).await.unwrap().unwrap();
        assert_eq!(granted.unwrap(), Some(new));
        for node in other.list_children(&dir).await.unwrap() {
            other.delete(&format!("{dir}/{node}"), None).await.unwrap();
        }
    }
}
