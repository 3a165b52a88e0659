//! The provider's client and its one lease: every lock key of the provider is attached to it,
//! and its end reports every hold taken under it lost. `keepalive.rs` grants it and keeps it
//! alive.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{
    Backoff, Batcher, HoldSet, HoldSignal, Horizon, Mutex, Registration, Tally, later,
};
use dlock_core::{Error, LossReason, Result};
use etcd_client::{Client, Txn, TxnResponse};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::BACKEND;
use crate::config::EtcdConfig;
use crate::error::{from_etcd, is_lease_gone};
use crate::renewals::Renewal;
use crate::retry::{RETRY_MAX, RETRY_MIN, seconds};
use crate::stats::EtcdStats;

/// The provider's lease as acquires see it.
#[derive(Clone, Debug)]
enum LeaseState {
    /// This lease is live.
    Live(i64),
    /// The lease ended and a new one is being granted; why the last grant failed, if one did.
    Granting(Option<GrantFailure>),
}

/// Why a grant of a new lease failed, for the acquires that wait for one: a copy of the
/// error without its source (the error type is not `Clone`).
#[derive(Clone, Debug)]
struct GrantFailure {
    message: String,
    connection: bool,
    retryable: bool,
}

impl GrantFailure {
    fn of(e: &Error) -> Self {
        let (message, connection) = match e {
            Error::Connection { message, .. } => (message.clone(), true),
            Error::Backend { message, .. } => (message.clone(), false),
            other => (other.to_string(), false),
        };
        Self {
            message,
            connection,
            retryable: e.is_retryable(),
        }
    }

    fn error(&self) -> Error {
        if self.connection {
            Error::no_answer(BACKEND, &self.message)
        } else {
            Error::backend_failed(BACKEND, &self.message, self.retryable)
        }
    }
}

/// The client and lease shared by every handle of a provider.
pub(crate) struct Session {
    pub(crate) config: EtcdConfig,
    pub(crate) store_id: Arc<str>,
    client: Client,
    /// The live lease, or why there is none from its end until a new one is granted.
    lease: watch::Sender<LeaseState>,
    /// The holds of the live lease: suspended while keep-alives fail, lost when it ends
    /// (closed from its end until a new lease is granted).
    holds: HoldSet,
    /// The lock keys `{name}/{lease}` in use by this provider's contenders. Two owners of one
    /// provider share the lease, so a second contender for a name takes a key of its own,
    /// `{name}/{lease}-{n}`; etcd orders them all by create revision alike.
    claimed: Mutex<HashSet<String>>,
    next_key: AtomicU64,
    /// The live lease and its horizon: the send time of the last request that kept it alive
    /// (its grant, or a keep-alive the server answered) plus the time-to-live the server
    /// answered with. The server keeps the lease at least until then, and no longer than that
    /// can the client vouch for its keys. A new lease gets a new horizon; the old one stays
    /// with the holds of the old lease, which are lost.
    horizon: Mutex<Option<(i64, Horizon)>>,
    /// The calls and wake-ups counted so far.
    pub(crate) counters: Tally<EtcdStats>,
    /// The watchdog's renewals of the holds, in batches ([`crate::renewals`]).
    pub(crate) renewals: Batcher<Renewal, bool>,
}

/// How long after its horizon a lease that no answer kept alive may still be live: the
/// keep-alive task ends it when its round, bounded by the horizon, fails.
const ENDING_GRACE: Duration = Duration::from_secs(1);

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdProvider")
            .field("store", &self.store_id)
            .field("lease", &self.lease_now())
            .finish()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Nothing uses the lease any more: revoke it, so a clean shutdown frees its keys at
        // once instead of at the end of the time-to-live.
        if let Some(lease) = self.lease_now() {
            self.revoke_soon(lease);
        }
    }
}

impl Session {
    /// A session over `client` with no lease yet: [`crate::keepalive::start`] grants it and
    /// keeps it alive.
    /// `me` is the session's own place (see [`Arc::new_cyclic`]), for its renewals.
    pub(crate) fn new(config: EtcdConfig, client: Client, me: Weak<Self>) -> Self {
        Self {
            renewals: crate::renewals::batcher(me),
            store_id: config.store_id().into(),
            client,
            lease: watch::channel(LeaseState::Granting(None)).0,
            holds: HoldSet::new(),
            claimed: Mutex::new(HashSet::new()),
            next_key: AtomicU64::new(1),
            horizon: Mutex::new(None),
            counters: Tally::default(),
            config,
        }
    }

