//! The watchdog's renewals of a provider's holds, in batches: one keep-alive of the lease the
//! holds' keys live in, and one linearizable transaction of gets per [`TXN_OPS`] keys, each
//! key's create revision telling its hold whether it lives.

use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Batcher, later};
use dlock_core::{Error, Result};
use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use crate::BACKEND;
use crate::error::from_etcd;
use crate::session::Session;

/// The most operations one transaction carries: etcd's default `--max-txn-ops`.
const TXN_OPS: usize = 128;

/// One hold's renewal: its key, the create revision it was granted at, its lease, and the
/// lock's lease length.
#[derive(Debug)]
pub(crate) struct Renewal {
    pub(crate) key: String,
    pub(crate) rev: i64,
    pub(crate) lease: i64,
    pub(crate) ttl: Duration,
}

/// The batcher of `session`'s renewals (it holds the session weakly: the session owns it).
pub(crate) fn batcher(session: Weak<Session>) -> Batcher<Renewal, bool> {
    Batcher::with_owner(BACKEND, session, renew_all)
}

/// Renews one batch: whether each hold's key lives (`Ok(false)`: it is gone, or its lease is
/// not the provider's any more). A key that lives while the keep-alive was not confirmed is a
/// retryable error: the keeper tries again until the hold's end.
async fn renew_all(session: Arc<Session>, items: Vec<Renewal>) -> Vec<Result<bool>> {
    let Some(lease) = session.lease_now() else {
        return items.iter().map(|_| Ok(false)).collect();
    };
    let sent = Instant::now();
    // The keep-alive moves the lease's horizon on from `sent`; it must answer within the
    // shortest lease of the batch.
    let shortest = items
        .iter()
        .map(|r| r.ttl)
        .min()
        .unwrap_or(session.config.lease_ttl)
        .min(session.config.lease_ttl);
    let kept = session.keep_now(lease, later(sent, shortest)).await;
    let mut answers = Vec::with_capacity(items.len());
    for chunk in items.chunks(TXN_OPS) {
        match alive(&session, lease, chunk).await {
            Ok(alive) => answers.extend(alive.into_iter().map(|alive| match &kept {
                _ if !alive => Ok(false),
                Ok(true) => Ok(true),
                Ok(false) | Err(_) => Err(Error::backend_failed(
                    BACKEND,
                    format!("the lease {lease:x} was not kept alive in time, though the key lives"),
                    true,
                )),
            })),
            Err(e) => answers.extend(chunk.iter().map(|_| Err(e.duplicate()))),
        }
    }
    answers
}

/// Whether each of `chunk`'s keys is still there at its create revision, in `lease`, from one
/// linearizable transaction of gets (the member catches up with the leader first, so no
/// member a heartbeat behind vouches for a key the cluster deleted).
async fn alive(session: &Session, lease: i64, chunk: &[Renewal]) -> Result<Vec<bool>> {
    let gets: Vec<TxnOp> = chunk
        .iter()
        .map(|r| TxnOp::get(r.key.as_str(), Some(GetOptions::new().with_keys_only())))
        .collect();
    let resp = match session.txn(Some(lease), Txn::new().and_then(gets)).await {
        Ok(resp) => resp,
        // A cluster that allows fewer operations per transaction than etcd's default: each
        // key is asked alone.
        Err(e) if too_many_operations(&e) && chunk.len() > 1 => {
            let mut alive_each = Vec::with_capacity(chunk.len());
            for r in chunk {
                let one = Box::pin(alive(session, lease, std::slice::from_ref(r))).await?;
                alive_each.extend(one);
            }
            return Ok(alive_each);
        }
        Err(e) => return Err(from_etcd("renew: check the keys", e)),
    };
    let ops = resp.op_responses();
    if ops.len() != chunk.len() {
        return Err(Error::no_answer(
            BACKEND,
            format!("renew: {} answers to {} gets", ops.len(), chunk.len()),
        ));
    }
    Ok(chunk
        .iter()
        .zip(ops)
        .map(|(r, op)| match op {
            TxnOpResponse::Get(range) => range
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == r.rev && kv.lease() == r.lease),
            _ => false,
        })
        .collect())
}

/// Whether `e` is etcd's refusal of a transaction with more operations than its
/// `--max-txn-ops`.
fn too_many_operations(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(status)
        if status.code() == tonic::Code::InvalidArgument
            && status.message().contains("too many operations"))
}
