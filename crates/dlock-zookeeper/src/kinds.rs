//! Kinds on one name: a lock (mutex, reader or writer) and a semaphore of one name cannot
//! wait for each other, so the later of the two is refused.

use dlock_core::{Error, LockName, Result};

use crate::nodes::{self, LEASE, LEASES, LOCK, LOCKS, READ, WRITE};
use crate::session::Session;

/// The markers of every lock node at a name: a mutex node counts as a writer, so a mutex, a
/// reader and a writer of one name wait for each other in the one sequence of that node's
/// children.
pub(crate) const LOCK_MARKERS: &[&str] = &[LOCK, READ, WRITE];

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

/// Whether a semaphore holds or waits at the name whose node is `dir`, whose children are
/// `children`: only if the semaphore's `locks` or `leases` parents are there (they stay a
/// while after their last node goes) is there anything more to ask. The internal mutex is
/// listed before the leases: a semaphore waiter takes its lease before it lets the internal
/// mutex go, so one of the two listings sees it.
pub(crate) async fn semaphore_at(
    session: &Session,
    dir: &str,
    children: &[String],
) -> Result<bool> {
    for (sub, marker) in [(LOCKS, LOCK), (LEASES, LEASE)] {
        if !children.iter().any(|c| c == sub) {
            continue;
        }
        let listed = session.list(&format!("{dir}/{sub}")).await?;
        if listed.iter().any(|c| nodes::sequence(c, marker).is_some()) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether the name's node `path` has lock nodes, `children` if it was already listed after
/// our create.
pub(crate) async fn locks_at(
    session: &Session,
    path: &str,
    children: Option<Vec<String>>,
) -> Result<bool> {
    let children = match children {
        Some(c) => c,
        None => session.list(path).await?,
    };
    Ok(!nodes::contenders(children, LOCK_MARKERS).is_empty())
}

/// The refusal of a request for a name that another kind uses.
pub(crate) fn in_use(name: &LockName, kind: &str) -> Error {
    Error::invalid_argument(
        "name",
        format!(
            "name {:?} is in use as {kind}: a semaphore and a lock cannot share a name while \
             either is held or awaited",
            name.as_str()
        ),
    )
}
