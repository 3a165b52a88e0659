//! The semaphore's waiters: one whose nodes vanish starts over without deadlocking another.

use dlock_conformance::{Names, eventually, must};
use dlock_core::{LockOptions, LockProvider};

use crate::support::{LIMIT, admin, provider, recipe_children, url};

/// A one-permit semaphore waiter whose nodes vanish while it waits (an operator unsticking
/// the name, an expired session) starts over under the internal mutex: a lease re-created
/// without it could queue beside a second waiter's, and once the holder left both would wait
/// for each other for good.
#[tokio::test(flavor = "multi_thread")]
async fn semaphore_waiter_whose_nodes_vanish_does_not_deadlock() {
    let Some(url) = url() else { return };
    let Waiting {
        admin,
        b,
        name,
        locks,
        leases,
        held,
        first,
    } = Waiting::start(&url, "sem-vanish").await;
    let opts = LockOptions::default();
    // Delete the waiter's nodes: its internal-mutex node and its (newer) lease, which the
    // waiter may have withdrawn itself by then, once it saw its mutex gone.
    let mut lease_nodes = recipe_children(&admin, &leases).await;
    lease_nodes.sort_by_key(|n| n[n.len() - 10..].to_owned());
    let newest = lease_nodes.pop().unwrap();
    for node in recipe_children(&admin, &locks).await {
        admin
            .delete(&format!("{locks}/{node}"), None)
            .await
            .unwrap();
    }
    match admin.delete(&format!("{leases}/{newest}"), None).await {
        Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
        Err(e) => panic!("delete the waiter's lease: {e}"),
    }
    eventually(LIMIT, "the waiter is back with a new lease", || async {
        let s = recipe_children(&admin, &leases).await;
        if s.len() == 2 && !s.contains(&newest) {
            Ok(())
        } else {
            Err(s)
        }
    })
    .await;
    let sb = b.semaphore(&name, 1, opts).unwrap();
    let second = tokio::spawn(async move {
        let g = sb.acquire().await.unwrap();
        g.release().await.unwrap();
    });
    held.release().await.unwrap();
    must(LIMIT, "the first waiter gets the permit", first)
        .await
        .unwrap();
    must(LIMIT, "the second waiter gets the permit", second)
        .await
        .unwrap();
}

/// Deleting only a one-permit waiter's internal-mutex node (the operator's "unstick") does
/// not wedge the semaphore: the waiter sees its mutex gone, withdraws its lease and queues
/// again. Otherwise a second waiter takes the free mutex and adds its lease beside the
/// first's, and once the holder leaves the two leases wait for each other for good (and
/// every later waiter, Curator's included, behind the second's mutex node).
#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_waiters_internal_mutex_does_not_wedge_the_semaphore() {
    let Some(url) = url() else { return };
    let Waiting {
        admin,
        b,
        name,
        locks,
        leases: _,
        held,
        first,
    } = Waiting::start(&url, "sem-unstick").await;
    let opts = LockOptions::default();
    let mutex = recipe_children(&admin, &locks).await;
    admin
        .delete(&format!("{locks}/{}", mutex[0]), None)
        .await
        .unwrap();
    let sb = b.semaphore(&name, 1, opts).unwrap();
    let second = tokio::spawn(async move {
        let g = sb.acquire().await.unwrap();
        g.release().await.unwrap();
    });
    eventually(
        LIMIT,
        "the second waiter takes the internal mutex",
        || async {
            let l = recipe_children(&admin, &locks).await;
            if l.iter().any(|n| !mutex.contains(n)) {
                Ok(())
            } else {
                Err(l)
            }
        },
    )
    .await;
    held.release().await.unwrap();
    must(LIMIT, "the second waiter gets the permit", second)
        .await
        .unwrap();
    must(LIMIT, "the first waiter gets the permit after it", first)
        .await
        .unwrap();
}

/// A one-permit semaphore held by one provider, and a waiter of another that holds the
/// internal mutex and waits with its lease beside the holder's; a third provider for the
/// test's own second waiter.
struct Waiting {
    admin: zookeeper_client::Client,
    b: dlock_zookeeper::ZkProvider,
    name: String,
    locks: String,
    leases: String,
    held: dlock_core::LockGuard,
    /// The waiter: it takes the permit and releases it.
    first: tokio::task::JoinHandle<()>,
}

impl Waiting {
    async fn start(url: &str, label: &str) -> Self {
        let (h, a, b) = (
            provider(url).await,
            provider(url).await,
            provider(url).await,
        );
        let admin = admin(url).await;
        let name = Names::new().name(label);
        let path = h.lock_path(&name).unwrap();
        let (locks, leases) = (format!("{path}/locks"), format!("{path}/leases"));
        let opts = LockOptions::default();
        let held = h
            .semaphore(&name, 1, opts)
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let sa = a.semaphore(&name, 1, opts).unwrap();
        let first = tokio::spawn(async move {
            let g = sa.acquire().await.unwrap();
            g.release().await.unwrap();
        });
        eventually(
            LIMIT,
            "the waiter holds the internal mutex and waits with its lease",
            || async {
                let (l, s) = (
                    recipe_children(&admin, &locks).await,
                    recipe_children(&admin, &leases).await,
                );
                if l.len() == 1 && s.len() == 2 {
                    Ok(())
                } else {
                    Err((l, s))
                }
            },
        )
        .await;
        Self {
            admin,
            b,
            name,
            locks,
            leases,
            held,
            first,
        }
    }
}
