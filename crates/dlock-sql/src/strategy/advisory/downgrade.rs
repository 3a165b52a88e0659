//! A downgrade: a read asked while this handle holds the write is taken on the write's own
//! session, the only one the server lets in beside it (even with writers queued, where a
//! try would be refused).

use std::sync::{Arc, Weak};

use dlock_core::backend::{HoldSignal, Mutex, UndoOnDrop, later};
use dlock_core::{Error, Lease, LockName, LossReason, Result};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Advisory, AdvisoryGrant, AdvisoryHold, Unlock, release};
use crate::db::query;
use crate::error::{Meaning, from_sqlx, meaning};
use crate::pinned::session::Membership;
use crate::pinned::{FixedEnd, HoldingConnection, Pinned, Session};
use crate::sql::AdvisoryMode;
use crate::strategy::{Attempt, Grant};

/// How long a downgrade may wait on the write hold's session, in milliseconds: a session
/// that holds the write is granted the read at once.
const BESIDE_WAIT_MS: i64 = 1000;

/// Where a write hold lives, for a downgrade.
#[derive(Debug, Clone)]
pub(crate) struct WriteSession {
    conn: Weak<tokio::sync::Mutex<Pinned>>,
    session: Session,
    key: i32,
}

impl AdvisoryGrant {
    /// Where this grant's hold lives, for a downgrade while it is held.
    pub(crate) fn write_session(&self) -> WriteSession {
        let pinned = &self.hold.pinned;
        WriteSession {
            conn: Arc::downgrade(&pinned.conn),
            session: pinned.session.clone(),
            key: self.hold.how.key,
        }
    }
}

/// What a downgrade came to.
#[derive(Debug)]
enum Beside {
    /// The read, with its token, when its statement was sent, and its place in the session.
    Granted {
        token: u64,
        sent: Instant,
        membership: Arc<Membership>,
    },
    /// The write's session is gone (released, lost or closed): the read is to be taken like
    /// any other.
    SessionGone,
    /// The name's key row is gone (deleted by hand): no token to give; the read was given
    /// back.
    KeyGone,
}

impl Advisory {
    /// A downgrade: the read of `a`'s name on the session of `write`. `Ok(None)` if that
    /// session is gone (the read is then taken like any other).
    pub(crate) async fn downgrade(
        self: &Arc<Self>,
        write: &WriteSession,
        a: Attempt,
    ) -> Result<Option<Grant>> {
        let Some(conn) = write.conn.upgrade() else {
            return Ok(None);
        };
        let session = write.session.clone();
        let signal = HoldSignal::new();
        let fixed: FixedEnd = Arc::new(Mutex::new(None));
        let outcome = self
            .beside(
                &a.name,
                &conn,
                &session,
                write.key,
                a.lease,
                signal.clone(),
                Arc::clone(&fixed),
            )
            .await?;
        let (token, sent, membership) = match outcome {
            Beside::Granted {
                token,
                sent,
                membership,
            } => (token, sent, membership),
            Beside::SessionGone => return Ok(None),
            // The name gets a key again on its next grant, as in a first acquire.
            Beside::KeyGone => return Err(self.key_gone(&a.name)),
        };
        let pinned = self
            .pinning
            .hold_in(a, conn, signal, fixed, session, membership);
        let granted = AdvisoryGrant {
            hold: AdvisoryHold {
                pinned,
                how: Unlock {
                    strategy: Arc::clone(self),
                    key: write.key,
                    mode: AdvisoryMode::Shared,
                },
            },
            token,
            sent,
        };
        Ok(Some(granted.into_grant()))
    }

