//! A waiter's wait for its predecessor: a watch of the one key created just before its own
//! (a release wakes one waiter, no herd), with looks of its own while etcd may hold the
//! watch's events back, and an end after the lease's time-to-live so that a watch on a
//! connection gone silent cannot keep the waiter (whose key heads the queue once the
//! predecessor is gone) waiting for good.

use std::time::Duration;

use dlock_core::backend::later;
use etcd_client::{EventType, GetOptions, SortOrder, SortTarget, WatchFilterType, WatchOptions};
use tokio::time::Instant;

use crate::session::Session;

/// How long after its creation a waiter's watch may be held back by etcd: one that starts
/// "now" is registered at the revision etcd read just before, so a write committed in between
/// puts it in the store's unsynced group, which etcd catches up every 100 ms (its
/// `syncWatchersLoop`; longer when it has more than 512 such watches to catch up). A
/// margin above the usual 100 ms.
const UNSYNCED_FOR: Duration = Duration::from_millis(150);

/// How often a waiter looks at its predecessor itself while its watch may be held back: a
/// delete held back then costs a handoff this long at most instead of etcd's 100 ms, and
/// looking more often shortens no wait while its reads cost throughput.
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// Waits until the key created just before `mine` in `range` is deleted (at once if there is
/// none). Only that one key is watched: a release wakes one waiter.
///
/// The watch starts at the store's current revision, not at the revision of the read: etcd
/// serves a watch that starts in the past from its "unsynced" group, which it catches up
/// only every 100 ms, so under contention (other contenders' writes moving the revision on)
/// each handoff would wait up to 100 ms. A delete between the read and the watch is caught
/// by looking at the key again once the watch exists, whenever the store moved on meanwhile.
///
/// Even a watch that starts "now" lands in that group when a write commits while etcd
/// registers it (etcd reads the revision first): its delete then typically arrives up to
/// 100 ms late, although the key is gone (another watcher saw it at once). So for the first [`UNSYNCED_FOR`] after its watch was
/// created the waiter also looks at the key every [`LOOK_EVERY`], unless a look proves the
/// watch was not held back; from then on the watch alone wakes it.
pub(crate) async fn wait_for_predecessor(
    session: &Session,
    range: &str,
    mine: i64,
) -> Result<(), etcd_client::Error> {
    session.counters.count(|s| &mut s.gets);
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(mine - 1)
        .with_limit(1);
    let mut client = session.client();
    let resp = session.bounded(client.get(range, Some(options))).await?;
    let Some(before) = resp.kvs().first() else {
        return Ok(());
    };
    let watched = Watched {
        key: before.key().to_vec(),
        created: before.create_revision(),
        read_at: resp.header().map_or(0, |h| h.revision()),
    };
    session.counters.count(|s| &mut s.watches);
    let no_put = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    let mut stream = session
        .bounded(client.watch(watched.key.clone(), Some(no_put)))
        .await?;
    let wait = await_delete(session, &mut client, &mut stream, &watched, UNSYNCED_FOR);
    at_most(session.config.lease_ttl, wait).await
}

/// `wait`, or `Ok` once `recheck` has passed without its end: the caller then looks at the
/// queue (a linearizable read) and waits again on a new watch. A watch's stream can stay
/// silent for good on a connection that died without a reset (a member host that vanished,
/// a half-open middlebox) while the provider's lease is kept alive through another member:
/// the waiter would never hear its predecessor's delete, and its key, first in the queue,
/// would keep every client out. Bounded, such a waiter finds the lock free at its next look,
/// within one time-to-live of the release (as long as etcd takes to free a crashed holder's
/// key); and a waiter whose own key is gone finds that out too.
async fn at_most(
    recheck: Duration,
    wait: impl Future<Output = Result<(), etcd_client::Error>>,
) -> Result<(), etcd_client::Error> {
    match tokio::time::timeout_at(later(Instant::now(), recheck), wait).await {
        Ok(waited) => waited,
        Err(_) => {
            tracing::debug!(
                ?recheck,
                "etcd: a waiter's watch said nothing for a time-to-live; looking again"
            );
            Ok(())
        }
    }
}

/// The key a waiter watches: its name, its create revision, and the revision it was read at.
struct Watched {
    key: Vec<u8>,
    created: i64,
    read_at: i64,
}

