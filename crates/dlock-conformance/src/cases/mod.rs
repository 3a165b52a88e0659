//! The cases, one `pub async fn` per behaviour of the contract (the `# Contract` of
//! [`LockProvider`](dlock_core::LockProvider)), grouped by promise. Each panics with a message
//! that names what broke. [`CASES`](crate::CASES) maps each to its promise.

mod cancellation;
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

use std::time::Duration;

use dlock_core::{
    Capabilities, DynLock, DynLockProvider, DynReadWriteLock, DynSemaphore, Error, Lease,
    LockGuard, LockOptions,
};

use crate::Factory;
use crate::record::{Outcome, note};
use crate::support::eventually;

const ZERO: Duration = Duration::ZERO;

async fn client(f: &impl Factory) -> DynLockProvider {
    match f.connect().await {
        Ok(p) => p,
        Err(e) => panic!("{}: connect failed: {e}", f.label()),
    }
}

fn caps(p: &DynLockProvider) -> Capabilities {
    p.capabilities()
}

/// The case cannot run here: the factory lacks a hook it needs.
fn skip(f: &impl Factory, why: &str) {
    eprintln!("skipped for {}: {why}", f.label());
    note(Outcome::Skipped(why.to_string()));
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

/// Takes a lock that must be free (or become free within twice the slack).
async fn take(f: &impl Factory, l: &DynLock) -> LockGuard {
    let limit = f.slack() * 2;
    match crate::must(limit, "acquire of a free lock", l.try_acquire(limit)).await {
        Ok(Some(g)) => g,
        Ok(None) => panic!("{:?} was not free", l.name()),
        Err(e) => panic!("acquire {:?} failed: {e}", l.name()),
    }
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

/// Cut points for cancellation: 0 µs to about 80 ms, denser at the start.
fn cuts() -> impl Iterator<Item = Duration> {
    (0..24u64).map(|step| Duration::from_micros(step * step * 150))
}
