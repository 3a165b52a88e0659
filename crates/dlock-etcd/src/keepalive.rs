//! Where the provider's lease is granted and renewed: the connection and first grant, the
//! background task that keeps it alive every third of its time-to-live, the one keep-alive a
//! hold's renewal makes, and the grant of a new lease once the old one has ended.

use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Backoff, later, worth_a_warning};
use dlock_core::{Error, LossReason, Result};
use etcd_client::{Client, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::BACKEND;
use crate::config::{EtcdConfig, EtcdTls};
use crate::error::{from_etcd, is_lease_gone};
use crate::retry::{RETRY_MAX, RETRY_MIN, seconds};
use crate::session::Session;

/// The shortest interval between the client's HTTP/2 pings: etcd's default
/// `--grpc-keepalive-min-time` (5 s), with a margin for pings that arrive closer together
/// than they were sent.
const PING_MIN: Duration = Duration::from_secs(6);

/// Connects, grants the lease and starts the task that keeps it alive (it stops when the
/// session is dropped).
pub(crate) async fn connect(config: EtcdConfig) -> Result<Arc<Session>> {
    // A call unanswered for the lease's time-to-live is of no use any more (a partition,
    // a frozen member whose connection stays open): it ends with an error, retried where
    // that is safe, instead of waiting for the kernel to give the connection up.
    //
    // HTTP/2 pings on a connection with streams end one that stopped answering (a member host
    // gone, a half-open middlebox) and with it the watches it carries, which a request
    // timeout does not cover: their callers then look again on a healthy one. Every third of
    // the time-to-live, but no more often than etcd accepts by default (see PING_MIN: it ends
    // a connection that pings more often, and one that pings with no stream open). Requiring a leader makes a member cut off from its
    // quorum refuse (and cancel its watches) instead of serving from a stale view.
    let ping = (config.lease_ttl / 3).max(PING_MIN);
    let mut options = ConnectOptions::new()
        .with_timeout(config.lease_ttl)
        .with_keep_alive(ping, config.lease_ttl / 3)
        .with_require_leader(true);
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
    // The connections that ask the members whether they answer (see `members`): short
    // limits, no leader required (a member without one is seen as such), and no credentials
    // (a refusal is an answer too, and no look costs the cluster a password check).
    let mut probe = ConnectOptions::new()
        .with_timeout(crate::members::ANSWER_WITHIN)
        .with_connect_timeout(crate::members::ANSWER_WITHIN);
    if let Some(tls) = &config.tls {
        let tls = tls_options(tls)?;
        options = options.with_tls(tls.clone());
        probe = probe.with_tls(tls);
    }
    let store = config.store_id();
    let client = Client::connect(&config.endpoints, Some(options))
        .await
        .map_err(|e| from_etcd(&format!("connect to {store}"), e))?;
    let (endpoints, scheme) = (config.endpoints.clone(), scheme(&config));
    let session = start(config, client).await?;
    crate::members::watch(
        Arc::downgrade(&session),
        session.client(),
        endpoints,
        scheme,
        probe,
    );
    Ok(session)
}

/// How etcd-client names the endpoints of `config` in its balance.
fn scheme(config: &EtcdConfig) -> &'static str {
    if config.tls.is_some() {
        "https://"
    } else {
        "http://"
    }
}

