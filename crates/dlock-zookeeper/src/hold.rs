//! The hold a granted node becomes: registered with its session for suspension and loss,
//! renewed by looking at its node, released by deleting it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::backend::{Hold, HoldSignal, Mutex, NewHold, Registration, later, renewal_window};
use dlock_core::{
    Error, FencingToken, Lease, LockGuard, LockKind, LockName, LossReason, Result, async_trait,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::create::Created;
use crate::error::{for_hold, from_zk};
use crate::session::{Node, Session};
use crate::undo::NodeUndo;

/// The backend side of a hold: one node (a lock, read, write or lease node) to delete.
#[derive(Debug)]
pub(crate) struct ZkHold {
    session: Arc<Session>,
    name: LockName,
    path: String,
    /// The session that owns the node: once it is no longer live, the node is gone with it.
    node_session: i64,
    /// Its place among the session's live holds; `None` once released (or if it was lost on
    /// arrival).
    registration: Mutex<Option<Registration<()>>>,
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
    let registered = session.register(name, &signal, created.session);
    let (registration, horizon) = registered.map_or((None, None), |(r, h)| (Some(r), Some(h)));
    let hold = ZkHold {
        session: Arc::clone(session),
        name: name.clone(),
        path: created.path.clone(),
        node_session: created.session,
        registration: Mutex::new(registration),
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

/// Deletes `path` in the background from `at` on, retrying until the server answers or the
/// session ends (which removes the node anyway).
fn delete_in_background(session: &Arc<Session>, path: String, at: Instant) {
    let owned = Arc::clone(session);
    session.spawn(async move {
        tokio::time::sleep_until(at).await;
        if let Err(e) = owned.delete_guaranteed(&path).await {
            tracing::debug!(path, error = %e, "could not delete a hold's node; the session's end removes it");
        }
    });
}

#[async_trait]
impl Hold for ZkHold {
    async fn release(&self) -> Result<()> {
        self.released.store(true, Ordering::SeqCst);
        drop(self.registration.lock().take());
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
                delete_in_background(&self.session, self.path.clone(), Instant::now());
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
                *self.lease_end.lock() = later(sent, ttl);
                Ok(())
            }
            Ok(None) => Err(Error::lock_lost(&self.name)),
            // The renewal met the expiry before the session's state watcher did.
            Err(zk::Error::SessionExpired) => expired(),
            Err(e) => Err(for_hold(&self.name, &format!("exists {}", self.path), e)),
        }
    }

    async fn renew(&self, ttl: Duration) -> Result<()> {
        self.renew_in_batch(ttl).await
    }

    fn renews_in_batches(&self) -> bool {
        true
    }
}

impl ZkHold {
    /// The watchdog's renewal for `ttl`, in the session's next batch: whether the node is
    /// still there (its session keeps it alive).
    async fn renew_in_batch(&self, ttl: Duration) -> Result<()> {
        let sent = Instant::now();
        if !self.session.is_live(self.node_session) {
            self.signal.mark_lost(LossReason::SessionExpired);
            return Err(Error::lock_lost(&self.name));
        }
        match self
            .session
            .renewals
            .call(self.path.clone(), renewal_window(ttl))
            .await?
        {
            Node::There => {
                *self.lease_end.lock() = later(sent, ttl);
                Ok(())
            }
            Node::Gone => Err(Error::lock_lost(&self.name)),
            // The renewal met the expiry before the session's state watcher did.
            Node::Expired => {
                self.signal.mark_lost(LossReason::SessionExpired);
                Err(Error::lock_lost(&self.name))
            }
        }
    }
}

impl Drop for ZkHold {
    fn drop(&mut self) {
        if self.released.load(Ordering::SeqCst) || self.gone_with_session() {
            // Released, or gone with its session: no delete to send.
            return;
        }
        // Leaked: nobody renews it any more. End it when its lease would have run out.
        let end = *self.lease_end.lock();
        delete_in_background(&self.session, std::mem::take(&mut self.path), end);
    }
}
