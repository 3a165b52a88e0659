//! The provider's one ZooKeeper session: the client every lock shares, counted server calls,
//! the registry of live holds, the session's horizon, and the tasks that turn session states
//! into hold states and keep the horizon moving while holds are live.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::Duration;

use dlock_core::backend::{Backoff, HoldSignal, Horizon, later};
use dlock_core::{LockName, LossReason, Result};
use tokio::sync::Notify;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{from_zk, is_answer, is_transient};

/// How many times a read or a create is retried after a transient error.
const RETRIES: u32 = 6;
/// First pause before a retry; doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Server calls made by one provider, by kind; see [`ZkProvider::stats`](crate::ZkProvider::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkStats {
    /// `create` calls (lock, lease and parent nodes).
    pub creates: u64,
    /// `delete` calls.
    pub deletes: u64,
    /// `getChildren` calls (with or without a watch).
    pub get_children: u64,
    /// `getData` calls (the waiters' watches on their predecessors).
    pub get_data: u64,
    /// `exists` calls (lease renewals and `extend`).
    pub exists: u64,
    /// Waiters woken by a watch: with no herd, one per handoff.
    pub wakeups: u64,
    /// Sessions opened: one at connect, and one after each expiry.
    pub sessions: u64,
    /// Probes: `exists("/")` calls that keep the session's horizon moving while holds are live
    /// and nothing else was heard from the server for a quarter of the session timeout. Not
    /// part of [`calls`](Self::calls), which counts the recipes' own calls.
    pub probes: u64,
}

impl ZkStats {
    /// All server calls of the recipes (wake-ups and probes are not counted).
    pub fn calls(&self) -> u64 {
        self.creates + self.deletes + self.get_children + self.get_data + self.exists
    }
}

#[derive(Default)]
struct Counters {
    creates: AtomicU64,
    deletes: AtomicU64,
    get_children: AtomicU64,
    get_data: AtomicU64,
    exists: AtomicU64,
    wakeups: AtomicU64,
    sessions: AtomicU64,
    probes: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Registered {
    name: LockName,
    signal: HoldSignal,
}

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
struct Live {
    /// The session id.
    id: i64,
    /// The timeout the server negotiated for it.
    timeout: Duration,
    /// The bound every hold of this session is granted with: see [`horizon_after`].
    horizon: Horizon,
    /// When the last request the server answered was sent.
    heard: Instant,
    /// When the last probe was sent; set back to `heard` at a reconnection, so that a probe
    /// goes out at once then.
    probed: Instant,
}

impl Live {
    /// A session `client` opened with a connect request sent at `sent`.
    fn new(client: &zk::Client, sent: Instant) -> Self {
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

/// The live holds and the session state they are registered under, behind one lock, so a hold
/// registered while the session changes state gets that state (review L1).
#[derive(Default)]
struct Holds {
    map: HashMap<u64, Registered>,
    /// Disconnected: new holds start suspended.
    suspended: bool,
    /// The session whose nodes are live; `None` from its expiry until a new one is open. A
    /// grant of a node of any other session is lost on arrival.
    live: Option<Live>,
}

impl Holds {
    fn live_id(&self) -> Option<i64> {
        self.live.as_ref().map(|l| l.id)
    }
}

/// One ZooKeeper session shared by every handle of a provider.
pub(crate) struct Session {
    pub(crate) config: ZkConfig,
    pub(crate) store_id: String,
    client: RwLock<zk::Client>,
    counters: Counters,
    holds: Mutex<Holds>,
    next_hold: AtomicU64,
    /// Wakes the probe task: a hold was registered, or the session reconnected.
    probe_wake: Arc<Notify>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkProvider")
            .field("store", &self.store_id)
            .field("session", &self.client().session_id())
            .finish()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The probe task waits for this while no hold is live: let it see the session gone.
        self.probe_wake.notify_waiters();
    }
}

async fn open(config: &ZkConfig) -> Result<zk::Client> {
    let mut connector = config
        .connector()
        .with_session_timeout(config.session_timeout)
        .with_fail_eagerly();
    if let Some(t) = config.connection_timeout {
        connector = connector.with_connection_timeout(t);
    }
    if let Some(digest) = config.digest() {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    connector
        .connect(&config.connect_string())
        .await
        .map_err(|e| from_zk(&format!("connect to {}", config.store_id()), e))
}

impl Session {
    /// Opens the session and starts the task that watches its state.
    pub(crate) async fn connect(config: ZkConfig) -> Result<Arc<Self>> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(dlock_core::Error::config(
                "the zookeeper backend runs on tokio: connect from within a tokio runtime",
            ));
        };
        let sent = Instant::now();
        let client = open(&config).await?;
        let watcher = client.state_watcher();
        let counters = Counters::default();
        bump(&counters.sessions);
        let probe_wake = Arc::new(Notify::new());
        let session = Arc::new(Self {
            store_id: config.store_id(),
            config,
            holds: Mutex::new(Holds {
                live: Some(Live::new(&client, sent)),
                ..Holds::default()
            }),
            client: RwLock::new(client),
            counters,
            next_hold: AtomicU64::new(0),
            probe_wake: Arc::clone(&probe_wake),
        });
        runtime.spawn(watch_state(Arc::downgrade(&session), watcher));
        runtime.spawn(keep_horizon(Arc::downgrade(&session), probe_wake));
        Ok(session)
    }

