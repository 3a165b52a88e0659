//! One hold: the contender's key once it has the lowest create revision, released by its
//! delete, renewed by keeping the provider's lease alive, and checked against the cluster.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{
    Backoff, Hold, HoldSignal, Mutex, NewHold, Registration, Request, from_now, later,
    renewal_window,
};
use dlock_core::{Error, FencingToken, LockGuard, LockKind, LockName, Result, async_trait};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::BACKEND;
use crate::error::from_etcd;
use crate::keys::{self, KeyUndo, Pending, delete_key};
use crate::renewals::Renewal;
use crate::retry::{RETRY_MAX, RETRY_MIN};
use crate::session::Session;

/// The guard of the key `key` of lease `lease`, created at revision `rev` (its token) by the
/// request sent at `sent`: the acquisition's undo hands the key to the hold.
pub(crate) fn grant(
    session: &Arc<Session>,
    req: &Request<'_>,
    lease: i64,
    key: String,
    rev: i64,
    sent: Instant,
    undo: &mut KeyUndo,
) -> LockGuard {
    let signal = HoldSignal::new();
    // The key lives as long as the provider's lease: the guard vouches for it no longer than
    // that lease's horizon (the last keep-alive the server answered, from its send, plus the
    // time-to-live it answered with), whatever the lock's own lease, so a process paused or
    // cut off past the time-to-live does not find its guard held.
    let (registration, horizon) = session.register(lease, &signal);
    let mut left = keys::undo();
    if let Some(mut pending) = undo.disarm() {
        pending.rev = Some(rev);
        pending.not_before = Some(later(sent, req.options.lease.ttl()));
        left.arm(pending);
    }
    let hold = EtcdHold {
        session: Arc::clone(session),
        name: req.name.clone(),
        key,
        rev,
        lease,
        live: Mutex::new(Some(Live {
            _registration: registration,
            left,
        })),
    };
    let token = FencingToken::new(u64::try_from(rev).unwrap_or(0));
    LockGuard::new(
        NewHold::new(
            BACKEND,
            LockKind::Mutex,
            req.name.clone(),
            token,
            req.options.lease,
            sent,
            Arc::new(hold),
        )
        .with_signal(signal)
        .with_horizon(horizon),
    )
}

/// One hold: the key, its create revision (the token) and the lease it lives in.
#[derive(Debug)]
pub(crate) struct EtcdHold {
    session: Arc<Session>,
    name: LockName,
    key: String,
    rev: i64,
    lease: i64,
    /// Until the hold is let go (released, or found gone).
    live: Mutex<Option<Live>>,
}

/// What a hold keeps until it is let go.
#[derive(Debug)]
struct Live {
    /// Its place among the session's live holds, left when dropped (`None`: lost on
    /// arrival).
    _registration: Option<Registration<()>>,
    /// The key, deleted if the hold is dropped without a release (leaked: nobody renews it
    /// any more) once its client-side lease would have run out, as far as the last renewal
    /// moved it; only then is the key given back to the provider.
    left: KeyUndo,
}

impl EtcdHold {
    /// Leaves the session's live holds; returns the key if it may still be on the server.
    fn let_go(&self) -> Option<Pending> {
        let live = self.live.lock().take();
        live.and_then(|mut l| l.left.disarm())
    }
}

#[async_trait]
impl Hold for EtcdHold {
    async fn release(&self) -> Result<()> {
        // A key lives no longer than its lease: once the provider's lease is not this hold's
        // any more, the server has deleted the key with it or will (the session revokes an
        // ended lease), and a delete of each would be a call per hold of that lease at the
        // moment the store has just been too slow to keep it. A hold lost to its lease's
        // horizon (its guard stops vouching up to a quarter of the lease's time-to-live
        // before) waits for the session to end the lease there, unless an answer comes; so
        // does a release while keep-alives go unanswered (at most that quarter and a second).
        if self
            .session
            .lease_ending(self.lease, self.session.config.lease_ttl / 4)
            .await
        {
            drop(self.let_go());
            return Err(Error::lock_lost(&self.name));
        }
        match delete_key(&self.session, &self.key, Some(self.rev)).await {
            // The key is gone: its claim is given back with it.
            Ok(true) => {
                drop(self.let_go());
                Ok(())
            }
            Ok(false) => {
                drop(self.let_go());
                Err(Error::lock_lost(&self.name))
            }
            // The key may still be there: it is deleted in the background (until its lease
            // ends), and only then given back.
            Err(e) => {
                if let Some(mut pending) = self.let_go()
                    && let Ok(runtime) = tokio::runtime::Handle::try_current()
                {
                    pending.not_before = None;
                    runtime.spawn(pending.delete());
                }
                Err(e)
            }
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        if self.session.lease_now() != Some(self.lease) {
            return Err(Error::lock_lost(&self.name));
        }
        let sent = Instant::now();
        // The key is only as alive as the provider's lease: keep that alive first, so its
        // horizon (which bounds the hold, whatever its new end) moves on from `sent`. Then
        // the key's compare says whether the hold lives: it is the authority, not the
        // keep-alive's answer (a keep-alive may fail, or come back empty, while the lease
        // lives).
        let until = later(sent, ttl.min(self.session.config.lease_ttl));
        let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
        loop {
            let kept = self.session.keep_now(self.lease, until).await;
            if !self.verify().await? {
                return Err(Error::lock_lost(&self.name));
            }
            match kept {
                Ok(true) => {
                    if let Some(live) = self.live.lock().as_mut()
                        && let Some(pending) = live.left.state_mut()
                    {
                        pending.not_before = Some(later(sent, ttl));
                    }
                    return Ok(());
                }
                Ok(false) | Err(_) if Instant::now() < until => {
                    tracing::debug!(key = %self.key, ?kept, "etcd: keep-alive not confirmed while the key lives; again");
                    let pause = backoff.next_pause();
                    tokio::time::sleep_until(from_now(pause).min(until)).await;
                }
                Ok(false) => {
                    return Err(Error::backend_failed(
                        BACKEND,
                        format!(
                            "the lease of {} was not kept alive in time, though the key lives",
                            self.key
                        ),
                        true,
                    ));
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn renew(&self, ttl: Duration) -> Result<()> {
        if self.session.lease_now() != Some(self.lease) {
            return Err(Error::lock_lost(&self.name));
        }
        let sent = Instant::now();
        let renewal = Renewal {
            key: self.key.clone(),
            rev: self.rev,
            lease: self.lease,
            ttl,
        };
        if !self
            .session
            .renewals
            .call(renewal, renewal_window(ttl))
            .await?
        {
            return Err(Error::lock_lost(&self.name));
        }
        if let Some(live) = self.live.lock().as_mut()
            && let Some(pending) = live.left.state_mut()
        {
            pending.not_before = Some(later(sent, ttl));
        }
        Ok(())
    }

    fn renews_in_batches(&self) -> bool {
        true
    }

    async fn verify(&self) -> Result<bool> {
        // The get is what makes the answer the cluster's: etcd serves a transaction without a
        // write from the member the client talks to, and one whose every operation is a
        // serializable get (vacuously, one with none) from that member's own state, without
        // asking the leader. A follower a heartbeat behind, or one cut off from the others,
        // would then vouch for a key the cluster already deleted, or deny one it just
        // created. A linearizable get makes the member catch up with the leader first.
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::get(
                self.key.as_str(),
                Some(GetOptions::new().with_count_only()),
            )]);
        match self.session.txn(Some(self.lease), txn).await {
            Ok(resp) => Ok(resp.succeeded()),
            Err(e) => Err(from_etcd(&format!("check {}", self.key), e)),
        }
    }
}