    /// Takes the shared advisory lock of `key` (`name`'s) on `conn`, the session of this handle's write
    /// hold: the server grants a session a lock that only its own locks stand in the way
    /// of, so the read is granted at once beside the write. The new hold joins `session`
    /// under the session's lock, before anything can release the write (whose release would
    /// otherwise free the read with the session), with `signal` and `fixed` (its fixed
    /// lease's end, set here from when the statement was sent).
    ///
    /// Cancel safe: the statements run in a task of their own, under the session's lock,
    /// and a read granted after the acquisition was dropped is given back there.
    #[allow(clippy::too_many_arguments)]
    async fn beside(
        self: &Arc<Self>,
        name: &LockName,
        conn: &HoldingConnection,
        session: &Session,
        key: i32,
        lease: Lease,
        signal: HoldSignal,
        fixed: FixedEnd,
    ) -> Result<Beside> {
        let (tx, rx) = oneshot::channel();
        // If this future is dropped after the task answered but before the answer was read,
        // the read is given back here.
        let give_back = (Arc::clone(self), Arc::clone(conn), session.clone());
        let mut answer = UndoOnDrop::new(
            move |mut rx: oneshot::Receiver<std::result::Result<Beside, sqlx::Error>>| {
                let (strategy, conn, session) = give_back.clone();
                async move {
                    if let Ok(Ok(Beside::Granted { membership, .. })) = rx.try_recv() {
                        let mode = AdvisoryMode::Shared;
                        release(strategy, conn, session, membership, key, mode).await;
                    }
                }
            },
        );
        answer.arm(rx);
        let (strategy, conn, session) = (Arc::clone(self), Arc::clone(conn), session.clone());
        let name = name.clone();
        tokio::spawn(async move {
            let mut c = conn.lock_owned().await;
            let outcome = strategy
                .beside_on(&mut c, &session, key, lease, signal, fixed)
                .await;
            if let Err(Ok(Beside::Granted { membership, .. })) = tx.send(outcome) {
                // Nobody took the read: give it back, keeping the write.
                let _ = session.leave(&membership);
                let unlock = &strategy.sql.unlock_one[AdvisoryMode::Shared.index()];
                if !c.unlock_one(unlock, key).await {
                    tracing::debug!(lock = %name, "could not give back the read of a dropped downgrade; its session is closed");
                    close_and_lose(&mut c, &session);
                }
            }
        });
        let answered = match answer.state_mut() {
            Some(rx) => rx.await,
            None => {
                return Err(from_sqlx(
                    self.pinning.inner.backend,
                    "downgrade",
                    sqlx::Error::PoolClosed,
                ));
            }
        };
        answer.disarm();
        match answered {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(e)) => Err(self.pinning.inner.err("downgrade")(e)),
            Err(_) => Err(Error::backend_failed(
                self.pinning.inner.backend,
                "the downgrade's task ended without an answer",
                true,
            )),
        }
    }

    /// The statements of [`beside`](Self::beside), on the write hold's session (locked).
    async fn beside_on(
        &self,
        c: &mut Pinned,
        session: &Session,
        key: i32,
        lease: Lease,
        signal: HoldSignal,
        fixed: FixedEnd,
    ) -> std::result::Result<Beside, sqlx::Error> {
        let s = &self.sql;
        if session.is_closed() {
            return Ok(Beside::SessionGone);
        }
        let Some(conn) = c.conn_mut() else {
            return Ok(Beside::SessionGone);
        };
        // A session that holds the write gets the read at once; one that does not must not
        // wait here (it would hold up the write hold's renewals).
        let setup = query(&s.lock_timeout)
            .bind(BESIDE_WAIT_MS)
            .execute(&mut *conn)
            .await;
        let sent = Instant::now();
        let granted = match setup {
            Ok(_) => {
                query(&s.lock[AdvisoryMode::Shared.index()])
                    .bind(i64::from(key))
                    .fetch_one(&mut *conn)
                    .await
            }
            Err(e) => Err(e),
        };
        let unlock = &s.unlock_one[AdvisoryMode::Shared.index()];
        let row = match granted {
            Ok(row) => row,
            // Busy after a short wait on the write's own session: most likely the token's
            // UPDATE waited on the name's row (another session taking a token), after the
            // read was granted in the same statement (a session's advisory lock outlives a
            // failed statement): it is given back. An error, not a read taken like any
            // other, which would wait behind this handle's own write.
            Err(e) if meaning(&e) == Meaning::Busy => {
                // Not granted (nothing to give back), or the session broke.
                if !c.unlock_one(unlock, key).await && c.is_gone() {
                    close_and_lose(c, session);
                }
                return Err(e);
            }
            Err(e) => {
                // The session broke: so did every hold in it, the write included. The read
                // is taken like any other.
                close_and_lose(c, session);
                tracing::debug!(error = %e, "the write's session broke during a downgrade");
                return Ok(Beside::SessionGone);
            }
        };
        let token = match row.optional_int(0) {
            Ok(token) => token.and_then(|t| u64::try_from(t).ok()),
            Err(e) => {
                close_and_lose(c, session);
                return Err(e);
            }
        };
        let Some(token) = token else {
            // The name's row is gone: no token to give. The read is given back; the caller
            // forgets the key and fails retryably, as a first grant does.
            if !c.unlock_one(unlock, key).await {
                close_and_lose(c, session);
            }
            return Ok(Beside::KeyGone);
        };
        if !lease.is_watchdog() {
            *fixed.lock() = Some(later(sent, lease.ttl()));
        }
        let Some(membership) = session.join(&signal, Arc::clone(&fixed), lease.ttl()) else {
            // Closed meanwhile (cannot happen under the session's lock, but a read must never
            // be handed out on a session nobody watches).
            if !c.unlock_one(unlock, key).await {
                close_and_lose(c, session);
            }
            return Ok(Beside::SessionGone);
        };
        // The server-side lease covers the new read too (the session's was set for the
        // write).
        let server = session.server_lease(&fixed, lease.ttl());
        if c.renew(&s.hold_timeout, server).await.is_err() {
            // `renew` closed the session, and with it every hold in it: the read was never
            // handed out, and is taken like any other.
            let _ = session.leave(&membership);
            session.lose(LossReason::ConnectionLost);
            return Ok(Beside::SessionGone);
        }
        Ok(Beside::Granted {
            token,
            sent,
            membership: Arc::new(membership),
        })
    }
}

/// Closes a pinned session that broke or could not be put right, and marks every hold in it
/// lost: closing the connection ends every lock its session held.
fn close_and_lose(c: &mut Pinned, session: &Session) {
    c.close();
    session.lose(LossReason::ConnectionLost);
}