    /// The current session's client (a cheap clone).
    pub(crate) fn client(&self) -> zk::Client {
        self.client
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn stats(&self) -> ZkStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ZkStats {
            creates: get(&c.creates),
            deletes: get(&c.deletes),
            get_children: get(&c.get_children),
            get_data: get(&c.get_data),
            exists: get(&c.exists),
            wakeups: get(&c.wakeups),
            sessions: get(&c.sessions),
            probes: get(&c.probes),
        }
    }

    /// The timeout the server negotiated for the current session: how long it keeps a session
    /// it does not hear from.
    pub(crate) fn session_timeout(&self) -> Duration {
        self.client().session_timeout()
    }

    pub(crate) fn woken(&self) {
        bump(&self.counters.wakeups);
    }

    // ------------------------------------------------------------ holds

    /// Registers a live hold's signal, for suspension and loss; returns its id and the horizon
    /// of its session (`None` if that session is gone). `node_session` is the session that
    /// owns the hold's node. The hold starts in the session's current state: suspended while
    /// disconnected, and lost at once if its node belongs to a session that expired meanwhile.
    pub(crate) fn register(
        &self,
        name: &LockName,
        signal: &HoldSignal,
        node_session: i64,
    ) -> (u64, Option<Horizon>) {
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        let mut holds = lock(&self.holds);
        let Some(horizon) = holds
            .live
            .as_ref()
            .filter(|l| l.id == node_session)
            .map(|l| l.horizon.clone())
        else {
            drop(holds);
            tracing::debug!(lock = %name, "a hold granted on a session that has expired");
            signal.mark_lost(LossReason::SessionExpired);
            return (id, None);
        };
        if holds.suspended {
            signal.set_suspended(true);
        }
        let first = holds.map.is_empty();
        holds.map.insert(
            id,
            Registered {
                name: name.clone(),
                signal: signal.clone(),
            },
        );
        drop(holds);
        if first {
            self.probe_wake.notify_waiters();
        }
        (id, Some(horizon))
    }

    pub(crate) fn unregister(&self, id: u64) {
        lock(&self.holds).map.remove(&id);
    }

    /// Whether nodes of `node_session` may still be live: it is the current session and it
    /// has not expired. A hold of any other session is gone with it, so there is nothing to
    /// delete (review L3: no storm of useless deletes after an expiry).
    pub(crate) fn is_live(&self, node_session: i64) -> bool {
        lock(&self.holds).live_id() == Some(node_session)
    }

    /// Whether the current session's client is connected to a server right now.
    pub(crate) fn is_connected(&self) -> bool {
        matches!(
            self.client().state(),
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
        )
    }

