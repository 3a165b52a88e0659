//! The provider's client and its one lease: every lock key of the provider is attached to it,
//! a background task keeps it alive, and its end reports every hold taken under it lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use dlock_core::backend::{Backoff, HoldSignal, Horizon, later};
use dlock_core::{Error, LossReason, Result};
use etcd_client::{Client, ConnectOptions, Txn, TxnResponse};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::BACKEND;
use crate::config::{EtcdConfig, EtcdTls};
use crate::error::{from_etcd, is_lease_gone};

/// First pause before a retry of a failed call; doubles up to [`RETRY_MAX`].
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(20);
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the `failures`-th failure in a row of one retry loop is logged as a warning: the
/// 5th, then the 10th, 20th, 40th … (fewer as an outage goes on); the others are debug lines.
pub(crate) fn worth_a_warning(failures: u32) -> bool {
    failures == 5
        || (failures >= 10 && failures.is_multiple_of(10) && (failures / 10).is_power_of_two())
}

/// A time-to-live in etcd's unit (seconds), as a duration (none if not positive).
fn seconds(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}

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
            Error::Backend {
                backend: BACKEND,
                message: self.message.clone(),
                retryable: self.retryable,
                source: None,
            }
        }
    }
}

/// Server calls made by one provider, by kind; see
/// [`EtcdProvider::stats`](crate::EtcdProvider::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdStats {
    /// Transactions (acquire, check, release, renewal).
    pub txns: u64,
    /// Range reads (a waiter's look for its predecessor; its looks at that key once its watch
    /// is created, if the store moved on meanwhile, and then every 10 ms for 150 ms, until
    /// one shows that no write came in between; `describe`).
    pub gets: u64,
    /// Watches opened (one per wait for a predecessor's delete).
    pub watches: u64,
    /// Waiters woken by their predecessor's delete: with no herd, one per handoff.
    pub wakeups: u64,
    /// Leases granted: one at connect, and one after each loss of the lease.
    pub leases: u64,
}

#[derive(Default)]
struct Counters {
    txns: AtomicU64,
    gets: AtomicU64,
    watches: AtomicU64,
    wakeups: AtomicU64,
    leases: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The live holds and the lease they are registered under, behind one lock, so a hold
/// registered while the lease ends is lost on arrival.
#[derive(Default)]
struct Holds {
    map: HashMap<u64, (i64, HoldSignal)>,
    /// Keep-alives are failing but the lease may still live: new holds start suspended.
    suspended: bool,
}

/// The client and lease shared by every handle of a provider.
pub(crate) struct Session {
    pub(crate) config: EtcdConfig,
    pub(crate) store_id: String,
    client: Client,
    /// The live lease, or why there is none from its end until a new one is granted.
    lease: watch::Sender<LeaseState>,
    holds: Mutex<Holds>,
    next_hold: AtomicU64,
    /// The lock keys `{name}/{lease}` in use by this provider's contenders. Two owners of one
    /// provider share the lease, so a second contender for a name takes a key of its own,
    /// `{name}/{lease}-{n}`; etcd orders them all by create revision alike.
    claimed: Mutex<std::collections::HashSet<String>>,
    next_key: AtomicU64,
    /// The live lease and its horizon: the send time of the last request that kept it alive
    /// (its grant, or a keep-alive the server answered) plus the time-to-live the server
    /// answered with. The server keeps the lease at least until then, and no longer than that
    /// can the client vouch for its keys. A new lease gets a new horizon; the old one stays
    /// with the holds of the old lease, which are lost.
    horizon: Mutex<Option<(i64, Horizon)>>,
    counters: Counters,
}

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
        let Some(lease) = self.lease_now() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let mut client = self.client.clone();
            runtime.spawn(async move {
                let _ = client.lease_revoke(lease).await;
            });
        }
    }
}

/// The client's TLS settings from `tls`: the files read now, so a missing or unreadable one
/// is a [`Error::Config`] naming it.
fn tls_options(tls: &EtcdTls) -> Result<etcd_client::TlsOptions> {
    let mut options = etcd_client::TlsOptions::new();
    options = match tls.read_ca()? {
        Some(ca) => options.ca_certificate(etcd_client::Certificate::from_pem(ca)),
        None => options.with_webpki_roots(),
    };
    if let Some((cert, key)) = tls.read_identity()? {
        options = options.identity(etcd_client::Identity::from_pem(cert, key));
    }
    Ok(options)
}

