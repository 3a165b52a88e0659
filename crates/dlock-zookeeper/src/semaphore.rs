//! The semaphore: Curator's `InterProcessSemaphoreV2` with a fixed number of leases.

use std::sync::Arc;

use dlock_core::backend::{Deadline, RawSemaphore, Request};
use dlock_core::{Error, LockGuard, LockKind, LockName, LockOptions, Result, async_trait};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::contend::{Recipe, Role, by_deadline, contend, give_up, persist};
use crate::create::create_listed;
use crate::error::{from_zk, is_transient, unexpected};
use crate::hold::grant;
use crate::kinds::Apart;
use crate::nodes::{self, LEASE, LEASES, LOCK, LOCKS};
use crate::session::Session;
use crate::undo;

/// How many times a lease is created anew after it vanished while waiting.
const RECREATES: usize = 5;

/// One lease of `permits` at `path`: take the internal mutex at `{path}/locks`, create
/// `{path}/leases/_c_{uuid}-lease-{seq}`, and while there are more leases than permits wait for
/// the leases to change (still holding the internal mutex, so only one waiter watches);
/// then release the internal mutex.
///
/// If our lease vanishes while we wait (an expired session, an operator deleting nodes), the
/// internal mutex is released and the whole acquisition starts over, as Curator does: a lease
/// re-created without the mutex could wait beside another waiter's, and with one permit the
/// two would wait for each other for good.
///
/// The internal mutex's node is also what keeps a semaphore and a lock of one name apart: it
/// is created before anything else, and the name's node is listed right behind it.
async fn acquire_lease(
    session: &Arc<Session>,
    name: &LockName,
    path: &str,
    permits: u32,
    options: &LockOptions,
    deadline: Deadline,
) -> Result<Option<LockGuard>> {
    let locks = format!("{path}/{LOCKS}");
    let leases = format!("{path}/{LEASES}");
    for _ in 0..RECREATES {
        let mut internal = undo::node_undo(session);
        let recipe = Recipe {
            name,
            dir: &locks,
            marker: LOCK,
            markers: &[LOCK],
            role: Role::Exclusive,
            apart: Apart::FromLocks(path),
            then_list: Some(&leases),
            data: &[],
        };
        let Some((mutex, held)) = contend(session, recipe, deadline, &mut internal).await? else {
            return Ok(None);
        };
        // Release the internal mutex (left armed in `internal` by `contend`).
        let lease = Lease {
            leases: &leases,
            held,
            mutex: &mutex.path,
            mutex_session: mutex.session,
            permits,
        };
        let taken = by_deadline(
            deadline,
            &leases,
            take_lease(session, name, lease, options, deadline),
        );
        match taken.await {
            Ok(Taken::Granted(guard)) => {
                internal.run_now().await;
                return Ok(Some(guard));
            }
            Ok(Taken::TimedOut) => {
                give_up(session, &mut internal, &locks).await?;
                return Ok(None);
            }
            Ok(Taken::Vanished) => internal.run_now().await,
            // A refusal leaves the internal mutex free before it is returned; a server that
            // did not answer is not waited for.
            Err(e @ Error::Connection { .. }) => {
                undo::in_background(session, &mut internal);
                return Err(e);
            }
            Err(e) => {
                internal.run_now().await;
                return Err(e);
            }
        }
    }
    Err(unexpected(format!(
        "the lease node of an acquisition under {leases} kept disappearing"
    )))
}

/// How one lease attempt under the internal mutex ended.
enum Taken {
    Granted(LockGuard),
    TimedOut,
    /// Our lease node (or its parent) vanished while we waited, or the internal mutex node
    /// we hold did (and our lease was deleted): start over.
    Vanished,
}

/// Where one lease attempt takes its lease: the `leases` directory (and its children, if they
/// were listed with the internal mutex's grant), the internal mutex node it holds while it
/// waits and the session that owns that node, and the permits it counts with.
struct Lease<'a> {
    leases: &'a str,
    held: Option<Vec<String>>,
    mutex: &'a str,
    mutex_session: i64,
    permits: u32,
}

