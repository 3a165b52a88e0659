//! The mutex: etcd's own lock (the recipe behind `etcdctl lock` and the v3 Lock RPC). A
//! contender puts `{lock name}/{lease id in hex}` with the provider's lease; the key with the
//! lowest create revision holds the lock; every other waits for the delete of the key just
//! before its own (no herd), then looks again. The holder's create revision is its fencing
//! token: etcd's revisions only grow, across releases, expiries, restarts and elections.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_core::backend::{
    Backoff, Deadline, Hold, HoldSignal, NewHold, RawLock, Request, from_now, later,
};
use dlock_core::{
    Error, FencingToken, LockGuard, LockKind, LockName, LockOptions, Result, async_trait,
};
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchFilterType, WatchOptions,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::BACKEND;
use crate::error::{from_etcd, is_lease_gone, is_transient};
use crate::session::{Claim, RETRY_MAX, RETRY_MIN, Session, worth_a_warning};

/// A mutex handle: the etcd lock name (`{prefix}{escaped name}`) it contends for.
#[derive(Debug)]
pub(crate) struct EtcdMutex {
    pub(crate) session: Arc<Session>,
    pub(crate) lock_name: String,
}

#[async_trait]
impl RawLock for EtcdMutex {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        acquire(
            &self.session,
            req.name,
            &self.lock_name,
            req.options,
            req.deadline,
        )
        .await
    }
}

/// The key range of lock name `lock_name`: `{lock_name}/`, as etcd's lock has it.
fn range(lock_name: &str) -> String {
    format!("{lock_name}/")
}

/// The first key of a range by create revision: the holder.
fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// A contender's key while it is not a hold yet: deleted if the acquire ends without the
/// lock (a deadline, an error, a dropped future), and only then given back to the provider.
struct Undo {
    session: Arc<Session>,
    claim: Option<Claim>,
    /// The put in flight, if any. It runs in a task of its own and is never cut off midway:
    /// a put cancelled on the wire could still reach the cluster after the undo's delete
    /// (another member, another connection) and leave a key nobody deletes. The undo waits
    /// for it to finish, then deletes.
    put: Option<JoinHandle<Entered>>,
}

/// What the put transaction of [`enter`] answered.
type Entered = Result<(bool, Look), etcd_client::Error>;

impl Undo {
    /// Hands the key to the hold.
    fn disarm(&mut self) -> Option<Claim> {
        self.claim.take()
    }

    /// The wait ended without the lock: deletes the key before returning `outcome`, so a
    /// caller that tries again at once (or another handle of this provider) does not find it
    /// queued. A key of a lease that is no longer live is not deleted: it goes with its lease,
    /// which nobody keeps alive any more. Cut off (the core's grace after the deadline), or if
    /// the delete fails, the drop deletes the key in the background; a failed delete is then
    /// the answer instead of "held" (`Ok(None)`).
    async fn give_up(mut self, outcome: Result<Option<LockGuard>>) -> Result<Option<LockGuard>> {
        if let Some(put) = self.put.take() {
            let _ = put.await;
        }
        if let Some(claim) = &self.claim
            && self.session.lease_now() == Some(claim.lease)
            && let Err(e) = delete_key(&self.session, &claim.key, None).await
        {
            return outcome.and(Err(e));
        }
        self.claim = None;
        outcome
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some(claim) = self.disarm() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = Arc::downgrade(&self.session);
        let put = self.put.take();
        runtime.spawn(async move {
            if let Some(put) = put {
                let _ = put.await;
            }
            delete_until_gone(session, None, claim).await;
        });
    }
}

/// Deletes `key` (only if it still has create revision `rev`, when given), retrying transient
/// errors for at most the lease's time-to-live: after that the lease ends the key anyway.
/// Returns whether the key was ours and is gone now. A retry that finds the key gone after
/// an attempt whose answer was lost counts as deleted: that attempt may well have been
/// applied (the key is this contender's alone; only the lease's end deletes it otherwise,
/// and then it is gone either way).
async fn delete_key(session: &Session, key: &str, rev: Option<i64>) -> Result<bool> {
    let give_up = later(Instant::now(), session.config.lease_ttl);
    let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
    let mut answer_lost = false;
    loop {
        let mut txn = Txn::new();
        if let Some(rev) = rev {
            txn = txn.when([Compare::create_revision(key, CompareOp::Equal, rev)]);
        }
        txn = txn.and_then([TxnOp::delete(key, None)]);
        match session.txn(None, txn).await {
            Ok(resp) => return Ok(resp.succeeded() || answer_lost),
            Err(e) if is_transient(&e) && Instant::now() < give_up => {
                answer_lost = true;
                backoff.wait().await;
            }
            Err(e) => return Err(from_etcd(&format!("delete {key}"), e)),
        }
    }
}