impl Session {
    /// Connects, grants the lease and starts the task that keeps it alive (it stops when the
    /// session is dropped).
    pub(crate) async fn connect(config: EtcdConfig) -> Result<Arc<Self>> {
        // A call unanswered for the lease's time-to-live is of no use any more (a partition,
        // a frozen member whose connection stays open): it ends with an error, retried where
        // that is safe, instead of waiting for the kernel to give the connection up.
        let mut options = ConnectOptions::new().with_timeout(config.lease_ttl);
        if let Some(t) = config.connect_timeout {
            options = options.with_connect_timeout(t);
        }
        if let Some((user, password)) = config.user() {
            // A token ends (a JWT's time-to-live, a simple token when its member restarts):
            // the client logs in again instead of failing every call from then on.
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        if let Some(tls) = &config.tls {
            options = options.with_tls(tls_options(tls)?);
        }
        let store = config.store_id();
        let client = Client::connect(&config.endpoints, Some(options))
            .await
            .map_err(|e| from_etcd(&format!("connect to {store}"), e))?;
        Self::start(config, client).await
    }

    /// Uses a client the application already has.
    pub(crate) async fn start(config: EtcdConfig, client: Client) -> Result<Arc<Self>> {
        let store_id = config.store_id();
        let session = Arc::new(Self {
            store_id,
            client,
            lease: watch::channel(LeaseState::Granting(None)).0,
            holds: Mutex::new(Holds::default()),
            next_hold: AtomicU64::new(0),
            claimed: Mutex::new(std::collections::HashSet::new()),
            next_key: AtomicU64::new(1),
            horizon: Mutex::new(None),
            counters: Counters::default(),
            config,
        });
        session.config.check()?;
        let sent = Instant::now();
        let (lease, ttl) = session.grant().await?;
        session.record_granted(lease, sent, ttl);
        session.lease.send_replace(LeaseState::Live(lease));
        tokio::spawn(keep_alive(Arc::downgrade(&session), lease));
        Ok(session)
    }

    /// A new lease, and the time-to-live the server granted it (etcd raises one below its
    /// minimum, about one and a half election timeouts).
    async fn grant(&self) -> Result<(i64, Duration)> {
        bump(&self.counters.leases);
        let mut client = self.client.clone();
        client
            .lease_grant(self.config.ttl_secs(), None)
            .await
            .map(|r| (r.id(), seconds(r.ttl())))
            .map_err(|e| from_etcd(&format!("grant a lease on {}", self.store_id), e))
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// Lease `lease` was granted `ttl` by a request sent at `sent`: it is the live lease
    /// now, with a horizon of its own. The horizon is no answer's yet, so a hold found past
    /// it is lost as [`LossReason::SessionTimedOut`].
    fn record_granted(&self, lease: i64, sent: Instant, ttl: Duration) {
        let horizon = Horizon::new(later(sent, ttl), LossReason::SessionTimedOut);
        *lock(&self.horizon) = Some((lease, horizon));
    }

    /// Lease `lease` was kept alive for `ttl` by a request sent at `sent`: its horizon moves
    /// on (never back). Ignored for a lease that is not the one recorded (an older lease's
    /// late answer must not move the live one's).
    fn record_kept(&self, lease: i64, sent: Instant, ttl: Duration) {
        if let Some((l, horizon)) = lock(&self.horizon).as_ref()
            && *l == lease
        {
            horizon.advance(later(sent, ttl));
        }
    }

    /// Lease `lease`'s horizon (`None` once another lease replaced it): the server keeps the
    /// lease at least until then.
    fn horizon_of(&self, lease: i64) -> Option<Horizon> {
        match lock(&self.horizon).as_ref() {
            Some((l, horizon)) if *l == lease => Some(horizon.clone()),
            _ => None,
        }
    }

    /// One keep-alive of lease `lease` now, on a stream of its own, answered by `until`:
    /// `Ok(true)` if the server kept it (its horizon moves on from this call's send time),
    /// `Ok(false)` if the server says it is gone.
    pub(crate) async fn keep_now(&self, lease: i64, until: Instant) -> Result<bool> {
        let sent = Instant::now();
        let mut keeper = None;
        let mut client = self.client.clone();
        match keep_once(&mut keeper, &mut client, lease, until).await {
            Round::Kept(ttl) => {
                self.record_kept(lease, sent, ttl);
                Ok(true)
            }
            Round::Gone => Ok(false),
            Round::Failed => Err(Error::Backend {
                backend: crate::BACKEND,
                message: format!("keeping lease {lease:x} alive on {} failed", self.store_id),
                retryable: true,
                source: None,
            }),
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
        let lost: Vec<HoldSignal> = {
            let mut holds = lock(&self.holds);
            let ids: Vec<u64> = holds
                .map
                .iter()
                .filter(|(_, (l, _))| *l == lease)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| holds.map.remove(&id).map(|(_, s)| s))
                .collect()
        };
        for signal in lost {
            signal.mark_lost(reason);
        }
    }

    /// Registers a live hold's signal under `lease`, and returns its id and the lease's
    /// horizon, which bounds the hold. A hold of a lease that already ended is lost at once
    /// (its horizon is then one that has passed).
    pub(crate) fn register(&self, lease: i64, signal: &HoldSignal) -> (u64, Horizon) {
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        let mut holds = lock(&self.holds);
        // A lease is recorded with its horizon before it turns live, and ends (turns not
        // live) before it is replaced: a live lease has its horizon recorded.
        let horizon = match self.horizon_of(lease) {
            Some(h) if self.lease_now() == Some(lease) => h,
            _ => {
                drop(holds);
                signal.mark_lost(LossReason::SessionExpired);
                return (id, Horizon::new(Instant::now(), LossReason::SessionExpired));
            }
        };
        if holds.suspended {
            signal.set_suspended(true);
        }
        holds.map.insert(id, (lease, signal.clone()));
        (id, horizon)
    }

    pub(crate) fn unregister(&self, id: u64) {
        lock(&self.holds).map.remove(&id);
    }

    /// Live holds of this provider (for tests).
    pub(crate) fn live_holds(&self) -> usize {
        lock(&self.holds).map.len()
    }

    fn set_suspended(&self, suspended: bool) {
        let mut holds = lock(&self.holds);
        if holds.suspended == suspended {
            return;
        }
        holds.suspended = suspended;
        for (_, signal) in holds.map.values() {
            signal.set_suspended(suspended);
        }
    }

    /// A key for one contender under `range` with `lease`: `{range}{lease:x}` (the key etcd's
    /// own lock uses) unless another contender of this provider has it, else one of its own.
    pub(crate) fn claim(self: &Arc<Self>, range: &str, lease: i64) -> Claim {
        let canonical = format!("{range}{lease:x}");
        if lock(&self.claimed).insert(canonical.clone()) {
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
        bump(&self.counters.txns);
        let result = self.client.clone().txn(txn).await;
        if let (Err(e), Some(lease)) = (&result, lease)
            && is_lease_gone(e)
        {
            self.lease_ended(lease, LossReason::SessionExpired);
        }
        result
    }

    pub(crate) fn count_get(&self) {
        bump(&self.counters.gets);
    }

    pub(crate) fn count_watch(&self) {
        bump(&self.counters.watches);
    }

    pub(crate) fn count_wakeup(&self) {
        bump(&self.counters.wakeups);
    }

    pub(crate) fn stats(&self) -> EtcdStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EtcdStats {
            txns: get(&c.txns),
            gets: get(&c.gets),
            watches: get(&c.watches),
            wakeups: get(&c.wakeups),
            leases: get(&c.leases),
        }
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

impl Drop for Claim {
    fn drop(&mut self) {
        if self.canonical
            && let Some(session) = self.session.upgrade()
        {
            lock(&session.claimed).remove(&self.key);
        }
    }
}

/// What one keep-alive round found.
enum Round {
    /// The server extended the lease by this time-to-live.
    Kept(Duration),
    /// The server says the lease is gone (expired or revoked).
    Gone,
    /// No answer: the call failed or timed out.
    Failed,
}

async fn keep_once(
    keeper: &mut Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>,
    client: &mut Client,
    lease: i64,
    until: Instant,
) -> Round {
    let round = async {
        if keeper.is_none() {
            *keeper = Some(client.lease_keep_alive(lease).await?);
        }
        let Some((k, stream)) = keeper.as_mut() else {
            return Ok(None);
        };
        k.keep_alive().await?;
        stream.message().await
    };
    match timeout_at(until, round).await {
        Ok(Ok(Some(resp))) if resp.ttl() > 0 => Round::Kept(seconds(resp.ttl())),
        Ok(Ok(Some(_))) => Round::Gone,
        Ok(Err(e)) if is_lease_gone(&e) => Round::Gone,
        _ => {
            // A stream that failed once is not trusted again.
            *keeper = None;
            Round::Failed
        }
    }
}

/// A new lease for the acquires to come, as soon as the server grants one; its time-to-live
/// counts from when its grant was sent, not from the answer. Each failure is published for
/// the acquires waiting for the lease (one that no retry helps ends their wait), and an
/// outage that goes on is logged as a warning now and then.
async fn regrant(s: &Session, backoff: &mut Backoff) -> i64 {
    let mut failures = 0u32;
    loop {
        let granting = Instant::now();
        match s.grant().await {
            Ok((l, ttl)) => {
                s.record_granted(l, granting, ttl);
                s.set_suspended(false);
                s.lease.send_replace(LeaseState::Live(l));
                return l;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if worth_a_warning(failures) || (failures == 1 && !e.is_retryable()) {
                    tracing::warn!(store = %s.store_id, error = %e, failures, "etcd: no new lease can be granted; acquires wait or fail; retrying");
                } else {
                    tracing::debug!(error = %e, "etcd: granting a new lease failed; retrying");
                }
                s.lease
                    .send_replace(LeaseState::Granting(Some(GrantFailure::of(&e))));
                backoff.wait().await;
            }
        }
    }
}

/// Keeps the session's lease alive every third of its time-to-live. While keep-alives fail
/// the holds are suspended; once the lease's horizon has passed (the send of the last
/// keep-alive the server answered, plus the time-to-live it answered with), or the server
/// says the lease is gone, every hold is lost and a new lease is granted for later acquires.
/// (The holds' guards stop vouching for them a drift allowance before the horizon by
/// themselves.)
async fn keep_alive(session: Weak<Session>, mut lease: i64) {
    let (period, mut client) = match session.upgrade() {
        Some(s) => (s.config.lease_ttl / 3, s.client()),
        None => return,
    };
    let mut keeper = None;
    let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
    // The horizon of the lease until a round finds it: a lease no longer recorded has ended.
    let mut horizon = Instant::now();
    loop {
        // The session's horizon is the one truth of when the lease was last kept alive: the
        // holds' renewals keep it alive too (`keep_now`), not only this task.
        match session.upgrade() {
            Some(s) => horizon = s.horizon_of(lease).map_or(horizon, |h| h.at()),
            None => return,
        }
        let sent = Instant::now();
        // A round never outlasts the lease: the loss is reported when the lease ends.
        let until = later(sent, period).min(horizon);
        let round = keep_once(&mut keeper, &mut client, lease, until).await;
        let Some(s) = session.upgrade() else { return };
        let expired = match round {
            Round::Kept(ttl) => {
                s.record_kept(lease, sent, ttl);
                s.set_suspended(false);
                backoff.reset();
                false
            }
            Round::Gone => true,
            Round::Failed => {
                s.set_suspended(true);
                let horizon = s.horizon_of(lease).map_or(horizon, |h| h.at());
                Instant::now() >= horizon
            }
        };
        if expired {
            s.lease_ended(lease, LossReason::SessionExpired);
            keeper = None;
            lease = regrant(&s, &mut backoff).await;
            continue;
        }
        drop(s);
        match round {
            Round::Kept(_) => sleep_until(later(sent, period)).await,
            _ => {
                let pause = backoff.next_pause();
                sleep_until(later(Instant::now(), pause).min(horizon)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dlock_core::backend::from_now;

    use super::*;

    /// A keep-alive on a stream of its own (a renewal's, or the provider's after its stream
    /// failed) for a lease the server no longer has says "gone", not "no answer": the client
    /// library turns that stream's first answer, a time-to-live of 0, into an error of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fresh_keep_alive_stream_finds_a_revoked_lease_gone() -> Result<(), String> {
        let Some(url) = dlock_conformance::service_url("DLOCK_ETCD_URL") else {
            return Ok(());
        };
        let config = EtcdConfig::from_url(&url).map_err(|e| e.to_string())?;
        let session = Session::connect(config).await.map_err(|e| e.to_string())?;
        let mut client = session.client();
        let etcd = |e: etcd_client::Error| e.to_string();
        let lease = client.lease_grant(60, None).await.map_err(etcd)?.id();
        client.lease_revoke(lease).await.map_err(etcd)?;
        match session
            .keep_now(lease, from_now(Duration::from_secs(10)))
            .await
        {
            Ok(false) => Ok(()),
            other => Err(format!("a keep-alive of a revoked lease: {other:?}")),
        }
    }
}