    /// A new lease, and the time-to-live the server granted it (etcd raises one below its
    /// minimum, about one and a half election timeouts).
    pub(crate) async fn grant(&self) -> Result<(i64, Duration)> {
        self.counters.count(|s| &mut s.leases);
        let mut client = self.client.clone();
        self.bounded(client.lease_grant(self.config.ttl_secs(), None))
            .await
            .map(|r| (r.id(), seconds(r.ttl())))
            .map_err(|e| from_etcd(&format!("grant a lease on {}", self.store_id), e))
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// `call`, ended with a timeout error once the lease's time-to-live has passed without
    /// its answer: by then it is of no use (a partition, a frozen member). The client dlock
    /// connects has that limit on every call already; one the application gives
    /// ([`EtcdProvider::from_client`](crate::EtcdProvider::from_client)) may have none, and
    /// a call on it would wait for as long as its connection stays open.
    pub(crate) async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, etcd_client::Error> {
        let limit = self.config.lease_ttl;
        match tokio::time::timeout_at(later(Instant::now(), limit), call).await {
            Ok(answered) => answered,
            Err(_) => Err(etcd_client::Error::GRpcStatus(
                tonic::Status::deadline_exceeded(format!(
                    "no answer from {} within {limit:?}",
                    self.store_id
                )),
            )),
        }
    }

    /// Lease `lease` was granted `ttl` by a request sent at `sent`: it is the live lease
    /// now, with a horizon of its own, and carries new holds. The horizon is no answer's
    /// yet, so a hold found past it is lost as [`LossReason::SessionTimedOut`].
    pub(crate) fn lease_granted(&self, lease: i64, sent: Instant, ttl: Duration) {
        // Recorded with its horizon before it turns live: a live lease has its horizon.
        let horizon = Horizon::new(later(sent, ttl), LossReason::SessionTimedOut);
        *self.horizon.lock() = Some((lease, horizon));
        self.holds.reopen();
        self.lease.send_replace(LeaseState::Live(lease));
    }

    /// No new lease could be granted: the acquires waiting for one learn why.
    pub(crate) fn grant_failed(&self, e: &Error) {
        self.lease
            .send_replace(LeaseState::Granting(Some(GrantFailure::of(e))));
    }

    /// Lease `lease` was kept alive for `ttl` by a request sent at `sent`: its horizon moves
    /// on (never back). Ignored for a lease that is not the one recorded (an older lease's
    /// late answer must not move the live one's).
    pub(crate) fn record_kept(&self, lease: i64, sent: Instant, ttl: Duration) {
        if let Some((l, horizon)) = self.horizon.lock().as_ref()
            && *l == lease
        {
            horizon.advance(later(sent, ttl));
        }
    }

    /// Lease `lease`'s horizon (`None` once another lease replaced it): the server keeps the
    /// lease at least until then.
    pub(crate) fn horizon_of(&self, lease: i64) -> Option<Horizon> {
        match self.horizon.lock().as_ref() {
            Some((l, horizon)) if *l == lease => Some(horizon.clone()),
            _ => None,
        }
    }

    /// The live lease, waiting for a new one while it is being replaced. A grant made during
    /// the wait that failed in a way no retry helps (a full database, refused credentials)
    /// ends it with its error; the provider goes on trying in the background, for later
    /// calls. (A failure from before the wait is not the answer: an operator may have fixed
    /// the cause since, which the next grant, a backoff away, will tell.)
    pub(crate) async fn lease(&self) -> Result<i64> {
        let mut rx = self.lease.subscribe();
        let mut before = true;
        loop {
            match &*rx.borrow_and_update() {
                LeaseState::Live(l) => return Ok(*l),
                LeaseState::Granting(Some(f)) if !f.retryable && !before => {
                    return Err(f.error());
                }
                LeaseState::Granting(_) => {}
            }
            before = false;
            if rx.changed().await.is_err() {
                // The sender lives in `self`: unreachable while `self` is borrowed.
                std::future::pending::<()>().await;
            }
        }
    }

    /// The lease's id right now, if one is live.
    pub(crate) fn lease_now(&self) -> Option<i64> {
        match *self.lease.borrow() {
            LeaseState::Live(l) => Some(l),
            LeaseState::Granting(_) => None,
        }
    }

    /// Whether `lease` is over for good or about to be: not the live lease any more, or its
    /// horizon is `soon` away or less (no keep-alive answered in time) and the keep-alive
    /// task ends it at that horizon, which this waits for (plus [`ENDING_GRACE`]). `false`
    /// once an answer moves the horizon further than `soon`, and if the lease is still live
    /// past the grace.
    pub(crate) async fn lease_ending(&self, lease: i64, soon: Duration) -> bool {
        let mut changes = self.lease.subscribe();
        loop {
            changes.mark_unchanged();
            if self.lease_now() != Some(lease) {
                return true;
            }
            let Some(at) = self.horizon_of(lease).map(|h| h.at()) else {
                return false;
            };
            let now = Instant::now();
            let last = later(at, ENDING_GRACE);
            if at > later(now, soon) || now >= last {
                return false;
            }
            // Woken when the lease ends, at the horizon (an answer may have moved it), and
            // at the end of the grace.
            let wake = if now < at { at } else { last };
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// While a new lease is being granted: the last grant's failure, if one failed.
    pub(crate) fn grant_failure(&self) -> Option<Error> {
        match &*self.lease.borrow() {
            LeaseState::Granting(Some(f)) => Some(f.error()),
            LeaseState::Granting(None) | LeaseState::Live(_) => None,
        }
    }

    /// The error of an acquire that could not wait longer for a new lease, when no grant
    /// failed (yet): the store did not answer in time.
    pub(crate) fn no_lease(&self) -> Error {
        Error::no_answer(
            BACKEND,
            format!(
                "the lease on {} ended, and no new one was granted in time",
                self.store_id
            ),
        )
    }

    /// Ends lease `lease` for this client: every hold under it is lost; acquires wait for the
    /// next lease.
    pub(crate) fn lease_ended(&self, lease: i64, reason: LossReason) {
        let ended = self.lease.send_if_modified(|l| {
            if matches!(l, LeaseState::Live(live) if *live == lease) {
                *l = LeaseState::Granting(None);
                true
            } else {
                false
            }
        });
        if !ended {
            return;
        }
        tracing::warn!(store = %self.store_id, lease, "etcd lease ended: its holds are lost");
        // The holds registered are the ended lease's: a hold registers only while its lease
        // is live (see `register`), and the set stays closed until the next lease is granted.
        self.holds.close(reason);
        // Its keys go with it in one call, where the server still has it (its answers were
        // late, not lost): no hold deletes its own key once its lease is not live.
        self.revoke_soon(lease);
    }

    /// Revokes `lease` in the background, trying again after a failure for at most the
    /// lease's time-to-live (by then the server has ended it anyway: nothing keeps it alive):
    /// the server deletes its keys at once instead of at the end of the time-to-live.
    fn revoke_soon(&self, lease: i64) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let mut client = self.client.clone();
            let limit = later(Instant::now(), self.config.lease_ttl);
            runtime.spawn(async move {
                let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
                let revoked = async {
                    // A lease the server no longer has is an error too: nothing to revoke.
                    while let Err(e) = client.lease_revoke(lease).await {
                        if is_lease_gone(&e) {
                            return;
                        }
                        backoff.wait().await;
                    }
                };
                let _ = tokio::time::timeout_at(limit, revoked).await;
            });
        }
    }

    /// Registers a live hold's signal under `lease`, and returns its registration and the
    /// lease's horizon, which bounds the hold. A hold of a lease that is no longer live is
    /// lost at once, without a registration (its horizon is then one that has passed).
    pub(crate) fn register(
        &self,
        lease: i64,
        signal: &HoldSignal,
    ) -> (Option<Registration<()>>, Horizon) {
        let registration = self.holds.register(signal, ());
        // Checked once registered: the lease turns not live before its holds are lost, so
        // either this sees it ended or its end finds the hold in the set.
        match self.horizon_of(lease) {
            Some(h) if self.lease_now() == Some(lease) => (Some(registration), h),
            _ => {
                drop(registration);
                signal.mark_lost(LossReason::SessionExpired);
                (
                    None,
                    Horizon::new(Instant::now(), LossReason::SessionExpired),
                )
            }
        }
    }

    /// Live holds of this provider (for tests).
    pub(crate) fn live_holds(&self) -> usize {
        self.holds.len()
    }

    /// Suspends the holds while keep-alives fail (`true`), or vouches for them again.
    pub(crate) fn set_suspended(&self, suspended: bool) {
        self.holds.suspend_all(suspended);
    }

    /// A key for one contender under `range` with `lease`: `{range}{lease:x}` (the key etcd's
    /// own lock uses) unless another contender of this provider has it, else one of its own.
    pub(crate) fn claim(self: &Arc<Self>, range: &str, lease: i64) -> Claim {
        let canonical = format!("{range}{lease:x}");
        if self.claimed.lock().insert(canonical.clone()) {
            return Claim {
                session: Arc::downgrade(self),
                key: canonical,
                lease,
                canonical: true,
            };
        }
        let n = self.next_key.fetch_add(1, Ordering::Relaxed);
        Claim {
            session: Arc::downgrade(self),
            key: format!("{canonical}-{n:x}"),
            lease,
            canonical: false,
        }
    }

    /// A transaction, counted. A lease that is gone is noted (its holds are lost).
    pub(crate) async fn txn(
        &self,
        lease: Option<i64>,
        txn: Txn,
    ) -> Result<TxnResponse, etcd_client::Error> {
        self.counters.count(|s| &mut s.txns);
        let mut client = self.client.clone();
        let result = self.bounded(client.txn(txn)).await;
        if let (Err(e), Some(lease)) = (&result, lease)
            && is_lease_gone(e)
        {
            self.lease_ended(lease, LossReason::SessionExpired);
        }
        result
    }

    pub(crate) fn stats(&self) -> EtcdStats {
        self.counters.get()
    }
}

/// A contender's key, reserved in its provider until dropped (after the key was deleted).
/// It does not keep the provider alive: a provider dropped meanwhile revokes its lease, and
/// the key goes with it.
#[derive(Debug)]
pub(crate) struct Claim {
    session: Weak<Session>,
    pub(crate) key: String,
    /// The lease the key is put with.
    pub(crate) lease: i64,
    canonical: bool,
}

impl Claim {
    /// The provider that reserved the key, while it lives.
    pub(crate) fn session(&self) -> Weak<Session> {
        Weak::clone(&self.session)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.canonical
            && let Some(session) = self.session.upgrade()
        {
            session.claimed.lock().remove(&self.key);
        }
    }
}