/// Deletes the claimed key (if it still has create revision `rev`, when given) in the
/// background until it is gone, the lease it was put with has ended (the server deletes it
/// with the lease), or the provider is dropped (which revokes the lease); then gives the
/// claim back. A key whose delete failed is never left behind while its lease lives: it
/// would keep the lock from everyone else for the provider's whole life.
async fn delete_until_gone(session: Weak<Session>, rev: Option<i64>, claim: Claim) {
    let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
    loop {
        let Some(s) = session.upgrade() else { return };
        if s.lease_now() != Some(claim.lease) {
            return;
        }
        match delete_key(&s, &claim.key, rev).await {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(key = %claim.key, error = %e, "etcd: deleting a key failed; again");
            }
        }
        drop(s);
        backoff.wait().await;
    }
}

/// What a look at the lock found: this contender's key's create revision (0: it has none),
/// and the holder's (0: nobody holds it).
#[derive(Debug, Clone, Copy)]
struct Look {
    mine: i64,
    holder: i64,
}

fn create_revision(resp: &TxnOpResponse) -> i64 {
    match resp {
        TxnOpResponse::Get(g) => g.kvs().first().map_or(0, |kv| kv.create_revision()),
        TxnOpResponse::Put(_) | TxnOpResponse::Delete(_) | TxnOpResponse::Txn(_) => 0,
    }
}

/// Puts this contender's key if it has none, and reads its create revision and the holder's,
/// in one transaction.
async fn enter(
    session: &Session,
    lease: i64,
    key: &str,
    range: &str,
) -> Result<(bool, Look), etcd_client::Error> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(key, None),
            TxnOp::get(range, Some(first_created())),
        ])
        .or_else([
            TxnOp::get(key, None),
            TxnOp::get(range, Some(first_created())),
        ]);
    let resp = session.txn(Some(lease), txn).await?;
    let created = resp.succeeded();
    let ops = resp.op_responses();
    let skip = usize::from(created);
    let mine = ops.get(skip).map_or(0, create_revision);
    let holder = ops.get(skip + 1).map_or(0, create_revision);
    Ok((created, Look { mine, holder }))
}

/// Reads this contender's create revision and the holder's.
async fn look(session: &Session, key: &str, range: &str) -> Result<Look, etcd_client::Error> {
    let txn = Txn::new().and_then([
        TxnOp::get(key, None),
        TxnOp::get(range, Some(first_created())),
    ]);
    let resp = session.txn(None, txn).await?;
    let ops = resp.op_responses();
    Ok(Look {
        mine: ops.first().map_or(0, create_revision),
        holder: ops.get(1).map_or(0, create_revision),
    })
}

/// How long after its creation a waiter's watch may be held back by etcd: one that starts
/// "now" is registered at the revision etcd read just before, so a write committed in between
/// puts it in the store's unsynced group, which etcd catches up every 100 ms (its
/// `syncWatchersLoop`; longer when it has more than 512 such watches to catch up). A
/// margin above the usual 100 ms.
const UNSYNCED_FOR: Duration = Duration::from_millis(150);

