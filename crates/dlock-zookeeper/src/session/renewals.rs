//! The watchdog's renewals of the session's holds, in batches: a node lives as long as its
//! session, so a renewal only asks whether the node is still there, and one multi-read asks
//! that of many nodes at once (ZooKeeper 3.6 and later). A server that does not know
//! multi-read answers it with `Unimplemented` and closes the connection; the session then
//! asks node by node from there on.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use dlock_core::Result;
use dlock_core::backend::Batcher;
use zookeeper_client as zk;

use super::Session;
use crate::BACKEND;
use crate::error::from_zk;

/// The most bytes of requests one multi-read carries: a read costs its path and about 20
/// bytes of framing, and its answer about 100 bytes (a node's stat and the little data dlock
/// writes), so the request and the answer both stay within half of ZooKeeper's default
/// `jute.maxbuffer` (1 MiB).
const REQUEST_BYTES: usize = 512 * 1024;

/// The most reads one multi-read carries, whatever their paths: their answers' share of
/// [`REQUEST_BYTES`].
const READS: usize = 4_000;

/// Consecutive slices of `paths` for one multi-read each, within [`REQUEST_BYTES`] and
/// [`READS`].
fn chunks(paths: &[String]) -> Vec<&[String]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, path) in paths.iter().enumerate() {
        let cost = path.len() + 20;
        if i > start && (bytes + cost > REQUEST_BYTES || i - start >= READS) {
            out.push(&paths[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += cost;
    }
    if start < paths.len() {
        out.push(&paths[start..]);
    }
    out
}

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
    Batcher::with_owner(BACKEND, session, check_all)
}

/// Whether each of `paths` is there: one multi-read per [`READS`] paths.
async fn check_all(session: Arc<Session>, paths: Vec<String>) -> Vec<Result<Node>> {
    let mut answers = Vec::with_capacity(paths.len());
    for chunk in chunks(&paths) {
        if !session.multi_read.load(Ordering::Relaxed) {
            answers.extend(one_by_one(&session, chunk).await);
            continue;
        }
        match session.read_many(chunk).await {
            Ok(found) => answers.extend(found),
            Err(zk::Error::Unimplemented) => {
                session.multi_read.store(false, Ordering::Relaxed);
                tracing::info!(
                    store = %session.store_id,
                    "zookeeper: the server does not know multi-read (before 3.6): renewals ask node by node"
                );
                answers.extend(one_by_one(&session, chunk).await);
            }
            Err(e) => answers.extend(chunk.iter().map(|path| node(Err(e.clone()), path))),
        }
    }
    answers
}

/// Whether each of `paths` is there, with an `exists` each, all sent at once (the client
/// pipelines them on its one connection).
async fn one_by_one(session: &Session, paths: &[String]) -> Vec<Result<Node>> {
    let asked = paths
        .iter()
        .map(|path| async move { node(session.exists(path).await.map(|s| s.is_some()), path) });
    futures::future::join_all(asked).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_read_stays_within_its_bytes_and_reads() {
        let short: Vec<String> = (0..10_000)
            .map(|i| format!("/dlock/n{i}/_c_x-lock-{i:010}"))
            .collect();
        let parts = chunks(&short);
        assert!(parts.iter().all(|c| c.len() <= READS));
        assert_eq!(parts.iter().map(|c| c.len()).sum::<usize>(), short.len());
        // Paths of a 255-byte name: fewer of them per multi-read.
        let long: Vec<String> = (0..3_000)
            .map(|i| format!("/dlock/{}/{i:010}", "n".repeat(300)))
            .collect();
        let parts = chunks(&long);
        assert!(parts.len() > 1);
        for c in &parts {
            assert!(c.iter().map(|p| p.len() + 20).sum::<usize>() <= REQUEST_BYTES);
        }
        assert_eq!(parts.iter().map(|c| c.len()).sum::<usize>(), long.len());
        assert!(chunks(&[]).is_empty());
    }
}