/// A session over a client the application already has: grants its lease and starts the
/// task that keeps it alive.
pub(crate) async fn start(config: EtcdConfig, client: Client) -> Result<Arc<Session>> {
    let session = Arc::new_cyclic(|me| Session::new(config, client, Weak::clone(me)));
    session.config.check()?;
    let sent = Instant::now();
    let (lease, ttl) = session.grant().await?;
    session.lease_granted(lease, sent, ttl);
    tokio::spawn(keep_alive(Arc::downgrade(&session), lease));
    Ok(session)
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

/// What one keep-alive round found.
enum Round {
    /// The server extended the lease by this time-to-live.
    Kept(Duration),
    /// The server says the lease is gone (expired or revoked).
    Gone,
    /// No answer: the call failed or timed out.
    Failed,
}

impl Session {
    /// One keep-alive of lease `lease` now, on a stream of its own, answered by `until`:
    /// `Ok(true)` if the server kept it (its horizon moves on from this call's send time),
    /// `Ok(false)` if the server says it is gone.
    pub(crate) async fn keep_now(&self, lease: i64, until: Instant) -> Result<bool> {
        self.counters.count(|s| &mut s.keep_alives);
        let sent = Instant::now();
        let mut keeper = None;
        let mut client = self.client();
        match keep_once(&mut keeper, &mut client, lease, until).await {
            Round::Kept(ttl) => {
                self.record_kept(lease, sent, ttl);
                Ok(true)
            }
            Round::Gone => Ok(false),
            Round::Failed => Err(Error::backend_failed(
                BACKEND,
                format!("keeping lease {lease:x} alive on {} failed", self.store_id),
                true,
            )),
        }
    }
}

/// One keep-alive of `lease` on `keeper`'s stream (opened first if there is none), answered
/// by `until`. A stream that failed is dropped, for the next round to open a new one.
async fn keep_once(
    keeper: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
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
/// outage that goes on is logged as a warning now and then. `None` once the session is
/// dropped: each try holds it only while it runs, so a provider dropped while etcd is out of
/// reach stops trying.
async fn regrant(session: &Weak<Session>, backoff: &mut Backoff) -> Option<i64> {
    let mut failures = 0u32;
    loop {
        let s = session.upgrade()?;
        let granting = Instant::now();
        match s.grant().await {
            Ok((l, ttl)) => {
                s.lease_granted(l, granting, ttl);
                return Some(l);
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if worth_a_warning(failures) || (failures == 1 && !e.is_retryable()) {
                    tracing::warn!(store = %s.store_id, error = %e, failures, "etcd: no new lease can be granted; acquires wait or fail; retrying");
                } else {
                    tracing::debug!(error = %e, "etcd: granting a new lease failed; retrying");
                }
                s.grant_failed(&e);
                drop(s);
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
pub(crate) async fn keep_alive(session: Weak<Session>, mut lease: i64) {
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
            Some(s) => {
                horizon = s.horizon_of(lease).map_or(horizon, |h| h.at());
                s.counters.count(|c| &mut c.keep_alives);
            }
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
            drop(s);
            match regrant(&session, &mut backoff).await {
                Some(l) => lease = l,
                None => return,
            }
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

/// For unit tests against the etcd member at `DLOCK_ETCD_URL` (`None` without one): a
/// session, and a lease of 60 s granted beside it, of the test's own.
#[cfg(test)]
pub(crate) async fn test_session() -> Result<Option<(Arc<Session>, i64)>, String> {
    let Some(url) = dlock_conformance::service_url("DLOCK_ETCD_URL") else {
        return Ok(None);
    };
    let config = EtcdConfig::from_url(&url).map_err(|e| e.to_string())?;
    let session = connect(config).await.map_err(|e| e.to_string())?;
    let lease = session.client().lease_grant(60, None).await;
    let lease = lease.map_err(|e| e.to_string())?.id();
    Ok(Some((session, lease)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use dlock_core::backend::from_now;

    use super::{connect, test_session};
    use crate::config::EtcdConfig;

    /// A session dropped while etcd is out of reach, its lease gone and a new one not
    /// granted, is freed: the task that keeps trying holds it only for a try, so it stops
    /// instead of trying for ever. The member is reached through a proxy that then
    /// partitions it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_dropped_while_etcd_is_out_of_reach_stops_granting() -> Result<(), String> {
        let Some(url) = dlock_conformance::service_url("DLOCK_ETCD_URL") else {
            return Ok(());
        };
        let member = EtcdConfig::from_url(&url).map_err(|e| e.to_string())?;
        let proxy = dlock_proxy::Proxy::start(member.endpoints[0].clone())
            .await
            .map_err(|e| e.to_string())?;
        let config = EtcdConfig::from_url(&format!("etcd://{}?ttl_s=2", proxy.addr()))
            .map_err(|e| e.to_string())?;
        let session = connect(config).await.map_err(|e| e.to_string())?;
        proxy.set_fault(dlock_proxy::Fault::Partition);
        dlock_conformance::eventually(
            Duration::from_secs(30),
            "the lease ends and a new grant fails",
            || async {
                match session.grant_failure() {
                    Some(_) => Ok(()),
                    None => Err("not yet"),
                }
            },
        )
        .await;
        let weak = Arc::downgrade(&session);
        drop(session);
        dlock_conformance::eventually(
            Duration::from_secs(30),
            "the dropped session is freed",
            || async {
                match weak.upgrade() {
                    None => Ok(()),
                    Some(_) => Err("still held"),
                }
            },
        )
        .await;
        Ok(())
    }

    /// A keep-alive on a stream of its own (a renewal's, or the provider's after its stream
    /// failed) for a lease the server no longer has says "gone", not "no answer": the client
    /// library turns that stream's first answer, a time-to-live of 0, into an error of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fresh_keep_alive_stream_finds_a_revoked_lease_gone() -> Result<(), String> {
        let Some((session, lease)) = test_session().await? else {
            return Ok(());
        };
        let revoked = session.client().lease_revoke(lease).await;
        revoked.map_err(|e| e.to_string())?;
        match session
            .keep_now(lease, from_now(Duration::from_secs(10)))
            .await
        {
            Ok(false) => Ok(()),
            other => Err(format!("a keep-alive of a revoked lease: {other:?}")),
        }
    }
}
