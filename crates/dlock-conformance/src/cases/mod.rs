//! The cases, one `pub async fn` per behaviour of the contract (the `# Contract` of
//! [`LockProvider`](dlock_core::LockProvider)), grouped by promise. Each panics with a message
//! that names what broke. [`CASES`](crate::CASES) maps each to its promise.

mod cancellation;
mod election;
mod exclusion;
mod fairness;
mod fencing;
mod inspection;
mod kinds;
mod leases;
mod multi;
mod names;
mod reentrancy;
mod rw;
mod semaphore;
mod silence;
mod time;
mod waiting;

pub use self::cancellation::*;
pub use self::election::*;
pub use self::exclusion::*;
pub use self::fairness::*;
pub use self::fencing::*;
pub use self::inspection::*;
pub use self::kinds::*;
pub use self::leases::*;
pub use self::multi::*;
pub use self::names::*;
pub use self::reentrancy::*;
pub use self::rw::*;
pub use self::semaphore::*;
pub use self::silence::*;
pub use self::time::*;
pub use self::waiting::*;

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use dlock_core::{
    Capabilities, DynLock, DynLockProvider, DynReadWriteLock, DynSemaphore, Error, Lease,
    LockGuard, LockOptions,
};
use tokio::task::JoinHandle;

use crate::record::{Outcome, note};
use crate::support::{ExplainsALoss, Names, StallProbe, StoreProbe, eventually, must};
use crate::{Factory, Partition};

const ZERO: Duration = Duration::ZERO;

async fn client(f: &impl Factory) -> DynLockProvider {
    match f.connect().await {
        Ok(p) => p,
        Err(e) => panic!("{}: connect failed: {e}", f.label()),
    }
}

/// `N` clients of the backend under test, connected one after another.
async fn clients<const N: usize>(f: &impl Factory) -> [DynLockProvider; N] {
    let mut all = Vec::with_capacity(N);
    for _ in 0..N {
        all.push(client(f).await);
    }
    match all.try_into() {
        Ok(all) => all,
        Err(_) => unreachable!("{N} clients were connected"),
    }
}

