//! A contender's key on the server: the transactions that put it and look at the lock, and
//! its delete, retried until the key is gone, whenever no hold answers for it any more.

use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;

use dlock_core::backend::{Backoff, UndoOnDrop, later};
use dlock_core::{LockGuard, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::error::{from_etcd, is_transient};
use crate::retry::{RETRY_MAX, RETRY_MIN};
use crate::session::{Claim, Session};

/// The key range of lock name `lock_name`: `{lock_name}/`, as etcd's lock has it.
pub(crate) fn range(lock_name: &str) -> String {
    format!("{lock_name}/")
}

/// The first key of a range by create revision: the holder.
pub(crate) fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// What a look at the lock found: this contender's key's create revision (0: it has none),
/// and the holder's (0: nobody holds it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Look {
    pub(crate) mine: i64,
    pub(crate) holder: i64,
}

/// What the put transaction of [`enter`] answered: whether it created the key, and the look.
pub(crate) type Entered = std::result::Result<(bool, Look), etcd_client::Error>;

fn create_revision(resp: &TxnOpResponse) -> i64 {
    match resp {
        TxnOpResponse::Get(g) => g.kvs().first().map_or(0, |kv| kv.create_revision()),
        TxnOpResponse::Put(_) | TxnOpResponse::Delete(_) | TxnOpResponse::Txn(_) => 0,
    }
}

/// The look in the answers `ops` from index `from` on: this contender's key, then the holder.
fn look_from(ops: &[TxnOpResponse], from: usize) -> Look {
    Look {
        mine: ops.get(from).map_or(0, create_revision),
        holder: ops.get(from + 1).map_or(0, create_revision),
    }
}

/// Puts this contender's key with `value` (empty for a lock, the proposal in an election) if
/// it has none, and reads its create revision and the holder's, in one transaction.
pub(crate) async fn enter(
    session: &Session,
    lease: i64,
    key: &str,
    value: &[u8],
    range: &str,
) -> Entered {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(key, None),
            TxnOp::get(range, Some(first_created())),
        ])
        .or_else([
            TxnOp::get(key, None),
            TxnOp::get(range, Some(first_created())),
        ]);
    let resp = session.txn(Some(lease), txn).await?;
    let created = resp.succeeded();
    Ok((
        created,
        look_from(&resp.op_responses(), usize::from(created)),
    ))
}

/// Reads this contender's create revision and the holder's.
pub(crate) async fn look(
    session: &Session,
    key: &str,
    range: &str,
) -> std::result::Result<Look, etcd_client::Error> {
    let txn = Txn::new().and_then([
        TxnOp::get(key, None),
        TxnOp::get(range, Some(first_created())),
    ]);
    let resp = session.txn(None, txn).await?;
    Ok(look_from(&resp.op_responses(), 0))
}

/// Deletes `key` (only if it still has create revision `rev`, when given), retrying transient
/// errors for at most the lease's time-to-live: after that the lease ends the key anyway.
/// Returns whether the key was ours and is gone now. A retry that finds the key gone after
/// an attempt whose answer was lost counts as deleted: that attempt may well have been
/// applied (the key is this contender's alone; only the lease's end deletes it otherwise,
/// and then it is gone either way).
pub(crate) async fn delete_key(session: &Session, key: &str, rev: Option<i64>) -> Result<bool> {
    let give_up = later(Instant::now(), session.config.lease_ttl);
    let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
    let mut answer_lost = false;
    loop {
        let mut txn = Txn::new();
        if let Some(rev) = rev {
            txn = txn.when([Compare::create_revision(key, CompareOp::Equal, rev)]);
        }
        txn = txn.and_then([TxnOp::delete(key, None)]);
        match session.txn(None, txn).await {
            Ok(resp) => return Ok(resp.succeeded() || answer_lost),
            Err(e) if is_transient(&e) && Instant::now() < give_up => {
                answer_lost = true;
                backoff.wait().await;
            }
            Err(e) => return Err(from_etcd(&format!("delete {key}"), e)),
        }
    }
}