async fn take_lease(
    session: &Arc<Session>,
    name: &LockName,
    Lease {
        leases,
        held,
        mutex,
        mutex_session,
        permits,
    }: Lease<'_>,
    options: &LockOptions,
    deadline: Deadline,
) -> Result<Taken> {
    let held = match held {
        Some(held) => held,
        None => session.list(leases).await?,
    };
    agree_on_permits(session, leases, &held, permits).await?;
    let data = permits_data(permits);
    let permits = usize::try_from(permits).unwrap_or(usize::MAX);
    let mut undo = undo::node_undo(session);
    // The lease's create carries the first listing of the leases, without a watch: a lease
    // granted at once leaves no watch behind to be taken back.
    let (mut ours, listed) =
        create_listed(session, leases, LEASE, &data, &mut undo, &[leases]).await?;
    // An acquisition is bound to the session that holds its internal mutex. A lease created
    // by another (the first one expired while this process stalled, and the create went to
    // the session opened after it) was made without the mutex, which ended with its session:
    // it is taken back, and the acquisition starts over from the mutex.
    if ours.session != mutex_session {
        undo.run_now().await;
        return Ok(Taken::Vanished);
    }
    let mut prelisted = listed.into_iter().next().flatten();
    loop {
        let (listed, children, watcher) = match prelisted.take() {
            Some(children) => (ours.granted, children, None),
            None => {
                let listed = Instant::now();
                match session
                    .retrying(|| session.children_watch_as(ours.session, leases))
                    .await
                {
                    Ok(Some((children, watcher))) => (listed, children, Some(watcher)),
                    // Our lease went with its session (deleted by its path, should the
                    // server not have expired the session yet).
                    Ok(None) => {
                        undo.run_now().await;
                        return Ok(Taken::Vanished);
                    }
                    Err(zk::Error::NoNode) => {
                        undo.disarm();
                        return Ok(Taken::Vanished);
                    }
                    Err(e) => return Err(from_zk(&format!("list {leases}"), e)),
                }
            }
        };
        if !children.contains(&ours.node) {
            undo.disarm();
            return Ok(Taken::Vanished);
        }
        if lease_count(&children) <= permits {
            ours.granted = listed;
            return Ok(Taken::Granted(grant(
                session,
                name,
                LockKind::Permit,
                &ours,
                options.lease,
                &mut undo,
            )));
        }
        // Too many leases: list them again with a watch before waiting.
        let Some(watcher) = watcher else {
            continue;
        };
        // While we wait, only the holder of the internal mutex may add a lease. Without our
        // mutex node (an operator deleting it to unstick a name, a session that ended) another
        // waiter takes the mutex and adds its lease beside ours, and with one permit the two
        // would wait for each other for good: our lease goes, and we queue again.
        let mutex_watch = match session
            .retrying(|| session.data_watch(mutex_session, mutex))
            .await
        {
            Ok(Some(w)) => w,
            // Our mutex node is gone, or went with its session.
            Ok(None) | Err(zk::Error::NoNode) => {
                undo.run_now().await;
                return Ok(Taken::Vanished);
            }
            Err(e) => return Err(from_zk(&format!("watch {mutex}"), e)),
        };
        let changed = async {
            tokio::select! {
                _ = watcher.changed() => {}
                _ = mutex_watch.changed() => {}
            }
        };
        if deadline.has_passed() || deadline.run(changed).await.is_none() {
            give_up(session, &mut undo, leases).await?;
            return Ok(Taken::TimedOut);
        }
        session.woken();
    }
}

/// How many of `children` (of the `leases` node) are leases: each holds a permit until it is
/// deleted.
fn lease_count(children: &[String]) -> usize {
    children
        .iter()
        .filter(|c| nodes::sequence(c, LEASE).is_some())
        .count()
}

/// What a dlock lease node holds: the permit count its handle counts with. Curator writes other
/// data (or none), which counts as no opinion.
const PERMITS_DATA: &str = "dlock-permits=";

fn permits_data(permits: u32) -> Vec<u8> {
    format!("{PERMITS_DATA}{permits}").into_bytes()
}

fn read_permits(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data)
        .ok()?
        .strip_prefix(PERMITS_DATA)?
        .parse()
        .ok()
}

/// How many leases' data one round trip reads, looking for a dlock lease's permit count.
const READS_AT_ONCE: usize = 8;

