//! The mutex: etcd's own lock (the recipe behind `etcdctl lock` and the v3 Lock RPC). A
//! contender puts `{lock name}/{lease id in hex}` with the provider's lease; the key with the
//! lowest create revision holds the lock; every other waits for the delete of the key just
//! before its own (no herd), then looks again. The holder's create revision is its fencing
//! token: etcd's revisions only grow, across releases, expiries, restarts and elections.

use std::sync::Arc;

use dlock_core::backend::{Backoff, Deadline, RawLock, Request, worth_a_warning};
use dlock_core::{Error, LockGuard, LockName, Result, async_trait};
use tokio::time::Instant;

use crate::BACKEND;
use crate::error::{from_etcd, is_lease_gone, is_transient};
use crate::hold::grant;
use crate::keys::{self, Pending, delete_key, enter, give_up, look, put_answer, range};
use crate::retry::{RETRY_MAX, RETRY_MIN};
use crate::session::Session;
use crate::wait::wait_for_predecessor;

/// The raw mutex of one name: the etcd lock name (`{prefix}{escaped name}`) it contends for.
#[derive(Debug)]
pub struct EtcdMutex {
    pub(crate) session: Arc<Session>,
    pub(crate) lock_name: String,
}

#[async_trait]
impl RawLock for EtcdMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        self.contend(req, &[]).await
    }
}

impl EtcdMutex {
    /// Enter (put the key with `value`, look), wait for the predecessor, look again, until
    /// the key is the first or the deadline passed.
    pub(crate) async fn contend(
        &self,
        req: &Request<'_>,
        value: &[u8],
    ) -> Result<Option<LockGuard>> {
        let value: std::sync::Arc<[u8]> = value.into();
        let session = &self.session;
        let deadline = req.deadline;
        let range = range(&self.lock_name);
        let mut undo = keys::undo();
        let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
        let mut failing = Failing::new(req.name);
        'lease: loop {
            let lease = match deadline.run(session.lease()).await {
                Some(Ok(lease)) => lease,
                Some(Err(refused)) => return give_up(&mut undo, session, Err(refused)).await,
                None => {
                    // No lease at the deadline: the store did not grant one, so nothing said
                    // the lock is held.
                    let e = session
                        .grant_failure()
                        .or(failing.last.take())
                        .unwrap_or_else(|| session.no_lease());
                    return give_up(&mut undo, session, Err(e)).await;
                }
            };
            // Claimed (and so undone) before the put: a put whose answer is lost is still
            // undone. A retry under the same lease keeps its key (a put that went through is
            // found as stale and deleted); a key of an ended lease ends with it.
            let claim = match undo.disarm() {
                Some(pending) if pending.claim.lease == lease => pending.claim,
                _ => session.claim(&range, lease),
            };
            let key = claim.key.clone();
            let mut sent = Instant::now();
            // Server calls are not cut at the deadline (a zero wait still tries once): the core
            // cuts a timed acquisition off a grace after it, and the undo gives back the key.
            let put = {
                let (session, key, range) = (Arc::clone(session), key.clone(), range.clone());
                let value = std::sync::Arc::clone(&value);
                tokio::spawn(async move { enter(&session, lease, &key, &value, &range).await })
            };
            undo.arm(Pending::put(claim, put));
            let Some(entered) = put_answer(&mut undo).await else {
                continue 'lease;
            };
            let (created, mut seen) = match entered {
                Ok(r) => {
                    failing.answered();
                    r
                }
                Err(e) if is_transient(&e) || is_lease_gone(&e) => {
                    // A lease gone is a retry with the next lease (the session noted its end).
                    let e = Error::backend(BACKEND, format!("put {key}: {e}"), true, e);
                    if deadline.has_passed() {
                        return Err(e);
                    }
                    failing.failed(e);
                    backoff.wait().await;
                    continue 'lease;
                }
                Err(e) => return Err(from_etcd(&format!("put {key}"), e)),
            };
            if !created {
                // A key of this lease that an earlier contender of this provider failed to
                // delete (its release's answer never came): stale, since a key is claimed by
                // one contender at a time. Delete it and start over, so no token is handed out
                // twice.
                delete_key(session, &key, Some(seen.mine)).await?;
                continue 'lease;
            }
            loop {
                if seen.mine == 0 {
                    // The key is gone: the lease ended while waiting. Start over with the next.
                    continue 'lease;
                }
                if seen.holder == seen.mine {
                    return Ok(Some(grant(
                        session, req, lease, key, seen.mine, sent, &mut undo,
                    )));
                }
                if deadline.has_passed() {
                    // "Held" only if etcd answered the last look (`seen` is its answer); else
                    // the last failure since it answered (the key is deleted in the background).
                    return match failing.last.take() {
                        None => give_up(&mut undo, session, Ok(None)).await,
                        Some(e) => Err(e),
                    };
                }
                // Cut off at the deadline, the wait goes on to one more look: a watch can be
                // silent on a connection that died, so only a look says the lock is still held.
                let waited = deadline
                    .run(wait_for_predecessor(session, &range, seen.mine))
                    .await;
                if let Some(Err(e)) = waited {
                    let what = format!("wait for the lock {}", self.lock_name);
                    failing.retry(&what, e, deadline, &mut backoff).await?;
                }
                sent = Instant::now();
                seen = match look(session, &key, &range).await {
                    Ok(l) => {
                        failing.answered();
                        backoff.reset();
                        l
                    }
                    Err(e) => {
                        let what = format!("look at the lock {}", self.lock_name);
                        failing.retry(&what, e, deadline, &mut backoff).await?;
                        continue;
                    }
                };
            }
        }
    }
}

/// The failures of one acquisition since etcd last answered it. At the deadline the last one
/// is the answer: nothing said the lock is held. An acquisition that goes on failing (one
/// without a deadline retries for as long as it takes) says so now and then as a warning.
struct Failing<'a> {
    name: &'a LockName,
    last: Option<Error>,
    count: u32,
}

impl<'a> Failing<'a> {
    fn new(name: &'a LockName) -> Self {
        Self {
            name,
            last: None,
            count: 0,
        }
    }

    /// A call failed in a way a retry may fix.
    fn failed(&mut self, e: Error) {
        self.count = self.count.saturating_add(1);
        if worth_a_warning(self.count) {
            tracing::warn!(lock = %self.name, error = %e, failures = self.count, "etcd: acquire keeps failing; still retrying");
        } else {
            tracing::debug!(lock = %self.name, error = %e, "etcd: an acquire's call failed; retrying");
        }
        self.last = Some(e);
    }

    /// The call `what` failed with `e`: its error if no retry helps, else noted, and `Ok`
    /// after a pause (none once the deadline has passed).
    async fn retry(
        &mut self,
        what: &str,
        e: etcd_client::Error,
        deadline: Deadline,
        backoff: &mut Backoff,
    ) -> Result<()> {
        if !is_transient(&e) {
            return Err(from_etcd(what, e));
        }
        self.failed(from_etcd(what, e));
        if !deadline.has_passed() {
            backoff.wait().await;
        }
        Ok(())
    }

    /// etcd answered.
    fn answered(&mut self) {
        self.last = None;
        self.count = 0;
    }
}
