//! The provider's one ZooKeeper session: the client every lock shares, opened again after an
//! expiry, and the task that turns session states into hold states.
//!
//! Its parts, one concern each: the counted server calls ([`calls`]), the session's horizon
//! and the probes that keep it moving ([`horizon`]), the registry of live holds ([`holds`]),
//! and the compound operations the recipes share ([`ops`]).

mod calls;
mod holds;
mod horizon;
mod ops;
mod renewals;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Backoff, Batcher, HoldSet, Mutex, Tally};
use dlock_core::{LossReason, Result};
use tokio::sync::Notify;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::from_zk;

pub use self::calls::ZkStats;
use self::horizon::{Live, keep_horizon};
pub(crate) use self::renewals::Node;

/// One ZooKeeper session shared by every handle of a provider.
pub(crate) struct Session {
    pub(crate) config: ZkConfig,
    pub(crate) store_id: String,
    client: Mutex<zk::Client>,
    /// The calls, wake-ups, sessions and probes counted so far.
    counters: Tally<ZkStats>,
    /// The live holds, suspended while the client is disconnected and closed from an expiry
    /// until a new session is open.
    holds: HoldSet,
    /// The session whose nodes are live; `None` from its expiry until a new one is open. A
    /// grant of a node of any other session is lost on arrival. Locked before `holds` when
    /// both are.
    live: Mutex<Option<Live>>,
    /// Wakes the probe task: a hold was registered, or the session reconnected.
    probe_wake: Arc<Notify>,
    /// The watchdog's renewals of the holds, in batches ([`renewals`]).
    pub(crate) renewals: Batcher<String, Node>,
    /// Whether the server knows multi-read (until it answers one with `Unimplemented`).
    multi_read: AtomicBool,
    /// The runtime the session was opened on: where clean-ups run that are started where no
    /// runtime is (a guard leaked, an acquisition dropped, on a plain thread).
    runtime: tokio::runtime::Handle,
    /// A test's way to have a session end between a waiter's create and its watch.
    #[cfg(test)]
    pub(crate) watch_gate: WatchGate,
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
    /// Opens the session and starts the tasks that watch its state and keep its horizon.
    pub(crate) async fn connect(config: ZkConfig) -> Result<Arc<Self>> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(dlock_core::Error::config(
                "the zookeeper backend runs on tokio: connect from within a tokio runtime",
            ));
        };
        config.check()?;
        let sent = Instant::now();
        let client = open(&config).await?;
        let watcher = client.state_watcher();
        let counters = Tally::<ZkStats>::default();
        counters.count(|s| &mut s.sessions);
        let probe_wake = Arc::new(Notify::new());
        let session = Arc::new_cyclic(|me| Self {
            renewals: renewals::batcher(Weak::clone(me)),
            multi_read: AtomicBool::new(true),
            store_id: config.store_id(),
            config,
            live: Mutex::new(Some(Live::new(&client, sent))),
            holds: HoldSet::new(),
            client: Mutex::new(client),
            counters,
            probe_wake: Arc::clone(&probe_wake),
            runtime: runtime.clone(),
            #[cfg(test)]
            watch_gate: WatchGate::default(),
        });
        runtime.spawn(watch_state(Arc::downgrade(&session), watcher));
        runtime.spawn(keep_horizon(Arc::downgrade(&session), probe_wake));
        Ok(session)
    }

    /// Runs `task` in the background: on the runtime of the caller if there is one, else on
    /// the one the session was opened on (a runtime shutting down drops it quietly; the
    /// session's end then removes what it would have).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let runtime =
            tokio::runtime::Handle::try_current().unwrap_or_else(|_| self.runtime.clone());
        drop(runtime.spawn(task));
    }

    /// The current session's client (a cheap clone).
    pub(crate) fn client(&self) -> zk::Client {
        self.client.lock().clone()
    }

    /// The timeout the server negotiated for the current session: how long it keeps a session
    /// it does not hear from.
    pub(crate) fn session_timeout(&self) -> Duration {
        self.client().session_timeout()
    }

    /// Whether the current session's client is connected to a server right now.
    pub(crate) fn is_connected(&self) -> bool {
        matches!(
            self.client().state(),
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
        )
    }

    /// The session is over: every hold is lost, and so is every hold granted on it later.
    fn ended(&self, detail: &str) {
        *self.live.lock() = None;
        let lost = self.holds.close(LossReason::SessionExpired);
        if lost > 0 {
            tracing::warn!(store = %self.store_id, holds = lost, detail, "zookeeper holds lost with their session");
        }
    }

    /// Opens a new session after an expiry. Its holds are registered only once the client is
    /// in place (every node is created through [`client`](Self::client)), so the registry and
    /// the live session are set up first.
    async fn reopen(&self) -> Result<zk::StateWatcher> {
        let sent = Instant::now();
        let client = open(&self.config).await?;
        let watcher = client.state_watcher();
        self.counters.count(|s| &mut s.sessions);
        let live = Live::new(&client, sent);
        self.holds.reopen();
        *self.live.lock() = Some(live);
        *self.client.lock() = client;
        Ok(watcher)
    }
}

/// Holds back every [`data_watch`](Session::data_watch) while a test holds it closed, and
/// counts the watches that came to it.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct WatchGate {
    gate: tokio::sync::RwLock<()>,
    arrived: std::sync::atomic::AtomicUsize,
}

#[cfg(test)]
impl WatchGate {
    /// Closes the gate until the guard is dropped.
    pub(crate) async fn close(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.gate.write().await
    }

    /// How many watches came to the gate so far.
    pub(crate) fn arrived(&self) -> usize {
        self.arrived.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Counts a watch and waits while the gate is closed.
    pub(super) async fn pass(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.arrived
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.gate.read().await
    }
}

#[cfg(test)]
impl Session {
    /// A session on the server at `DLOCK_ZK_URL`, for a unit test; `None` (skip) when unset.
    pub(crate) async fn for_test() -> Option<Arc<Self>> {
        let url = dlock_conformance::service_url("DLOCK_ZK_URL")?;
        Some(
            Self::connect(ZkConfig::from_url(&url).unwrap())
                .await
                .unwrap(),
        )
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
                s.holds.suspend_all(true);
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                tracing::info!(store = %s.store_id, "zookeeper session reconnected");
                s.holds.suspend_all(false);
                s.reconnected();
            }
            zk::SessionState::Expired => {
                s.ended("the zookeeper session expired");
                // Retry with only a weak reference between tries: a provider dropped while
                // the ensemble is unreachable stops reconnecting.
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
                s.ended("the zookeeper session was closed");
                return;
            }
        }
    }
}