    /// Records the fate of a request `client` sent at `sent`: if the server answered it (a
    /// result or a refusal such as `NoNode`, not a connection loss or an expiry) and `client`
    /// is the live session's, the session's horizon moves to [`horizon_after`] `sent`.
    ///
    /// A horizon that has already passed is not moved: its holds may have been given away
    /// (the answer may come from a follower that had not yet heard of the session's expiry),
    /// and they are lost. Holds granted later get a fresh horizon.
    fn heard<T>(
        &self,
        client: &zk::Client,
        sent: Instant,
        result: &std::result::Result<T, zk::Error>,
    ) {
        if result.as_ref().is_err_and(|e| !is_answer(e)) {
            return;
        }
        let id = client.session_id().0;
        let mut holds = lock(&self.holds);
        let Some(live) = holds.live.as_mut().filter(|l| l.id == id) else {
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
        let holds = lock(&self.holds);
        let live = holds.live.as_ref()?;
        if holds.map.is_empty() {
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
            let mut holds = lock(&s.holds);
            match holds.live.as_mut() {
                Some(live) => {
                    live.probed = sent;
                    live.timeout
                }
                None => return,
            }
        };
        bump(&s.counters.probes);
        drop(s);
        let answer = tokio::time::timeout(timeout / 4, client.check_stat("/")).await;
        if let (Ok(result), Some(s)) = (answer, session.upgrade()) {
            s.heard(&client, sent, &result);
        }
    }

    /// The client reconnected within its session: probe at once if one is due.
    fn reconnected(&self) {
        if let Some(live) = lock(&self.holds).live.as_mut() {
            live.probed = live.heard;
        }
        self.probe_wake.notify_waiters();
    }

    /// Live holds right now.
    pub(crate) fn live_holds(&self) -> usize {
        lock(&self.holds).map.len()
    }

    fn suspend_all(&self, suspended: bool) {
        let mut holds = lock(&self.holds);
        holds.suspended = suspended;
        for h in holds.map.values() {
            h.signal.set_suspended(suspended);
        }
    }

    fn lose_all(&self, reason: LossReason, detail: &str) {
        let lost: Vec<Registered> = {
            let mut holds = lock(&self.holds);
            holds.live = None;
            holds.suspended = false;
            holds.map.drain().map(|(_, h)| h).collect()
        };
        if !lost.is_empty() {
            tracing::warn!(store = %self.store_id, holds = lost.len(), detail, "zookeeper holds lost with their session");
        }
        for h in lost {
            tracing::debug!(lock = %h.name, detail, "zookeeper hold lost with its session");
            h.signal.mark_lost(reason);
        }
    }

    // ------------------------------------------------------------ counted calls
    //
    // Each takes the send time just before calling the client (which sends the request then,
    // not when the future is polled), and tells `heard` how the call ended.

    pub(crate) async fn create(
        &self,
        path: &str,
        mode: zk::CreateMode,
    ) -> std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error> {
        self.create_with(path, &[], mode).await
    }

    pub(crate) async fn create_with(
        &self,
        path: &str,
        data: &[u8],
        mode: zk::CreateMode,
    ) -> std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error> {
        bump(&self.counters.creates);
        let client = self.client();
        let options = mode.with_acls(zk::Acls::anyone_all());
        let sent = Instant::now();
        let result = client.create(path, data, &options).await;
        self.heard(&client, sent, &result);
        result
    }

    /// Creates `path` and lists the children of each of `dirs` in one round trip: every
    /// request is sent before any answer is read (the client sends a request when the call is
    /// made, not when its future is polled), and the server answers a session's requests in
    /// the order they were sent, so each listing sees what the create made, and sees it after
    /// the listings before it.
    pub(crate) async fn create_and_list(
        &self,
        path: &str,
        data: &[u8],
        mode: zk::CreateMode,
        dirs: &[&str],
    ) -> (
        std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error>,
        Vec<std::result::Result<Vec<String>, zk::Error>>,
    ) {
        bump(&self.counters.creates);
        let client = self.client();
        let options = mode.with_acls(zk::Acls::anyone_all());
        let sent = Instant::now();
        let created = client.create(path, data, &options);
        let listings: Vec<_> = dirs
            .iter()
            .map(|dir| {
                bump(&self.counters.get_children);
                client.list_children(dir)
            })
            .collect();
        let created = created.await;
        self.heard(&client, sent, &created);
        let mut listed = Vec::with_capacity(listings.len());
        for listing in listings {
            let result = listing.await;
            self.heard(&client, sent, &result);
            listed.push(result);
        }
        (created, listed)
    }

    pub(crate) async fn data(&self, path: &str) -> std::result::Result<Vec<u8>, zk::Error> {
        bump(&self.counters.get_data);
        let client = self.client();
        let sent = Instant::now();
        let result = client.get_data(path).await;
        self.heard(&client, sent, &result);
        Ok(result?.0)
    }

    pub(crate) async fn delete(&self, path: &str) -> std::result::Result<(), zk::Error> {
        bump(&self.counters.deletes);
        let client = self.client();
        let sent = Instant::now();
        let result = client.delete(path, None).await;
        self.heard(&client, sent, &result);
        result
    }

    /// Brings the server this client talks to up to date with the leader (ZooKeeper's
    /// `sync`), before a read that must see our own earlier writes.
    pub(crate) async fn sync(&self, path: &str) -> std::result::Result<(), zk::Error> {
        let client = self.client();
        let sent = Instant::now();
        let result = client.sync(path).await;
        self.heard(&client, sent, &result);
        result
    }

    pub(crate) async fn children(&self, path: &str) -> std::result::Result<Vec<String>, zk::Error> {
        bump(&self.counters.get_children);
        let client = self.client();
        let sent = Instant::now();
        let result = client.list_children(path).await;
        self.heard(&client, sent, &result);
        result
    }

    pub(crate) async fn children_watch(
        &self,
        path: &str,
    ) -> std::result::Result<(Vec<String>, zk::OneshotWatcher), zk::Error> {
        bump(&self.counters.get_children);
        let client = self.client();
        let sent = Instant::now();
        let result = client.list_and_watch_children(path).await;
        self.heard(&client, sent, &result);
        result
    }

    pub(crate) async fn data_watch(
        &self,
        path: &str,
    ) -> std::result::Result<zk::OneshotWatcher, zk::Error> {
        bump(&self.counters.get_data);
        let client = self.client();
        let sent = Instant::now();
        let result = client.get_and_watch_data(path).await;
        self.heard(&client, sent, &result);
        Ok(result?.2)
    }

    pub(crate) async fn exists(
        &self,
        path: &str,
    ) -> std::result::Result<Option<zk::Stat>, zk::Error> {
        bump(&self.counters.exists);
        let client = self.client();
        let sent = Instant::now();
        let result = client.check_stat(path).await;
        self.heard(&client, sent, &result);
        result
    }

    // ------------------------------------------------------------ recipes' helpers

    /// Runs `call` again after transient errors (the client reconnects by itself), a few
    /// times with a growing pause.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut call: F) -> std::result::Result<T, zk::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, zk::Error>>,
    {
        let mut pause = Backoff::new(RETRY_MIN, RETRY_MAX);
        let mut tries = 0;
        loop {
            match call().await {
                Err(e) if is_transient(&e) && tries < RETRIES => {
                    tries += 1;
                    tracing::debug!(error = %e, "zookeeper call failed; retrying");
                    pause.wait().await;
                }
                other => return other,
            }
        }
    }

    /// Creates `dir` and its missing ancestors as CONTAINER nodes (Curator's
    /// `creatingParentContainersIfNeeded`).
    pub(crate) async fn ensure_parents(&self, dir: &str) -> std::result::Result<(), zk::Error> {
        let mut stack = vec![dir.to_owned()];
        while let Some(path) = stack.last().cloned() {
            match self
                .retrying(|| self.create(&path, zk::CreateMode::Container))
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => {
                    stack.pop();
                }
                Err(zk::Error::NoNode) => match crate::nodes::parent(&path) {
                    // A name has at most 128 segments (255 bytes): no cap below that (review L4).
                    Some(p) if stack.len() < 256 => stack.push(p.to_owned()),
                    _ => return Err(zk::Error::NoNode),
                },
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Deletes `path`, retrying transient errors until done or the session is gone (Curator's
    /// guaranteed delete). `Ok(false)`: there was no such node (and no earlier try of ours can
    /// have deleted it).
    pub(crate) async fn delete_guaranteed(
        &self,
        path: &str,
    ) -> std::result::Result<bool, zk::Error> {
        let mut pause = Backoff::new(RETRY_MIN, RETRY_MAX);
        // Whether an earlier try may have deleted it and only its answer was lost: then a
        // NoNode is our own delete, not a loss (review L2; Curator ignores NoNode here).
        // Only within one session: a node gone with an expired session was lost, not deleted.
        let mut maybe_applied = false;
        let session = self.client().session_id().0;
        loop {
            match self.delete(path).await {
                Ok(()) => return Ok(true),
                Err(zk::Error::NoNode) => {
                    return Ok(maybe_applied && self.client().session_id().0 == session);
                }
                Err(e) if is_transient(&e) => {
                    maybe_applied = true;
                    tracing::debug!(path, error = %e, "delete failed; retrying");
                    pause.wait().await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Finds the node `dir/{prefix}...` by its protection prefix and deletes it: the cleanup
    /// of a create whose answer was never seen.
    pub(crate) async fn delete_by_prefix(
        &self,
        dir: &str,
        prefix: &str,
    ) -> std::result::Result<bool, zk::Error> {
        let mut pause = Backoff::new(RETRY_MIN, RETRY_MAX);
        loop {
            match self.children(dir).await {
                Ok(children) => {
                    // Every node with the prefix: a create retried after a lost answer can
                    // have left two (review M3).
                    let mut deleted = false;
                    for node in children.iter().filter(|c| c.starts_with(prefix)) {
                        deleted |= self.delete_guaranteed(&format!("{dir}/{node}")).await?;
                    }
                    return Ok(deleted);
                }
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) if is_transient(&e) => {
                    pause.wait().await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn reopen(&self) -> Result<zk::StateWatcher> {
        let sent = Instant::now();
        let client = open(&self.config).await?;
        let watcher = client.state_watcher();
        bump(&self.counters.sessions);
        let live = Live::new(&client, sent);
        *self.client.write().unwrap_or_else(PoisonError::into_inner) = client;
        lock(&self.holds).live = Some(live);
        Ok(watcher)
    }
}

/// Turns session states into hold states: Disconnected suspends every live hold, a
/// reconnection within the session vouches for them again, and Expired or Closed loses them.
/// After an expiry a new session is opened, so the provider stays usable.
async fn watch_state(session: Weak<Session>, mut watcher: zk::StateWatcher) {
    loop {
        let state = watcher.changed().await;
        let Some(s) = session.upgrade() else { return };
        match state {
            zk::SessionState::Disconnected => {
                tracing::warn!(store = %s.store_id, "zookeeper session disconnected; holds suspended");
                s.suspend_all(true);
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                tracing::info!(store = %s.store_id, "zookeeper session reconnected");
                s.suspend_all(false);
                s.reconnected();
            }
            zk::SessionState::Expired => {
                s.lose_all(LossReason::SessionExpired, "the zookeeper session expired");
                // Retry with only a weak reference between tries: a provider dropped while
                // the ensemble is unreachable stops reconnecting (review L3).
                drop(s);
                let mut pause = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
                loop {
                    let Some(s) = session.upgrade() else { return };
                    match s.reopen().await {
                        Ok(w) => {
                            watcher = w;
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(store = %s.store_id, error = %e, "could not open a new zookeeper session; retrying");
                        }
                    }
                    drop(s);
                    pause.wait().await;
                }
            }
            zk::SessionState::Closed | zk::SessionState::AuthFailed => {
                s.lose_all(
                    LossReason::SessionExpired,
                    "the zookeeper session was closed",
                );
                return;
            }
        }
    }
}

/// Keeps the session's horizon moving while holds are live: when nothing was heard from the
/// server for a quarter of the session timeout, it sends a probe. A watchdog renewal (every
/// third of the lease, 10 s by default) is too rare for a session that the server ends 10 s
/// after it last heard from it, and the client library's own pings are invisible here.
async fn keep_horizon(session: Weak<Session>, wake: Arc<Notify>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::HoldState;

    /// Review L1: a hold registered while the session is disconnected starts suspended, and
    /// one whose node belongs to a session that expired meanwhile is lost at once. The old
    /// registry ignored the session's state: both started `Held`, and the second was never
    /// told. The state changes are driven as `watch_state` drives them.
    #[tokio::test]
    async fn a_hold_registered_during_a_state_change_gets_that_state() {
        let Some(url) = dlock_conformance::service_url("DLOCK_ZK_URL") else {
            return;
        };
        let s = Session::connect(ZkConfig::from_url(&url).unwrap())
            .await
            .unwrap();
        let name = LockName::new("l1").unwrap();
        let live = s.client().session_id().0;
        s.suspend_all(true); // Disconnected
        let during = HoldSignal::new();
        s.register(&name, &during, live);
        assert_eq!(during.state(), HoldState::Suspended);
        s.suspend_all(false); // SyncConnected
        assert_eq!(during.state(), HoldState::Held);
        s.lose_all(LossReason::SessionExpired, "test"); // Expired
        assert_eq!(during.reason(), Some(LossReason::SessionExpired));
        let late = HoldSignal::new();
        s.register(&name, &late, live);
        assert_eq!(late.reason(), Some(LossReason::SessionExpired));
        assert!(!s.is_live(live));
        assert_eq!(s.live_holds(), 0);
    }
}
