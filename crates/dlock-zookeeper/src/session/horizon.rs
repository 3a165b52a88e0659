//! The session's horizon: the latest moment the ensemble can have expired the session, moved
//! by every answered request, and the probes that keep it moving while holds are live.

use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::LossReason;
use dlock_core::backend::{Horizon, later};
use tokio::sync::Notify;
use tokio::time::Instant;
use zookeeper_client as zk;

use super::Session;
use crate::error::is_answer;

/// The latest moment the ensemble can expire a session that received a request sent at
/// `sent`: `sent` plus the negotiated timeout `timeout`, less a quarter of it.
///
/// A server restarts a session's timeout when a request of the session reaches it, which is
/// after `sent` (the client sends a request when its method is called). In an ensemble a
/// follower tells the leader, which expires sessions, of the sessions it heard from only in
/// its answer to the leader's next ping, up to half a `tickTime` later. A quarter of the
/// timeout covers that delay for every timeout of two ticks or more, the least a server
/// negotiates unless its `minSessionTimeout` is set lower.
fn horizon_after(sent: Instant, timeout: Duration) -> Instant {
    later(sent, timeout.saturating_sub(timeout / 4))
}

/// The session whose nodes are live, as far as the client knows.
pub(super) struct Live {
    /// The session id.
    pub(super) id: i64,
    /// The timeout the server negotiated for it.
    timeout: Duration,
    /// The bound every hold of this session is granted with: see [`horizon_after`].
    pub(super) horizon: Horizon,
    /// When the last request the server answered was sent.
    heard: Instant,
    /// When the last probe was sent; set back to `heard` at a reconnection, so that a probe
    /// goes out at once then.
    probed: Instant,
}

impl Live {
    /// A session `client` opened with a connect request sent at `sent`.
    pub(super) fn new(client: &zk::Client, sent: Instant) -> Self {
        let timeout = client.session_timeout();
        Self {
            id: client.session_id().0,
            timeout,
            horizon: Horizon::new(horizon_after(sent, timeout), LossReason::SessionTimedOut),
            heard: sent,
            probed: sent,
        }
    }
}

impl Session {
    /// Records the fate of a request `client` sent at `sent`: if the server answered it (a
    /// result or a refusal such as `NoNode`, not a connection loss or an expiry) and `client`
    /// is the live session's, the session's horizon moves to [`horizon_after`] `sent`.
    ///
    /// A horizon that has already passed is not moved: its holds may have been given away
    /// (the answer may come from a follower that had not yet heard of the session's expiry),
    /// and they are lost. Holds granted later get a fresh horizon.
    pub(super) fn heard<T>(
        &self,
        client: &zk::Client,
        sent: Instant,
        result: &std::result::Result<T, zk::Error>,
    ) {
        if result.as_ref().is_err_and(|e| !is_answer(e)) {
            return;
        }
        let id = client.session_id().0;
        let mut live = self.live.lock();
        let Some(live) = live.as_mut().filter(|l| l.id == id) else {
            return;
        };
        let to = horizon_after(sent, live.timeout);
        if Instant::now() < live.horizon.at() {
            live.horizon.advance(to);
        } else {
            live.horizon = Horizon::new(to, LossReason::SessionTimedOut);
        }
        live.heard = live.heard.max(sent);
    }

    /// When the next probe is due: a quarter of the session timeout after the last answered
    /// request or probe, whichever is later; `None` while no hold is live (or no session).
    fn probe_due(&self) -> Option<Instant> {
        let live = self.live.lock();
        let live = live.as_ref()?;
        if self.holds.is_empty() {
            return None;
        }
        Some(later(live.heard.max(live.probed), live.timeout / 4))
    }

    /// Sends a probe: `exists("/")`, the cheapest request the server answers. Waits for its
    /// answer for at most a quarter of the session timeout, holding only the client.
    async fn probe(session: &Weak<Self>) {
        let Some(s) = session.upgrade() else { return };
        let client = s.client();
        let sent = Instant::now();
        let timeout = {
            let mut live = s.live.lock();
            match live.as_mut() {
                Some(live) => {
                    live.probed = sent;
                    live.timeout
                }
                None => return,
            }
        };
        s.counters.count(|s| &mut s.probes);
        drop(s);
        let answer = tokio::time::timeout(timeout / 4, client.check_stat("/")).await;
        if let (Ok(result), Some(s)) = (answer, session.upgrade()) {
            s.heard(&client, sent, &result);
        }
    }

    /// The client reconnected within its session: probe at once if one is due.
    pub(super) fn reconnected(&self) {
        if let Some(live) = self.live.lock().as_mut() {
            live.probed = live.heard;
        }
        self.probe_wake.notify_waiters();
    }
}

/// Keeps the session's horizon moving while holds are live: when nothing was heard from the
/// server for a quarter of the session timeout, it sends a probe. A watchdog renewal (every
/// third of the lease, 10 s by default) is too rare for a session that the server ends 10 s
/// after it last heard from it, and the client library's own pings are invisible here.
pub(super) async fn keep_horizon(session: Weak<Session>, wake: Arc<Notify>) {
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let Some(s) = session.upgrade() else { return };
        let due = s.probe_due();
        drop(s);
        match due {
            None => woken.await,
            Some(at) if at > Instant::now() => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = woken => {}
                }
            }
            Some(_) => Session::probe(&session).await,
        }
    }
}