/// What came first while a look was due: the watch's next message, or the look.
enum Next {
    Message(Result<Option<etcd_client::WatchResponse>, etcd_client::Error>),
    Looked(Result<Seen, etcd_client::Error>),
}

/// What a look at the watched key found.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The key is gone (or is another key of the same name now).
    gone: bool,
    /// The store's revision when it was read (`None`: the answer had no header).
    revision: Option<i64>,
}

/// Waits on `stream` (a watch of `watched`) until the key is deleted. For `unsynced_for`
/// after the watch was created (while etcd may hold its events back) it also looks at the
/// key [`LOOK_EVERY`] after the last look, racing the watch: a look that fails, or is slow,
/// holds nothing back and ends nothing (the watch goes on). The one look made when the watch
/// is created (if the store moved on since the read), which alone can see a delete made
/// before the watch, is not raced, and its failure ends the wait as a watch's does. A look
/// that finds the store still at the revision the watch was created at proves the watch was
/// never held back (no write committed while etcd registered it), and ends the looking.
async fn await_delete(
    session: &Session,
    client: &mut etcd_client::Client,
    stream: &mut etcd_client::WatchStream,
    watched: &Watched,
    unsynced_for: Duration,
) -> Result<(), etcd_client::Error> {
    // The end of the looking, and the revision the watch was created at (if etcd said), once
    // it was.
    let mut window: Option<(Instant, Option<i64>)> = None;
    // When to look at the key next.
    let mut look_at: Option<Instant> = None;
    let next_look = |window: Option<(Instant, Option<i64>)>| {
        let (until, _) = window?;
        Some(later(Instant::now(), LOOK_EVERY)).filter(|at| *at < until)
    };
    loop {
        let next = match look_at {
            Some(at) => {
                let look = async {
                    tokio::time::sleep_until(at).await;
                    look_at_key(session, client, watched).await
                };
                tokio::select! {
                    // Cancel safe: the stream keeps what it has read, and a look dropped
                    // half-way is a read nobody waits for.
                    m = stream.message() => Next::Message(m),
                    seen = look => Next::Looked(seen),
                }
            }
            None => Next::Message(stream.message().await),
        };
        let message = match next {
            Next::Looked(Ok(seen)) if seen.gone => return Ok(()),
            Next::Looked(Ok(seen)) if window.is_some_and(|(_, from)| unchanged(seen, from)) => {
                look_at = None;
                continue;
            }
            Next::Looked(Ok(_)) => {
                look_at = next_look(window);
                continue;
            }
            Next::Looked(Err(e)) => {
                tracing::debug!(error = %e, "etcd: a waiter's look at its predecessor failed; the watch goes on");
                look_at = next_look(window);
                continue;
            }
            Next::Message(m) => m,
        };
        let Some(resp) = message? else {
            return Err(etcd_client::Error::WatchError(
                "the watch stream ended".into(),
            ));
        };
        if resp.canceled() {
            // The watch was refused: look again.
            return Ok(());
        }
        if resp
            .events()
            .iter()
            .any(|e| e.event_type() == EventType::Delete)
        {
            session.counters.count(|s| &mut s.wakeups);
            return Ok(());
        }
        if resp.created() {
            // etcd's header here is the revision it read right before registering the watch.
            let watched_from = resp.header().map(|h| h.revision());
            window = Some((later(Instant::now(), unsynced_for), watched_from));
            look_at = next_look(window);
            // The store moved on between the read and the watch: the predecessor may have
            // gone (or left and come back behind us) in between.
            if watched_from.is_none_or(|from| from > watched.read_at) {
                let seen = look_at_key(session, client, watched).await?;
                if seen.gone {
                    return Ok(());
                }
                if unchanged(seen, watched_from) {
                    look_at = None;
                }
            }
        }
    }
}

/// Whether a look found the store at the revision a watch was created at: no write came in
/// between, so etcd registered the watch at the store's revision and never held it back.
fn unchanged(seen: Seen, watched_from: Option<i64>) -> bool {
    seen.revision.is_some() && seen.revision == watched_from
}

