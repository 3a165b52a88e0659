//! The provider's one ZooKeeper session: the client every lock shares, counted server calls,
//! the registry of live holds, and the task that turns session states into hold states.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::Duration;

use dlock_core::{HoldSignal, LockName, Result};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{from_zk, is_transient};

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
}

impl ZkStats {
    /// All server calls (wake-ups are not calls).
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
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Registered {
    name: LockName,
    signal: HoldSignal,
}

/// One ZooKeeper session shared by every handle of a provider.
pub(crate) struct Session {
    pub(crate) config: ZkConfig,
    pub(crate) store_id: String,
    client: RwLock<zk::Client>,
    counters: Counters,
    holds: Mutex<HashMap<u64, Registered>>,
    next_hold: AtomicU64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkProvider")
            .field("store", &self.store_id)
            .field("session", &self.client().session_id())
            .finish()
    }
}

async fn open(config: &ZkConfig) -> Result<zk::Client> {
    let mut connector = zk::Client::connector()
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
        let client = open(&config).await?;
        let watcher = client.state_watcher();
        let session = Arc::new(Self {
            store_id: config.store_id(),
            config,
            client: RwLock::new(client),
            counters: Counters::default(),
            holds: Mutex::new(HashMap::new()),
            next_hold: AtomicU64::new(0),
        });
        runtime.spawn(watch_state(Arc::downgrade(&session), watcher));
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
        }
    }

    pub(crate) fn woken(&self) {
        bump(&self.counters.wakeups);
    }

    // ------------------------------------------------------------ holds

    /// Registers a live hold's signal, for suspension and loss; returns its id.
    pub(crate) fn register(&self, name: &LockName, signal: &HoldSignal) -> u64 {
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        lock(&self.holds).insert(
            id,
            Registered {
                name: name.clone(),
                signal: signal.clone(),
            },
        );
        id
    }

    pub(crate) fn unregister(&self, id: u64) {
        lock(&self.holds).remove(&id);
    }

    /// Live holds right now.
    pub(crate) fn live_holds(&self) -> usize {
        lock(&self.holds).len()
    }

    fn suspend_all(&self, suspended: bool) {
        for h in lock(&self.holds).values() {
            h.signal.set_suspended(suspended);
        }
    }

    fn lose_all(&self, reason: &str) {
        let lost: Vec<Registered> = lock(&self.holds).drain().map(|(_, h)| h).collect();
        for h in lost {
            h.signal.mark_lost(&h.name, reason);
        }
    }

    // ------------------------------------------------------------ counted calls

    pub(crate) async fn create(
        &self,
        path: &str,
        mode: zk::CreateMode,
    ) -> std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error> {
        bump(&self.counters.creates);
        let client = self.client();
        let options = mode.with_acls(zk::Acls::anyone_all());
        client.create(path, &[], &options).await
    }

    pub(crate) async fn delete(&self, path: &str) -> std::result::Result<(), zk::Error> {
        bump(&self.counters.deletes);
        self.client().delete(path, None).await
    }

    pub(crate) async fn children(&self, path: &str) -> std::result::Result<Vec<String>, zk::Error> {
        bump(&self.counters.get_children);
        self.client().list_children(path).await
    }

    pub(crate) async fn children_watch(
        &self,
        path: &str,
    ) -> std::result::Result<(Vec<String>, zk::OneshotWatcher), zk::Error> {
        bump(&self.counters.get_children);
        let client = self.client();
        client.list_and_watch_children(path).await
    }

    pub(crate) async fn data_watch(
        &self,
        path: &str,
    ) -> std::result::Result<zk::OneshotWatcher, zk::Error> {
        bump(&self.counters.get_data);
        let client = self.client();
        let (_, _, watcher) = client.get_and_watch_data(path).await?;
        Ok(watcher)
    }

    pub(crate) async fn exists(
        &self,
        path: &str,
    ) -> std::result::Result<Option<zk::Stat>, zk::Error> {
        bump(&self.counters.exists);
        self.client().check_stat(path).await
    }

    // ------------------------------------------------------------ recipes' helpers

    /// Runs `call` again after transient errors (the client reconnects by itself), a few
    /// times with a growing pause.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut call: F) -> std::result::Result<T, zk::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, zk::Error>>,
    {
        let mut pause = RETRY_MIN;
        let mut tries = 0;
        loop {
            match call().await {
                Err(e) if is_transient(&e) && tries < RETRIES => {
                    tries += 1;
                    tracing::debug!(error = %e, "zookeeper call failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
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
                    Some(p) if stack.len() < 64 => stack.push(p.to_owned()),
                    _ => return Err(zk::Error::NoNode),
                },
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Deletes `path`, retrying transient errors until done or the session is gone (Curator's
    /// guaranteed delete). `Ok(false)`: there was no such node.
    pub(crate) async fn delete_guaranteed(
        &self,
        path: &str,
    ) -> std::result::Result<bool, zk::Error> {
        let mut pause = RETRY_MIN;
        loop {
            match self.delete(path).await {
                Ok(()) => return Ok(true),
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) if is_transient(&e) => {
                    tracing::debug!(path, error = %e, "delete failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
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
        let mut pause = RETRY_MIN;
        loop {
            match self.children(dir).await {
                Ok(children) => {
                    return match children.iter().find(|c| c.starts_with(prefix)) {
                        Some(node) => self.delete_guaranteed(&format!("{dir}/{node}")).await,
                        None => Ok(false),
                    };
                }
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) if is_transient(&e) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn reopen(&self) -> Result<zk::StateWatcher> {
        let client = open(&self.config).await?;
        let watcher = client.state_watcher();
        *self.client.write().unwrap_or_else(PoisonError::into_inner) = client;
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
            }
            zk::SessionState::Expired => {
                s.lose_all("the zookeeper session expired");
                let mut pause = Duration::from_millis(100);
                loop {
                    match s.reopen().await {
                        Ok(w) => {
                            watcher = w;
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(store = %s.store_id, error = %e, "could not open a new zookeeper session; retrying");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_secs(5));
                        }
                    }
                }
            }
            zk::SessionState::Closed | zk::SessionState::AuthFailed => {
                s.lose_all("the zookeeper session was closed");
                return;
            }
        }
    }
}
