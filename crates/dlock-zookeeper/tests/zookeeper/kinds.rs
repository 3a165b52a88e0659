//! Kinds on one name: mutexes, readers, writers and semaphores of one name are never held
//! together.

use std::time::Duration;

use dlock_conformance::{Names, must};
use dlock_core::{Error, LockGuard, LockOptions, LockProvider};
use dlock_zookeeper::ZkProvider;

use crate::support::{LIMIT, admin, await_nodes, provider, url};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mutex,
    NonReentrant,
    Read,
    Write,
    Permit,
}

/// Tries for `kind` on `name` through `p`, waiting at most `wait`.
async fn try_kind(
    p: &ZkProvider,
    name: &str,
    kind: Kind,
    wait: Duration,
) -> dlock_core::Result<Option<LockGuard>> {
    let opts = LockOptions::default();
    match kind {
        Kind::Mutex => p.lock(name, opts)?.try_acquire(wait).await,
        Kind::NonReentrant => {
            p.lock(name, opts.with_reentrant(false))?
                .try_acquire(wait)
                .await
        }
        Kind::Read => p.read_write_lock(name, opts)?.try_read(wait).await,
        Kind::Write => p.read_write_lock(name, opts)?.try_write(wait).await,
        Kind::Permit => p.semaphore(name, 2, opts)?.try_acquire(wait).await,
    }
}

/// Every pair of kinds on one name, both orders: while the first is held, the second is never
/// granted. Locks (mutexes reentrant or not, readers, writers) queue together, a mutex node
/// counting as a writer: the second waits, queued, and gets in once the first is released. A
/// lock and a semaphore are refused with a non-retryable `InvalidArgument` naming the kind in
/// use, and the refused kind gets in once the name is free.
#[tokio::test(flavor = "multi_thread")]
async fn kinds_on_one_name_never_hold_together() {
    use Kind::{Mutex as M, NonReentrant as N, Permit as P, Read as R, Write as W};
    let Some(url) = url() else { return };
    let (a, b, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let names = Names::new();
    let pairs = [
        (M, W),
        (W, M),
        (M, R),
        (R, M),
        (M, N),
        (N, M),
        (M, P),
        (P, M),
        (W, P),
        (P, W),
    ];
    for (first, second) in pairs {
        let name = names.name(&format!("{first:?}-{second:?}").to_lowercase());
        let path = a.lock_path(&name).unwrap();
        let held = try_kind(&a, &name, first, LIMIT)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{first:?} on a fresh name"));
        let with_semaphore = first == P || second == P;
        let asked = try_kind(&b, &name, second, Duration::from_millis(300)).await;
        match asked {
            Ok(None) if !with_semaphore => {}
            Err(Error::InvalidArgument { reason, .. }) if with_semaphore => {
                let in_use = if first == P { "a semaphore" } else { "a lock" };
                assert!(
                    reason.contains(&format!("is in use as {in_use}")),
                    "{first:?} then {second:?}: {reason}"
                );
            }
            Ok(Some(g)) => panic!("{second:?} granted beside {first:?}: {g:?}"),
            other => panic!("{second:?} beside {first:?}: {other:?}"),
        }
        if with_semaphore {
            assert!(held.is_held(), "{first:?} disturbed");
            held.release().await.unwrap();
            let g = try_kind(&b, &name, second, LIMIT).await.unwrap();
            g.unwrap_or_else(|| panic!("{second:?} after {first:?} was released"))
                .release()
                .await
                .unwrap();
            continue;
        }
        // Queued behind the first, granted once it is released.
        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move { try_kind(&b, &name, second, LIMIT * 2).await })
        };
        await_nodes(&admin, &path, 2, "the second kind queued").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "{second:?} got in beside {first:?}");
        assert!(held.is_held(), "{first:?} disturbed");
        held.release().await.unwrap();
        let g = must(LIMIT * 2, "the second kind after the release", waiter)
            .await
            .unwrap()
            .unwrap();
        g.unwrap_or_else(|| panic!("{second:?} after {first:?} was released"))
            .release()
            .await
            .unwrap();
    }
}