/// What a case needs of the backend: whether a backend's capabilities offer it, and what the
/// case is noted [`unsupported`] for where they do not.
#[derive(Clone, Copy)]
struct Need(fn(&Capabilities) -> bool, &'static str);

impl Need {
    /// Whether `caps` offer what the case needs; if not, the case is noted [`unsupported`], and
    /// the caller returns.
    fn met(self, f: &impl Factory, caps: &Capabilities) -> bool {
        let Self(offered, missing) = self;
        let met = offered(caps);
        if !met {
            unsupported(f, missing);
        }
        met
    }
}

// Needs that several cases share: each is noted unsupported in the same words everywhere.
const FAIR_LOCKS: Need = Need(|c| c.fair, "no fair locks");
const FENCING_TOKENS: Need = Need(|c| c.fencing, "no fencing tokens");
const FIXED_LEASES: Need = Need(|c| c.fixed_lease, "no fixed leases");
const READ_WRITE_LOCKS: Need = Need(|c| c.read_write, "no read-write locks");
const REENTRANT_LOCKS: Need = Need(|c| c.reentrant, "no reentrant locks");
const SEMAPHORES: Need = Need(|c| c.semaphore, "no semaphores");
const WATCHDOG_LEASES: Need = Need(|c| c.watchdog, "no watchdog leases");
const WATCHDOG_LEASES_WITH_LOSS_DETECTION: Need = Need(
    |c| c.watchdog && c.loss_detection,
    "no watchdog leases with loss detection",
);

/// `N` clients, if the backend offers what the case needs (asked of the first client's
/// capabilities); otherwise `None`, and the case is noted [`unsupported`].
async fn clients_if<const N: usize>(f: &impl Factory, need: Need) -> Option<[DynLockProvider; N]> {
    let all: [DynLockProvider; N] = clients(f).await;
    let met = all.first().is_some_and(|p| need.met(f, &caps(p)));
    met.then_some(all)
}

/// `N` clients and a fresh lock name ending in `suffix`, if the backend offers what the case
/// needs; otherwise `None`, as [`clients_if`].
async fn named_clients_if<const N: usize>(
    f: &impl Factory,
    need: Need,
    suffix: &str,
) -> Option<([DynLockProvider; N], String)> {
    let clients = clients_if(f, need).await?;
    Some((clients, Names::new().name(suffix)))
}

/// A client the case can cut off the store, with its cut ([`Factory::connect_partitionable`]),
/// and another client; `None` where the factory cannot cut a client off (the case is then noted
/// skipped, and the caller returns).
async fn cuttable_clients(
    f: &impl Factory,
) -> Option<(DynLockProvider, Box<dyn Partition>, DynLockProvider)> {
    let Some(partitionable) = f.connect_partitionable().await else {
        skip(f, "the factory cannot cut one client off the store");
        return None;
    };
    let (p, cut) = partitionable.unwrap_or_else(|e| panic!("connect: {e}"));
    Some((p, cut, client(f).await))
}

/// As [`cuttable_clients`], where the backend offers what the case needs; if it does not, the
/// case is noted [`unsupported`], and the caller returns.
async fn cuttable_clients_if(
    f: &impl Factory,
    need: Need,
) -> Option<(DynLockProvider, Box<dyn Partition>, DynLockProvider)> {
    let clients = cuttable_clients(f).await?;
    need.met(f, &caps(&clients.0)).then_some(clients)
}

fn caps(p: &DynLockProvider) -> Capabilities {
    p.capabilities()
}

/// The case cannot run here: the factory lacks a hook it needs.
fn skip(f: &impl Factory, why: &str) {
    eprintln!("skipped for {}: {why}", f.label());
    note(Outcome::Skipped(why.to_string()));
}

/// Has the store drop the hold on `name` behind its holder's back
/// ([`Factory::force_expire`]). False where the factory cannot: the case is then noted
/// skipped, and the caller returns.
async fn dropped_behind_the_back(f: &impl Factory, name: &str) -> bool {
    match f.force_expire(name).await {
        None => {
            skip(f, "the factory cannot drop a hold behind its holder's back");
            false
        }
        Some(r) => {
            r.unwrap_or_else(|e| panic!("force_expire: {e}"));
            true
        }
    }
}

/// The backend does not offer what the case tests.
fn unsupported(f: &impl Factory, why: &str) {
    eprintln!("unsupported by {}: {why}", f.label());
    note(Outcome::Unsupported(why.to_string()));
}

/// The case checks a refusal this backend has no reason to make.
fn not_applicable(f: &impl Factory, why: &str) {
    eprintln!("not applicable to {}: {why}", f.label());
    note(Outcome::NotApplicable(why.to_string()));
}

fn lock(p: &DynLockProvider, name: &str) -> DynLock {
    lock_with(p, name, LockOptions::default())
}

fn lock_with(p: &DynLockProvider, name: &str, options: LockOptions) -> DynLock {
    match p.lock(name, options) {
        Ok(l) => l,
        Err(e) => panic!("lock({name:?}, {options:?}) failed: {e}"),
    }
}

fn rw(p: &DynLockProvider, name: &str) -> DynReadWriteLock {
    p.read_write_lock(name, LockOptions::default())
        .unwrap_or_else(|e| panic!("read_write_lock: {e}"))
}

fn sem(p: &DynLockProvider, name: &str, permits: u32, opts: LockOptions) -> DynSemaphore {
    p.semaphore(name, permits, opts)
        .unwrap_or_else(|e| panic!("semaphore: {e}"))
}

/// The errors with which `p` refuses a handle of each kind it offers on `name` with `options`:
/// a mutex, and a read-write lock and a two-permit semaphore where the backend has them. A
/// handle handed out instead fails the case with `why` (what is wrong with the request).
fn refusals(p: &DynLockProvider, name: &str, options: LockOptions, why: &str) -> Vec<Error> {
    let c = caps(p);
    let mut errors = vec![p.lock(name, options).expect_err(why)];
    if c.read_write {
        let e = p.read_write_lock(name, options);
        errors.push(e.expect_err(&format!("rw: {why}")));
    }
    if c.semaphore {
        let e = p.semaphore(name, 2, options);
        errors.push(e.expect_err(&format!("semaphore: {why}")));
    }
    errors
}

/// Takes a lock that must be free (or become free within twice the slack).
async fn take(f: &impl Factory, l: &DynLock) -> LockGuard {
    let limit = f.slack() * 2;
    match crate::must(limit, "acquire of a free lock", l.try_acquire(limit)).await {
        Ok(Some(g)) => g,
        Ok(None) => panic!("{:?} was not free", l.name()),
        Err(e) => panic!("acquire {:?} failed: {e}", l.name()),
    }
}

/// `name` contended: held through `a` (the guard), and a handle of it through `b`, for the
/// case's waits and tries while it is held.
async fn contended(
    f: &impl Factory,
    [a, b]: [&DynLockProvider; 2],
    name: &str,
) -> (LockGuard, DynLock) {
    let g = take(f, &lock(a, name)).await;
    (g, lock(b, name))
}

/// The guard of a try that must have been granted; fails the case with `what` if the try
/// failed or was not granted.
fn granted<G>(got: Result<Option<G>, Error>, what: &str) -> G {
    match got {
        Ok(Some(g)) => g,
        Ok(None) => panic!("{what}: not granted"),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The guard of a try that must be granted within `limit`; fails the case with `what` if the
/// try fails, is not granted, or takes longer.
async fn granted_within<G>(
    limit: Duration,
    what: &str,
    got: impl Future<Output = Result<Option<G>, Error>>,
) -> G {
    granted(must(limit, what, got).await, what)
}

/// Takes a read hold that must be free within the factory's slack.
async fn take_read(f: &impl Factory, l: &DynReadWriteLock, what: &str) -> LockGuard {
    granted(l.try_read(f.slack()).await, what)
}

/// Takes a write hold that must be free within the factory's slack.
async fn take_write(f: &impl Factory, l: &DynReadWriteLock, what: &str) -> LockGuard {
    granted(l.try_write(f.slack()).await, what)
}

/// Takes a permit that must be free within the factory's slack.
async fn take_permit(f: &impl Factory, s: &DynSemaphore, what: &str) -> LockGuard {
    granted(s.try_acquire(f.slack()).await, what)
}

/// Asserts that a try (of any kind) got nothing, as it must while `why`; an error fails the
/// case too.
fn assert_not_granted(got: Result<Option<LockGuard>, Error>, why: &str) {
    match got {
        Ok(None) => {}
        Ok(Some(g)) => panic!("{why}: granted {:?}", g.name()),
        Err(e) => panic!("{why}: {e}"),
    }
}

/// The output of a spawned task; a panic in the task fails the case with the task's own
/// message.
async fn joined<T>(task: JoinHandle<T>) -> T {
    task.await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// What an acquisition (of any kind) got, within `limit`; fails the case with `what` if it
/// failed or took longer.
async fn acquired<G>(
    limit: Duration,
    what: &str,
    acquire: impl Future<Output = Result<G, Error>>,
) -> G {
    must(limit, what, acquire)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Spawns `wait` (a waiter for a held lock) and returns its task once it has waited
/// `for_at_least`; fails the case with `why` if it ended before.
async fn waiting<T>(
    for_at_least: Duration,
    why: &str,
    wait: impl Future<Output = T> + Send + 'static,
) -> JoinHandle<T>
where
    T: Debug + Send + 'static,
{
    let mut task = tokio::spawn(wait);
    let early = tokio::time::timeout(for_at_least, &mut task).await;
    assert!(early.is_err(), "{why}: {early:?}");
    task
}

/// The probes of what can take a live holder's watchdog hold away however correct the backend
/// (see [`ExplainsALoss`]): the holder's runtime, and the store as another client sees it. A
/// case that asserts a live holder keeps its hold asks them before it fails.
struct WatchdogProbes {
    runtime: StallProbe,
    store: StoreProbe,
    /// The case, named where a loss the probes explain is noted.
    what: &'static str,
    /// The hold's lease.
    lease: Duration,
}

impl WatchdogProbes {
    /// Probes for the case `what` on a hold with `lease`: `runtime`, started where the holder
    /// must be live from, and a store probe started now on `other` (a handle of the lock
    /// through another client than the holder's).
    fn new(what: &'static str, lease: Duration, runtime: StallProbe, other: DynLock) -> Self {
        let store = StoreProbe::start(other);
        Self {
            runtime,
            store,
            what,
            lease,
        }
    }

    /// Waits `span` for `g` to be lost: true if it kept its hold. A loss that a probe explains
    /// is noted as such and false (the run proves nothing, and the caller returns); any other
    /// fails the case with `why`, and the worst each probe saw within `window`.
    async fn kept(&self, g: &LockGuard, span: Duration, window: Duration, why: &str) -> bool {
        let (what, lease) = (self.what, self.lease);
        let lost = tokio::time::timeout(span, g.lost()).await;
        if lost.is_ok()
            && (self.runtime.explains_a_loss(what, lease, g.loss_reason())
                || self.store.explains_a_loss(what, lease, g.loss_reason()))
        {
            return false;
        }
        assert!(
            lost.is_err(),
            "{why}: {:?} (the runtime stalled {:?} at most; the store answered another client \
             within {:?})",
            g.loss_reason(),
            self.runtime.worst_within(window),
            self.store.slowest_within(window)
        );
        true
    }
}

/// Asserts that a call on a hold that is gone failed with `LockLost`: `what` (the call, and
/// why it must fail) names it in the failure.
fn assert_lock_lost<T: Debug>(r: Result<T, Error>, what: &str) {
    match r {
        Err(Error::LockLost { .. }) => {}
        Err(e) => panic!("{what}: expected LockLost, got {e:?}"),
        Ok(v) => panic!("{what}: expected LockLost, got Ok({v:?})"),
    }
}

/// Asserts that a request for something the backend does not offer failed with
/// `Unsupported`: `what` (the request) names it in the failure.
fn assert_unsupported<T: Debug>(r: Result<T, Error>, what: &str) {
    match r {
        Err(Error::Unsupported { .. }) => {}
        Err(e) => panic!("{what}: expected Unsupported, got {e:?}"),
        Ok(v) => panic!("{what}: expected Unsupported, got Ok({v:?})"),
    }
}

/// How long a case waits for a short lease to run out: the lease and the factory's slack.
fn lease_wait(f: &impl Factory) -> Duration {
    f.short_lease() + f.slack()
}

/// How long a case waits for a lock whose holder died (or lost it) to come to another client:
/// the factory's holder timeout, and twice its slack.
fn expiry_wait(f: &impl Factory) -> Duration {
    f.holder_timeout() + f.slack() * 2
}

/// Whether `name` is free for a new handle of `p`. A zero-wait try that gets nothing is checked
/// with the store: such a try also gives up on a slow store (a connection that takes long to
/// open on a loaded machine), which is `Ok(None)` by the contract ("not had by then"), not a
/// held lock. If the store says the lock is held, it is not free (a release that frees late
/// fails here); if it says free, the try is made again with the factory's slack.
async fn is_free(f: &impl Factory, p: &DynLockProvider, name: &str) -> bool {
    let l = lock(p, name);
    if free_within(&l, ZERO).await {
        return true;
    }
    match p.describe(name).await {
        Ok(status) if status.is_held() => false,
        Ok(_) | Err(Error::Unsupported { .. }) => free_within(&l, f.slack()).await,
        Err(e) => panic!("describe {name:?} failed: {e}"),
    }
}

async fn free_within(l: &DynLock, wait: Duration) -> bool {
    match l.try_acquire(wait).await {
        Ok(Some(g)) => {
            g.release()
                .await
                .unwrap_or_else(|e| panic!("release failed: {e}"));
            true
        }
        Ok(None) => false,
        Err(e) => panic!("try_acquire {:?} failed: {e}", l.name()),
    }
}

async fn assert_busy(l: &DynLock, why: &str) {
    match l.try_acquire(ZERO).await {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{:?} was acquired although {why}", l.name()),
        Err(e) => panic!("try_acquire {:?} failed: {e}", l.name()),
    }
}

async fn release(g: LockGuard) {
    let name = g.name().clone();
    g.release()
        .await
        .unwrap_or_else(|e| panic!("release of {name:?} failed: {e}"));
}

/// Waits until the lock is free for another handle (background releases, expiry).
async fn until_free(f: &impl Factory, l: &DynLock, limit: Duration, what: &str) {
    eventually(limit + f.slack(), what, || async {
        if free_within(l, ZERO).await {
            Ok(())
        } else {
            Err("still held")
        }
    })
    .await;
}

/// Waits until the store keeps exactly `expected` things for `name`. A factory that cannot
/// count fails the case: "leaves nothing behind" is never taken on trust.
async fn residue_is(f: &impl Factory, name: &str, expected: usize, what: &str) {
    if f.residue(name).await.is_none() {
        panic!(
            "{}: the factory cannot count what the store keeps for a name, so \"{what}\" cannot \
             be checked; implement Factory::residue",
            f.label()
        );
    }
    eventually(f.slack(), what, || async {
        match f.residue(name).await {
            Some(Ok(n)) if n == expected => Ok(()),
            Some(Ok(n)) => Err(format!("{n} entries, expected {expected}")),
            Some(Err(e)) => Err(format!("residue failed: {e}")),
            None => Err("residue stopped counting".to_string()),
        }
    })
    .await;
}

/// Waits until the store keeps at least `at_least` things for `name` (a waiter is queued).
async fn residue_reaches(f: &impl Factory, name: &str, at_least: usize, what: &str) {
    eventually(f.slack(), what, || async {
        match f.residue(name).await {
            Some(Ok(n)) if n >= at_least => Ok(()),
            Some(Ok(n)) => Err(format!("{n} entries, expected at least {at_least}")),
            Some(Err(e)) => Err(format!("residue failed: {e}")),
            None => Err("the factory cannot count residue".to_string()),
        }
    })
    .await;
}

fn fixed(f: &impl Factory) -> LockOptions {
    LockOptions::new().with_lease(Lease::Fixed(f.short_lease()))
}

fn short_watchdog(f: &impl Factory) -> LockOptions {
    LockOptions::new().with_lease(Lease::watchdog(f.short_lease()))
}

/// Asserts that an acquisition cut off after `cut` did not get its hold, as it must while
/// `why`.
async fn assert_cut_off<G>(
    cut: Duration,
    acquire: impl Future<Output = Result<G, Error>>,
    why: &str,
) {
    let r = tokio::time::timeout(cut, acquire).await;
    assert!(!matches!(r, Ok(Ok(_))), "{why}");
}

/// Runs `work` on a thread of its own, with a runtime of its own that runs only inside
/// `block_on` (one thread): for a case that stalls or shuts down the runtime a hold was taken
/// on. A panic in `work` fails the case with its own message.
fn on_a_runtime_of_its_own<T: Send>(work: impl FnOnce(tokio::runtime::Runtime) -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("a runtime of its own: {e}"));
            work(rt)
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Cut points for cancellation: 0 µs to about 80 ms, denser at the start.
fn cuts() -> impl Iterator<Item = Duration> {
    (0..24u64).map(|step| Duration::from_micros(step * step * 150))
}
