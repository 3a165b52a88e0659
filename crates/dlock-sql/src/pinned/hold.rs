//! The part of a pinned hold that its connection makes: the connection is checked between
//! renewals, a renewal sets the server-side lease again, and a fixed lease is enforced by the
//! server too. The strategies add the release (ending the transaction, unlocking the key).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Hold, HoldSignal, later};
use dlock_core::{Error, LockName, LossReason, Result, async_trait};
use tokio::time::Instant;

use super::session::{FixedEnd, Membership, Session, ping_limit};
use super::{Holders, HoldingConnection};

/// A hold that lives in a pinned connection's session, with what every such hold keeps: its
/// connection (shared with the session's watcher and the other holds of the session), its
/// loss signal, its fixed lease's end and its place in the session.
#[derive(Debug)]
pub(crate) struct PinnedHold {
    pub(crate) name: LockName,
    pub(crate) owner: String,
    /// The lease's length.
    pub(crate) ttl: Duration,
    pub(crate) conn: HoldingConnection,
    pub(crate) signal: HoldSignal,
    pub(crate) fixed: FixedEnd,
    pub(crate) session: Session,
    pub(crate) membership: Arc<Membership>,
    /// The statement that sets the hold's server-side lease (`?`: seconds).
    pub(super) renew: Arc<str>,
    /// The strategy's live holds, which this one leaves when released or dropped.
    pub(super) holders: Arc<Holders>,
}

/// How a pinned strategy gives one of its holds back (ends the transaction, unlocks the key),
/// and what it does with one dropped unreleased.
#[async_trait]
pub(crate) trait Release: fmt::Debug + Send + Sync + 'static {
    /// Gives `hold` back: whether its session held it.
    async fn release(&self, hold: &PinnedHold) -> bool;

    /// `hold` is dropped (released or not).
    fn dropped(&self, hold: &PinnedHold) {
        let _ = hold;
    }
}

/// The hold of a pinned strategy: what the connection makes, and how the strategy gives it
/// back.
#[derive(Debug)]
pub(crate) struct Held<R: Release> {
    pub(crate) pinned: PinnedHold,
    pub(crate) how: R,
}

#[async_trait]
impl<R: Release> Hold for Held<R> {
    async fn release(&self) -> Result<()> {
        self.pinned.forget();
        if self.how.release(&self.pinned).await {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.pinned.name))
        }
    }

    async fn verify(&self) -> Result<bool> {
        self.pinned.verify().await
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        self.pinned.extend(ttl).await
    }
}

impl<R: Release> Drop for Held<R> {
    fn drop(&mut self) {
        self.how.dropped(&self.pinned);
    }
}

impl PinnedHold {
    /// The hold is no longer live (released, or dropped): it leaves the strategy's holders.
    pub(crate) fn forget(&self) {
        self.holders.forget(&self.owner);
    }

    /// Every hold of the session is lost with it (its connection is gone).
    fn lose_session(&self) {
        self.signal.mark_lost(LossReason::ConnectionLost);
        self.session.lose(LossReason::ConnectionLost);
    }

    /// Asks the holding connection (a ping): the lock lives as long as it does.
    pub(crate) async fn verify(&self) -> Result<bool> {
        let limit = ping_limit(self.ttl);
        let alive = self.conn.lock().await.ping(limit).await == Some(true);
        if !alive {
            self.lose_session();
        }
        Ok(alive)
    }

    /// Renews the hold: the server keeps the lock while the connection lives, and keeps the
    /// connection while it is idle no longer than its server-side lease, set here to `ttl`
    /// (or what the other holds of the session still need, if more).
    pub(crate) async fn extend(&self, ttl: Duration) -> Result<()> {
        // One lock of the connection across the renewal and the new end (see `watch`).
        let mut c = self.conn.lock().await;
        let sent = Instant::now();
        let server = self.session.server_lease(&self.fixed, ttl);
        let alive = c.renew(&self.renew, server).await.is_ok();
        if !alive {
            self.lose_session();
        } else if let Some(end) = self.fixed.lock().as_mut() {
            // The watcher holds the server to the new end.
            *end = later(sent, ttl);
        }
        drop(c);
        if alive {
            Ok(())
        } else {
            Err(Error::lock_lost(&self.name))
        }
    }
}

impl Drop for PinnedHold {
    fn drop(&mut self) {
        self.forget();
    }
}
