//! The watchdog's renewals of the session's holds, in batches: a node lives as long as its
//! session, so a renewal only asks whether the node is still there, and one multi-read asks
//! that of up to [`READS`] nodes at once (ZooKeeper 3.6 and later; an older server, which
//! does not know multi-read, is asked node by node).

use std::sync::Weak;

use dlock_core::backend::Batcher;
use dlock_core::{Error, Result};
use zookeeper_client as zk;

use super::Session;
use crate::BACKEND;
use crate::error::from_zk;

/// The most reads one multi-read carries: with a path of up to ~100 bytes a read, its request
/// and its answer stay well within ZooKeeper's default `jute.maxbuffer` (1 MiB).
const READS: usize = 5_000;

/// What a renewal found of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Node {
    /// The node is there.
    There,
    /// The node is gone.
    Gone,
    /// The session (and with it the node) expired.
    Expired,
}

/// The batcher of `session`'s renewals (it holds the session weakly: the session owns it).
pub(crate) fn batcher(session: Weak<Session>) -> Batcher<String, Node> {
    Batcher::new(BACKEND, move |paths| {
        check_all(Weak::clone(&session), paths)
    })
}

/// Whether each of `paths` is there: one multi-read per [`READS`] paths.
async fn check_all(session: Weak<Session>, paths: Vec<String>) -> Vec<Result<Node>> {
    let Some(session) = session.upgrade() else {
        return paths
            .iter()
            .map(|_| Err(Error::no_answer(BACKEND, "the provider was dropped")))
            .collect();
    };
    let mut answers = Vec::with_capacity(paths.len());
    for chunk in paths.chunks(READS) {
        match session.read_many(chunk).await {
            Ok(found) => answers.extend(found),
            Err(zk::Error::Unimplemented) => {
                for path in chunk {
                    answers.push(node(session.exists(path).await.map(|s| s.is_some()), path));
                }
            }
            Err(e) => answers.extend(chunk.iter().map(|path| node(Err(e.clone()), path))),
        }
    }
    answers
}

/// A renewal's answer from whether `path` exists.
fn node(exists: std::result::Result<bool, zk::Error>, path: &str) -> Result<Node> {
    match exists {
        Ok(true) => Ok(Node::There),
        Ok(false) | Err(zk::Error::NoNode) => Ok(Node::Gone),
        Err(zk::Error::SessionExpired) => Ok(Node::Expired),
        Err(e) => Err(from_zk(&format!("exists {path}"), e)),
    }
}

impl Session {
    /// One multi-read of `paths`' data: whether each node is there. An error of the whole
    /// call is returned as it is (`Unimplemented` from a server before 3.6).
    async fn read_many(
        &self,
        paths: &[String],
    ) -> std::result::Result<Vec<Result<Node>>, zk::Error> {
        self.counters.count(|s| &mut s.multi_reads);
        let call = self.call();
        let mut reader = call.client.new_multi_reader();
        for path in paths {
            reader.add_get_data(path)?;
        }
        let results = call.ended(reader.commit().await)?;
        if results.len() != paths.len() {
            return Err(zk::Error::UnexpectedError(format!(
                "{} answers to {} reads",
                results.len(),
                paths.len()
            )));
        }
        Ok(results
            .into_iter()
            .zip(paths)
            .map(|(r, path)| match r {
                zk::MultiReadResult::Data { .. } => Ok(Node::There),
                zk::MultiReadResult::Error { err } => node(Err(err), path),
                _ => node(Ok(false), path),
            })
            .collect())
    }
}
