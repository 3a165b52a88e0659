//! One name, several kinds: a mutex, a read-write lock and a semaphore on one name exclude
//! each other. A mutex hold is exclusive like a write hold; reads share only with reads,
//! permits only with permits of the same semaphore. Where a store cannot wait across kinds it
//! refuses the later request with a non-retryable `InvalidArgument`; it never grants both.

use std::time::Duration;

use dlock_core::{DynLockProvider, Error, LockGuard, LockOptions};

use super::{READ_WRITE_LOCKS, SEMAPHORES, caps, clients, clients_if, lock, release, rw, sem};
use crate::Factory;
use crate::support::{Names, must};

/// One hold of one kind on a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Write,
    Permit,
}

/// The semaphore's permits in these cases: more than one, so a permit is not a mutex.
const PERMITS: u32 = 2;

/// Tries for `kind` on `name` through `p`, waiting at most `wait`: the guard, `None` if it
/// waits, or the store's refusal.
async fn try_kind(
    p: &DynLockProvider,
    name: &str,
    kind: Kind,
    wait: Duration,
) -> dlock_core::Result<Option<LockGuard>> {
    match kind {
        Kind::Mutex => lock(p, name).try_acquire(wait).await,
        Kind::Read => rw(p, name).try_read(wait).await,
        Kind::Write => rw(p, name).try_write(wait).await,
        Kind::Permit => {
            sem(p, name, PERMITS, LockOptions::default())
                .try_acquire(wait)
                .await
        }
    }
}

/// Holds `first`, then asks for `second` from another client: it must wait or be refused
/// (non-retryable `InvalidArgument`), never be granted beside it. A request that waited is
/// granted once the first hold is released.
async fn exclude(f: &impl Factory, first: Kind, second: Kind) {
    let [a, b] = clients(f).await;
    let name = Names::new().name(&format!("{first:?}-{second:?}").to_lowercase());
    let held = match must(
        f.slack() * 2,
        "the first hold",
        try_kind(&a, &name, first, f.slack()),
    )
    .await
    {
        Ok(Some(g)) => g,
        Ok(None) => panic!("{first:?} on a fresh name was not granted"),
        Err(e) => panic!("{first:?} on a fresh name: {e}"),
    };
    let wait = Duration::from_millis(200);
    let asked = must(
        f.slack() * 2,
        "the second kind's answer",
        try_kind(&b, &name, second, wait),
    )
    .await;
    let refused = match asked {
        Ok(None) => false,
        Err(Error::InvalidArgument { .. }) => true,
        Err(e) => panic!("{second:?} beside a {first:?} hold: an unexpected error: {e}"),
        Ok(Some(g)) => {
            panic!("a {second:?} hold was granted beside a {first:?} hold on one name ({g:?})")
        }
    };
    assert!(held.is_held(), "the {first:?} hold was disturbed");
    release(held).await;
    if refused {
        return;
    }
    match must(
        f.slack() * 3,
        "the second kind after the first was released",
        try_kind(&b, &name, second, f.slack() * 2),
    )
    .await
    {
        Ok(Some(g)) => release(g).await,
        Ok(None) => panic!("{second:?} was not granted after the {first:?} hold was released"),
        Err(e) => panic!("{second:?} after the {first:?} hold was released: {e}"),
    }
}

/// A mutex and a read-write lock on one name exclude each other, both ways: a writer or a
/// reader is never granted beside a mutex holder, nor a mutex beside them.
pub async fn a_mutex_and_a_read_write_lock_on_one_name_exclude_each_other(f: &impl Factory) {
    let Some([_a]) = clients_if(f, READ_WRITE_LOCKS).await else {
        return;
    };
    for (first, second) in [
        (Kind::Mutex, Kind::Write),
        (Kind::Write, Kind::Mutex),
        (Kind::Mutex, Kind::Read),
        (Kind::Read, Kind::Mutex),
    ] {
        exclude(f, first, second).await;
    }
}

/// A lock (mutex or write) and a semaphore on one name exclude each other, both ways.
pub async fn a_lock_and_a_semaphore_on_one_name_exclude_each_other(f: &impl Factory) {
    let Some([a]) = clients_if(f, SEMAPHORES).await else {
        return;
    };
    exclude(f, Kind::Mutex, Kind::Permit).await;
    exclude(f, Kind::Permit, Kind::Mutex).await;
    if caps(&a).read_write {
        exclude(f, Kind::Write, Kind::Permit).await;
        exclude(f, Kind::Permit, Kind::Write).await;
    }
}
