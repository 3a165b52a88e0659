//! Creating a contender's node: EPHEMERAL_SEQUENTIAL under a protection prefix, so that a
//! create whose answer was lost is found again instead of made twice (Curator's protection
//! mode).

use std::time::Duration;

use dlock_core::Result;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::{from_zk, is_transient, unexpected};
use crate::nodes;
use crate::session::Session;
use crate::undo::{Armed, NodeUndo};

type ZkResult<T> = std::result::Result<T, zk::Error>;

/// How many times a create is retried after `NoNode` (parents missing, or a container parent
/// removed by the server in between).
const PARENT_RETRIES: usize = 8;

/// How many creates in a row may lose their answer before the error is returned; the pause
/// before looking for the node doubles from 40 ms each time.
const LOST_ANSWERS: u32 = 6;

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

impl Created {
    /// The node `node` under `dir`, with the server's `stat` of it, shown by a call sent at
    /// `sent`.
    fn new(dir: &str, node: String, seq: String, stat: &zk::Stat, sent: Instant) -> Self {
        Self {
            path: format!("{dir}/{node}"),
            node,
            seq,
            czxid: stat.czxid,
            session: stat.ephemeral_owner,
            granted: sent,
        }
    }
}

/// Creates a contender's node (see [`create_then`]), with the children of each of `lists`
/// asked for right behind the create, in the same round trip: ZooKeeper answers a session's requests in the order they
/// were sent, so each listing sees the node. The listings come back only from the first
/// create, if it made the node (`None` for a listing that failed); otherwise the list is
/// empty and the caller lists for itself.
pub(crate) async fn create_listed(
    session: &Session,
    dir: &str,
    marker: &str,
    data: &[u8],
    undo: &mut NodeUndo,
    lists: &[&str],
) -> Result<(Created, Vec<Option<Vec<String>>>)> {
    let first = async |path: &str| session.create_and_list(path, data, MODE, lists).await;
    let (created, listed) = create_then(session, dir, marker, data, undo, first).await?;
    let listed = listed.map(|l| l.into_iter().map(Result::ok).collect());
    Ok((created, listed.unwrap_or_default()))
}

/// A contender's node: ephemeral and sequential.
const MODE: zk::CreateMode = zk::CreateMode::EphemeralSequential;

/// Creates `{dir}/{protected prefix}{marker}{seq}` as EPHEMERAL_SEQUENTIAL, creating missing
/// parents as containers, and after a connection loss finds the node by its protected prefix
/// instead of creating a second one (Curator's protection mode). `undo` is armed with it.
///
/// The first create is `first`'s, which sends requests of its own behind it: their answers
/// (`T`) come back only if that first create made the node.
async fn create_then<T>(
    session: &Session,
    dir: &str,
    marker: &str,
    data: &[u8],
    undo: &mut NodeUndo,
    first: impl AsyncFnOnce(&str) -> (ZkResult<(zk::Stat, zk::CreateSequence)>, T),
) -> Result<(Created, Option<T>)> {
    let prefix = nodes::protected_prefix();
    let base = format!("{dir}/{prefix}{marker}");
    undo.arm(Armed::Creating {
        dir: dir.to_owned(),
        prefix: prefix.clone(),
    });
    let mut parent_tries = 0;
    let mut losses = 0;
    let mut first = Some(first);
    loop {
        let sent = Instant::now();
        let (created, behind) = match first.take() {
            Some(first) => {
                let (created, behind) = first(&base).await;
                (created, Some(behind))
            }
            None => (session.create_with(&base, data, MODE).await, None),
        };
        match created {
            Ok((stat, seq)) => {
                let seq = seq.to_string();
                let node = format!("{prefix}{marker}{seq}");
                let created = Created::new(dir, node, seq, &stat, sent);
                undo.arm(Armed::Created(created.path.clone()));
                return Ok((created, behind));
            }
            Err(zk::Error::NoNode) if parent_tries < PARENT_RETRIES => {
                parent_tries += 1;
                session
                    .ensure_parents(dir)
                    .await
                    .map_err(|e| from_zk(&format!("create parents of {dir}"), e))?;
            }
            Err(e) if is_transient(&e) && losses < LOST_ANSWERS => {
                losses += 1;
                tokio::time::sleep(Duration::from_millis(20 << losses)).await;
                if let Some(found) = find_protected(session, dir, &prefix, marker).await? {
                    undo.arm(Armed::Created(found.path.clone()));
                    return Ok((found, None));
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
    // catch it up first, or we would miss our node and create a second one.
    match session.retrying(|| session.sync(dir)).await {
        Ok(()) => {}
        Err(zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(from_zk(&format!("sync {dir}"), e)),
    }
    let children = session.list(dir).await?;
    // A node with our prefix counts only if the current session owns it (one left by an
    // earlier session is deleted: that session's expiry would take it away under a live
    // hold), and only one is kept (a second create after a lost answer can leave two: the
    // others are deleted, or one would wait on itself).
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
            found = Some((node, stat));
            continue;
        }
        tracing::debug!(node = %path, "deleting a protected node of an earlier try or session");
        match session.retrying(|| session.delete(&path)).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(from_zk(&format!("delete {path}"), e)),
        }
    }
    let Some((node, stat)) = found else {
        return Ok(None);
    };
    let seq = nodes::sequence(&node, marker)
        .ok_or_else(|| unexpected(format!("protected node {dir}/{node} has no sequence")))?
        .to_owned();
    Ok(Some(Created::new(dir, node, seq, &stat, sent)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Protected-mode recovery takes only a node the current session owns, and deletes the
    /// rest with our prefix (an earlier session's, a duplicate of a retried create).
    #[tokio::test]
    async fn protected_mode_keeps_only_this_sessions_node() {
        let Some(session) = Session::for_test().await else {
            return;
        };
        let other = zk::Client::connect(&session.config.connect_string())
            .await
            .unwrap();
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