/// Deletes the claimed key (if it still has create revision `rev`, when given) in the
/// background until it is gone, the lease it was put with has ended (the server deletes it
/// with the lease), or the provider is dropped (which revokes the lease); then gives the
/// claim back. A key whose delete failed is never left behind while its lease lives: it
/// would keep the lock from everyone else for the provider's whole life.
async fn delete_until_gone(session: Weak<Session>, rev: Option<i64>, claim: Claim) {
    let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
    loop {
        let Some(s) = session.upgrade() else { return };
        if s.lease_now() != Some(claim.lease) {
            return;
        }
        match delete_key(&s, &claim.key, rev).await {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(key = %claim.key, error = %e, "etcd: deleting a key failed; again");
            }
        }
        drop(s);
        backoff.wait().await;
    }
}

/// A key this provider put, or is putting, that no hold answers for: what an acquisition
/// leaves if it ends without the lock, or a hold dropped without a release. Undone by
/// deleting the key ([`delete_until_gone`]), and only then is its claim given back.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) claim: Claim,
    /// The key's create revision once known: the delete then spares another key of the name.
    pub(crate) rev: Option<i64>,
    /// The put in flight, if any. It runs in a task of its own and is never cut off midway:
    /// a put cancelled on the wire could still reach the cluster after the undo's delete
    /// (another member, another connection) and leave a key nobody deletes. The undo waits
    /// for it to finish, then deletes.
    put: Option<JoinHandle<Entered>>,
    /// Not deleted before then: a leaked hold's client-side lease end.
    pub(crate) not_before: Option<Instant>,
}

impl Pending {
    /// A key being put with `claim` by `put`.
    pub(crate) fn put(claim: Claim, put: JoinHandle<Entered>) -> Self {
        Self {
            claim,
            rev: None,
            put: Some(put),
            not_before: None,
        }
    }

    /// Deletes the key once the put has finished and `not_before` has passed.
    pub(crate) async fn delete(self) {
        let Self {
            claim,
            rev,
            put,
            not_before,
        } = self;
        if let Some(put) = put {
            let _ = put.await;
        }
        if let Some(at) = not_before {
            sleep_until(at).await;
        }
        delete_until_gone(claim.session(), rev, claim).await;
    }
}

type Deleting = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A [`Pending`] key, deleted in the background if dropped armed.
pub(crate) type KeyUndo = UndoOnDrop<Pending, fn(Pending) -> Deleting>;

/// Nothing to delete yet.
pub(crate) fn undo() -> KeyUndo {
    fn delete(p: Pending) -> Deleting {
        Box::pin(p.delete())
    }
    UndoOnDrop::new(delete as fn(Pending) -> Deleting)
}

/// The answer of the put in flight, once it has finished (`None`: none is in flight). Cut
/// off meanwhile, the put goes on, and the undo waits for it before it deletes.
pub(crate) async fn put_answer(undo: &mut KeyUndo) -> Option<Entered> {
    let put = undo.state_mut()?.put.as_mut()?;
    let answer = put.await;
    if let Some(p) = undo.state_mut() {
        p.put = None;
    }
    Some(answer.unwrap_or_else(|e| Err(etcd_client::Error::IoError(std::io::Error::other(e)))))
}

/// The acquisition ended without the lock: deletes the key before returning `outcome`, so a
/// caller that tries again at once (or another handle of this provider) does not find it
/// queued. A key of a lease that is no longer live is not deleted: it goes with its lease,
/// which nobody keeps alive any more. Cut off (the core's grace after the deadline), or if
/// the delete fails, the undo deletes the key in the background; a failed delete is then the
/// answer instead of "held" (`Ok(None)`).
pub(crate) async fn give_up(
    undo: &mut KeyUndo,
    session: &Session,
    outcome: Result<Option<LockGuard>>,
) -> Result<Option<LockGuard>> {
    let _ = put_answer(undo).await;
    if let Some(p) = undo.state_mut()
        && session.lease_now() == Some(p.claim.lease)
        && let Err(e) = delete_key(session, &p.claim.key, None).await
    {
        return outcome.and(Err(e));
    }
    undo.disarm();
    outcome
}