/// How often a waiter looks at its predecessor itself while its watch may be held back. W2F
/// of `dlock bench` (8 clients on one name), three runs each: the longest wait was 47.5-48.8
/// ms looking every 20 ms, 27.7-37.1 ms every 10 ms (W2: 30.4-46.5 and 29.5-33.4 ms); every
/// 5 ms gave no shorter waits and cost 10-15 % of the throughput (the looks' reads).
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// Waits until the key created just before `mine` in `range` is deleted (at once if there is
/// none). Only that one key is watched: a release wakes one waiter.
///
/// The watch starts at the store's current revision, not at the revision of the read: etcd
/// serves a watch that starts in the past from its "unsynced" group, which it catches up
/// only every 100 ms, so under contention (other contenders' writes moving the revision on)
/// each handoff waited up to 100 ms. A delete between the read and the watch is caught by
/// looking at the key again once the watch exists, whenever the store moved on meanwhile.
///
/// Even a watch that starts "now" lands in that group when a write commits while etcd
/// registers it (etcd reads the revision first; 1-2 % of the handoffs of 8 contenders on one
/// name): its delete then typically arrives up to 100 ms late, although the key is gone
/// (another watcher saw it at once). So for the first [`UNSYNCED_FOR`] after its watch was
/// created the waiter also looks at the key every [`LOOK_EVERY`], unless a look proves the
/// watch was not held back; from then on the watch alone wakes it.
async fn wait_for_predecessor(
    session: &Session,
    range: &str,
    mine: i64,
) -> Result<(), etcd_client::Error> {
    session.count_get();
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(mine - 1)
        .with_limit(1);
    let mut client = session.client();
    let resp = client.get(range, Some(options)).await?;
    let Some(before) = resp.kvs().first() else {
        return Ok(());
    };
    let watched = Watched {
        key: before.key().to_vec(),
        created: before.create_revision(),
        read_at: resp.header().map_or(0, |h| h.revision()),
    };
    session.count_watch();
    let mut stream = client
        .watch(
            watched.key.clone(),
            Some(WatchOptions::new().with_filters([WatchFilterType::NoPut])),
        )
        .await?;
    await_delete(session, &mut client, &mut stream, &watched, UNSYNCED_FOR).await
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
            session.count_wakeup();
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
    session.count_get();
    let now = client.get(watched.key.as_slice(), None).await?;
    Ok(Seen {
        gone: now.kvs().first().map(|kv| kv.create_revision()) != Some(watched.created),
        revision: now.header().map(|h| h.revision()),
    })
}

/// The failures of one acquisition since etcd last answered it. At the deadline the last one
/// is the answer: nothing said the lock is held. An acquisition that goes on failing (one
/// without a deadline retries for as long as it takes) says so now and then as a warning.
struct Failing<'a> {
    name: &'a LockName,
    last: Option<Error>,
    count: u32,
}

impl<'a> Failing<'a> {
    fn new(name: &'a LockName) -> Self {
        Self {
            name,
            last: None,
            count: 0,
        }
    }

    /// A call failed in a way a retry may fix.
    fn failed(&mut self, e: Error) {
        self.count = self.count.saturating_add(1);
        if worth_a_warning(self.count) {
            tracing::warn!(lock = %self.name, error = %e, failures = self.count, "etcd: acquire keeps failing; still retrying");
        } else {
            tracing::debug!(lock = %self.name, error = %e, "etcd: an acquire's call failed; retrying");
        }
        self.last = Some(e);
    }

    /// etcd answered.
    fn answered(&mut self) {
        self.last = None;
        self.count = 0;
    }
}