/// Reads the key a waiter watches. The read must stay linearizable (etcd's default): a look
/// that found the store at the watch's revision proves that no write came in between only
/// if it saw every write committed before it was sent.
async fn look_at_key(
    session: &Session,
    client: &mut etcd_client::Client,
    watched: &Watched,
) -> Result<Seen, etcd_client::Error> {
    session.counters.count(|s| &mut s.gets);
    let now = session
        .bounded(client.get(watched.key.as_slice(), None))
        .await?;
    Ok(Seen {
        gone: now.kvs().first().map(|kv| kv.create_revision()) != Some(watched.created),
        revision: now.header().map(|h| h.revision()),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use etcd_client::PutOptions;

    use super::*;
    use crate::keepalive::test_session;

    /// A waiter's wait whose watch is silent: the predecessor is gone before the wait starts,
    /// its watch is of another key (which never changes), and the read it started from is
    /// taken as the newest (so the check when the watch is created does not look). The
    /// predecessor lived in a lease of the test's own, revoked at the end.
    struct SilentWatch {
        session: Arc<Session>,
        lease: i64,
        stream: etcd_client::WatchStream,
        watched: Watched,
    }

    fn etcd(e: etcd_client::Error) -> String {
        e.to_string()
    }

    impl SilentWatch {
        async fn start(what: &str) -> Result<Option<Self>, String> {
            let Some((session, lease)) = test_session().await? else {
                return Ok(None);
            };
            let mut client = session.client();
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            let base = format!("dlock-test/{what}/{}-{nanos}", std::process::id());
            let key = format!("{base}/predecessor");
            let options = PutOptions::new().with_lease(lease);
            let put = client
                .put(key.as_str(), "", Some(options))
                .await
                .map_err(etcd)?;
            let created = put.header().map_or(0, |h| h.revision());
            let no_put = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
            let silent = format!("{base}/silent");
            let stream = client.watch(silent, Some(no_put)).await.map_err(etcd)?;
            client.delete(key.as_str(), None).await.map_err(etcd)?;
            let watched = Watched {
                key: key.into_bytes(),
                created,
                read_at: i64::MAX,
            };
            Ok(Some(Self {
                session,
                lease,
                stream,
                watched,
            }))
        }

        /// Runs `await_delete` with `unsynced_for` (bounded by `recheck`, if given) in a task;
        /// `Err` unless it ends within 10 s.
        async fn wait(
            self,
            unsynced_for: Duration,
            recheck: Option<Duration>,
        ) -> Result<Arc<Session>, String> {
            let Self {
                session,
                lease,
                mut stream,
                watched,
            } = self;
            let waiter = {
                let (session, mut client) = (Arc::clone(&session), session.client());
                tokio::spawn(async move {
                    let wait =
                        await_delete(&session, &mut client, &mut stream, &watched, unsynced_for);
                    match recheck {
                        Some(bound) => at_most(bound, wait).await,
                        None => wait.await,
                    }
                })
            };
            let ended = tokio::time::timeout(Duration::from_secs(10), waiter).await;
            drop(session.client().lease_revoke(lease).await);
            let ended = ended.map_err(|_| "the wait did not end within 10 s".to_string())?;
            ended.map_err(|e| e.to_string())?.map_err(etcd)?;
            Ok(session)
        }
    }

    /// A waiter whose watch holds the delete back (as etcd's unsynced group does, typically
    /// for up to 100 ms) still sees its predecessor go, by looking at it: only the waiter's
    /// looks can end the wait here.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_sees_its_predecessor_go_while_its_watch_is_silent() -> Result<(), String> {
        let Some(rig) = SilentWatch::start("silent-watch").await? else {
            return Ok(());
        };
        // Looks for as long as the test runs.
        let session = rig.wait(Duration::from_secs(3600), None).await?;
        let stats = session.stats();
        if stats.wakeups != 0 || stats.gets == 0 {
            return Err(format!(
                "the waiter should have woken by its own look, not by a watch event: {stats:?}"
            ));
        }
        Ok(())
    }

    /// A waiter whose watch never reports its predecessor's delete (a connection gone silent),
    /// with no looks of the unsynced window, still ends its wait within the bound, so that its
    /// caller looks again. Without the bound it waited until its caller's deadline (for good,
    /// for `acquire()`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_on_a_silent_watch_ends_within_the_bound() -> Result<(), String> {
        let Some(rig) = SilentWatch::start("silent-for-good").await? else {
            return Ok(());
        };
        rig.wait(Duration::ZERO, Some(Duration::from_secs(1)))
            .await?;
        Ok(())
    }
}