/// One rule for permit counts on every backend: while leases are held, a handle with another
/// count gets `InvalidArgument`. Runs under the internal mutex, so the leases listed (`held`,
/// the children of `leases`) are the holders' (each checked on its way in): the first dlock
/// lease found speaks for all. Their data is read [`READS_AT_ONCE`] at a time, in one round
/// trip each, until one speaks.
async fn agree_on_permits(
    session: &Session,
    leases: &str,
    held: &[String],
    permits: u32,
) -> Result<()> {
    let paths: Vec<String> = held
        .iter()
        .filter(|c| nodes::sequence(c, LEASE).is_some())
        .map(|c| format!("{leases}/{c}"))
        .collect();
    for paths in paths.chunks(READS_AT_ONCE) {
        for (path, data) in paths.iter().zip(session.data_of_each(paths).await) {
            let data = match data {
                Ok(data) => data,
                Err(zk::Error::NoNode) => continue,
                // A read that failed on the way (a connection lost) is made again on its own.
                Err(e) if is_transient(&e) => match session.retrying(|| session.data(path)).await {
                    Ok(data) => data,
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(from_zk(&format!("read {path}"), e)),
                },
                Err(e) => return Err(from_zk(&format!("read {path}"), e)),
            };
            match read_permits(&data) {
                Some(held) if held != permits => {
                    return Err(Error::invalid_argument(
                        "permits",
                        format!(
                            "the semaphore is in use with {held} permits; this handle counts \
                             {permits} (handles must agree while any permit is held)"
                        ),
                    ));
                }
                Some(_) => return Ok(()),
                None => {}
            }
        }
    }
    Ok(())
}

/// The raw semaphore of a [`ZkProvider`](crate::ZkProvider): Curator's
/// `InterProcessSemaphoreV2` layout, lease nodes under `leases` taken one at a time under the
/// internal mutex at `locks`.
#[derive(Debug)]
pub struct ZkSemaphore {
    session: Arc<Session>,
    path: String,
}

impl ZkSemaphore {
    /// The semaphore whose nodes live under `path`.
    pub(crate) fn new(session: &Arc<Session>, path: String) -> Self {
        Self {
            session: Arc::clone(session),
            path,
        }
    }
}

#[async_trait]
impl RawSemaphore for ZkSemaphore {
    async fn acquire(&self, req: &Request<'_>, permits: u32) -> Result<Option<LockGuard>> {
        persist(req.name, req.deadline, || {
            acquire_lease(
                &self.session,
                req.name,
                &self.path,
                permits,
                req.options,
                req.deadline,
            )
        })
        .await
    }

    /// Curator's `getParticipantNodes`: every lease node holds a permit until it is deleted
    /// (a leaked hold's node goes at its lease end, a dead holder's with its session).
    async fn available(&self, _name: &LockName, permits: u32) -> Result<u32> {
        let leases = format!("{}/{LEASES}", self.path);
        let taken = lease_count(&self.session.list(&leases).await?);
        Ok(permits.saturating_sub(u32::try_from(taken).unwrap_or(u32::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease whose create lands on another session than the one that holds the internal
    /// mutex (a process that stalled past its session between the two) is not granted, even
    /// with a permit free: it is deleted and the acquisition starts over, bound again to one
    /// session. Here the mutex node is another session's, as after an expiry.
    #[tokio::test]
    async fn a_lease_made_beside_another_sessions_mutex_is_taken_back() {
        let Some(session) = Session::for_test().await else {
            return;
        };
        let other = zk::Client::connect(&session.config.connect_string())
            .await
            .unwrap();
        let path = format!("/dlock-test/z2-bound-{}", uuid::Uuid::new_v4().simple());
        let (locks, leases) = (format!("{path}/{LOCKS}"), format!("{path}/{LEASES}"));
        session.ensure_parents(&locks).await.unwrap();
        let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let (stat, seq) = other
            .create(&format!("{locks}/_c_x-{LOCK}"), &[], &mode)
            .await
            .unwrap();
        let mutex = format!("{locks}/_c_x-{LOCK}{seq}");
        let name = LockName::new("z2-bound").unwrap();
        let lease = Lease {
            leases: &leases,
            held: None,
            mutex: &mutex,
            mutex_session: stat.ephemeral_owner,
            permits: 1,
        };
        let deadline = Deadline::after(std::time::Duration::from_secs(5));
        let taken = take_lease(&session, &name, lease, &LockOptions::default(), deadline)
            .await
            .unwrap();
        assert!(
            matches!(taken, Taken::Vanished),
            "a lease made without its session's mutex was kept"
        );
        assert_eq!(lease_count(&session.list(&leases).await.unwrap()), 0);
        drop(other);
    }

    #[test]
    fn permit_counts_round_trip_and_foreign_data_has_no_opinion() {
        assert_eq!(read_permits(&permits_data(3)), Some(3));
        assert_eq!(read_permits(&permits_data(u32::MAX)), Some(u32::MAX));
        assert_eq!(read_permits(b"127.0.0.1"), None);
        assert_eq!(read_permits(b""), None);
        assert_eq!(read_permits(b"dlock-permits=x"), None);
        assert_eq!(read_permits(&[0xff, 0xfe]), None);
    }
}