/// One acquisition: wait for this provider's turn on the name, then contend on etcd.
pub(crate) async fn acquire(
    session: &Arc<Session>,
    name: &LockName,
    lock_name: &str,
    options: &LockOptions,
    deadline: Deadline,
) -> Result<Option<LockGuard>> {
    let range = range(lock_name);
    let mut undo = Undo {
        session: Arc::clone(session),
        claim: None,
        put: None,
    };
    let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
    let mut failing = Failing::new(name);
    'lease: loop {
        let lease = match deadline.run(session.lease()).await {
            Some(Ok(lease)) => lease,
            Some(Err(refused)) => return undo.give_up(Err(refused)).await,
            None => {
                // No lease at the deadline: the store did not grant one, so nothing said the
                // lock is held.
                let e = session
                    .grant_failure()
                    .or(failing.last.take())
                    .unwrap_or_else(|| session.no_lease());
                return undo.give_up(Err(e)).await;
            }
        };
        // Claimed (and so undone) before the put: a put whose answer is lost is still undone.
        // A retry under the same lease keeps its key (a put that went through is found as
        // stale and deleted); a key of an ended lease ends with it.
        let claim = match undo.claim.take() {
            Some(c) if c.lease == lease => c,
            _ => session.claim(&range, lease),
        };
        let key = claim.key.clone();
        undo.claim = Some(claim);
        let mut sent = Instant::now();
        // Server calls are not cut at the deadline (a zero wait still tries once): the core
        // cuts a timed acquisition off a grace after it, and the undo gives back the key.
        let put = {
            let (session, key, range) = (Arc::clone(session), key.clone(), range.clone());
            tokio::spawn(async move { enter(&session, lease, &key, &range).await })
        };
        let entered = match undo.put.insert(put).await {
            Ok(r) => r,
            Err(e) => Err(etcd_client::Error::IoError(std::io::Error::other(e))),
        };
        undo.put = None;
        let (created, mut seen) = match entered {
            Ok(r) => {
                failing.answered();
                r
            }
            Err(e) if is_transient(&e) || is_lease_gone(&e) => {
                // A lease gone is a retry with the next lease (the session noted its end).
                let e = Error::Backend {
                    backend: BACKEND,
                    message: format!("put {key}: {e}"),
                    retryable: true,
                    source: Some(e.into()),
                };
                if deadline.has_passed() {
                    return Err(e);
                }
                failing.failed(e);
                backoff.wait().await;
                continue 'lease;
            }
            Err(e) => return Err(from_etcd(&format!("put {key}"), e)),
        };
        if !created {
            // A key of this lease that an earlier contender of this provider failed to delete
            // (its release's answer never came): stale, since a key is claimed by one
            // contender at a time. Delete it and start over, so no token is handed out twice.
            delete_key(session, &key, Some(seen.mine)).await?;
            continue 'lease;
        }
        loop {
            if seen.mine == 0 {
                // The key is gone: the lease ended while waiting. Start over with the next.
                continue 'lease;
            }
            if seen.holder == seen.mine {
                return Ok(Some(grant(
                    session, name, options, lease, key, seen.mine, sent, &mut undo,
                )));
            }
            if deadline.has_passed() {
                // "Held" only if etcd answered the last look (`seen` is its answer); else the
                // last failure since it answered (the key is deleted in the background).
                return match failing.last.take() {
                    None => undo.give_up(Ok(None)).await,
                    Some(e) => Err(e),
                };
            }
            // Cut off at the deadline, the wait goes on to one more look: a watch can be
            // silent on a connection that died, so only a look says the lock is still held.
            match deadline
                .run(wait_for_predecessor(session, &range, seen.mine))
                .await
            {
                None | Some(Ok(())) => {}
                Some(Err(e)) if is_transient(&e) => {
                    failing.failed(from_etcd(&format!("wait for the lock {lock_name}"), e));
                    if !deadline.has_passed() {
                        backoff.wait().await;
                    }
                }
                Some(Err(e)) => {
                    return Err(from_etcd(&format!("wait for the lock {lock_name}"), e));
                }
            }
            sent = Instant::now();
            seen = match look(session, &key, &range).await {
                Ok(l) => {
                    failing.answered();
                    backoff.reset();
                    l
                }
                Err(e) if is_transient(&e) => {
                    failing.failed(from_etcd(&format!("look at the lock {lock_name}"), e));
                    if !deadline.has_passed() {
                        backoff.wait().await;
                    }
                    continue;
                }
                Err(e) => return Err(from_etcd(&format!("look at the lock {lock_name}"), e)),
            };
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn grant(
    session: &Arc<Session>,
    name: &LockName,
    options: &LockOptions,
    lease: i64,
    key: String,
    rev: i64,
    sent: Instant,
    undo: &mut Undo,
) -> LockGuard {
    let claim = undo.disarm();
    let signal = HoldSignal::new();
    // The key lives as long as the provider's lease: the guard vouches for it no longer than
    // that lease's horizon (the last keep-alive the server answered, from its send, plus the
    // time-to-live it answered with), whatever the lock's own lease, so a process paused or
    // cut off past the time-to-live does not find its guard held.
    let (registration, horizon) = session.register(lease, &signal);
    let hold = EtcdHold {
        session: Arc::clone(session),
        name: name.clone(),
        key,
        rev,
        lease,
        registration,
        end: Mutex::new(later(sent, options.lease.ttl())),
        claim: Mutex::new(claim),
        released: std::sync::atomic::AtomicBool::new(false),
    };
    let token = FencingToken::new(u64::try_from(rev).unwrap_or(0));
    LockGuard::new(
        NewHold::new(
            BACKEND,
            LockKind::Mutex,
            name.clone(),
            token,
            options.lease,
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
    registration: u64,
    /// When the client-side lease ends, as far as the last renewal moved it: a leaked hold
    /// is deleted then.
    end: Mutex<Instant>,
    /// The key's reservation in this provider, given back once the key is deleted.
    claim: Mutex<Option<Claim>>,
    released: std::sync::atomic::AtomicBool,
}

impl EtcdHold {
    fn let_go(&self) {
        self.released
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.session.unregister(self.registration);
        self.claim
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

#[async_trait]
impl Hold for EtcdHold {
    async fn release(&self) -> Result<()> {
        let result = delete_key(&self.session, &self.key, Some(self.rev)).await;
        match result {
            Ok(true) => {
                self.let_go();
                Ok(())
            }
            Ok(false) => {
                self.let_go();
                Err(Error::lock_lost(&self.name))
            }
            // The key may still be there: it is deleted in the background (until its lease
            // ends), and only then given back.
            Err(e) => {
                let claim = self
                    .claim
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                self.let_go();
                if let (Some(claim), Ok(runtime)) = (claim, tokio::runtime::Handle::try_current()) {
                    let session = Arc::downgrade(&self.session);
                    runtime.spawn(delete_until_gone(session, Some(self.rev), claim));
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
                    *self
                        .end
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = later(sent, ttl);
                    return Ok(());
                }
                Ok(false) | Err(_) if Instant::now() < until => {
                    tracing::debug!(key = %self.key, ?kept, "etcd: keep-alive not confirmed while the key lives; again");
                    let pause = backoff.next_pause();
                    tokio::time::sleep_until(from_now(pause).min(until)).await;
                }
                Ok(false) => {
                    return Err(Error::Backend {
                        backend: BACKEND,
                        message: format!(
                            "the lease of {} was not kept alive in time, though the key lives",
                            self.key
                        ),
                        retryable: true,
                        source: None,
                    });
                }
                Err(e) => return Err(e),
            }
        }
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

impl Drop for EtcdHold {
    fn drop(&mut self) {
        if self.released.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        self.session.unregister(self.registration);
        // Leaked (the guard's `leak`): nobody renews it any more. Delete it when its
        // client-side lease would have run out, and only then give the key back.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = Arc::downgrade(&self.session);
        let rev = self.rev;
        let end = *self
            .end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let claim = self
            .claim
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(claim) = claim else { return };
        runtime.spawn(async move {
            tokio::time::sleep_until(end).await;
            delete_until_gone(session, Some(rev), claim).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter whose watch holds the delete back (as etcd's unsynced group does, typically
    /// for up to 100 ms) still sees its predecessor go, by looking at it: here the watch is of
    /// another key, which never changes, and the read the waiter started from is taken as the
    /// newest (so the check when the watch is created does not look), so only the waiter's
    /// looks can end the wait. The predecessor lives in a lease of its own, which ends it if
    /// the test stops half-way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_sees_its_predecessor_go_while_its_watch_is_silent() -> Result<(), String> {
        let Some(url) = dlock_conformance::service_url("DLOCK_ETCD_URL") else {
            return Ok(());
        };
        let etcd = |e: etcd_client::Error| e.to_string();
        let config = crate::EtcdConfig::from_url(&url).map_err(|e| e.to_string())?;
        let session = Session::connect(config).await.map_err(|e| e.to_string())?;
        let mut client = session.client();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let base = format!("dlock-test/silent-watch/{}-{nanos}", std::process::id());
        let key = format!("{base}/predecessor");
        let lease = client.lease_grant(60, None).await.map_err(etcd)?.id();
        let put = client
            .put(key.as_str(), "", Some(PutOptions::new().with_lease(lease)))
            .await
            .map_err(etcd)?;
        let created = put.header().map_or(0, |h| h.revision());
        let mut stream = client
            .watch(
                format!("{base}/silent"),
                Some(WatchOptions::new().with_filters([WatchFilterType::NoPut])),
            )
            .await
            .map_err(etcd)?;
        // Gone before the waiter starts: only a look can tell it.
        client.delete(key.as_str(), None).await.map_err(etcd)?;
        let watched = Watched {
            key: key.clone().into_bytes(),
            created,
            read_at: i64::MAX,
        };
        let waiter = {
            let (session, mut client) = (Arc::clone(&session), session.client());
            tokio::spawn(async move {
                // Looks for as long as the test runs.
                let window = Duration::from_secs(3600);
                await_delete(&session, &mut client, &mut stream, &watched, window).await
            })
        };
        let woke = tokio::time::timeout(Duration::from_secs(10), waiter).await;
        drop(client.lease_revoke(lease).await);
        let woke =
            woke.map_err(|_| "the waiter did not see its predecessor go within 10 s".to_string())?;
        woke.map_err(|e| e.to_string())?.map_err(etcd)?;
        let stats = session.stats();
        if stats.wakeups != 0 || stats.gets == 0 {
            return Err(format!(
                "the waiter should have woken by its own look, not by a watch event: {stats:?}"
            ));
        }
        Ok(())
    }
}
