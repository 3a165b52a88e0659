//! Names and their paths: a name like a recipe's internals is a lock of its own, and deeply
//! nested names get their parents.

use std::time::Duration;

use dlock_conformance::{Names, must};
use dlock_core::{LockOptions, LockProvider};

use crate::support::{LIMIT, provider, url};

/// A mutex named like a semaphore's internal directory (`x/locks`) is not that
/// directory: holding it does not block the semaphore `x`.
#[tokio::test(flavor = "multi_thread")]
async fn a_name_like_recipe_internals_is_its_own_lock() {
    let Some(url) = url() else { return };
    let (a, b) = (provider(&url).await, provider(&url).await);
    let x = Names::new().name("x");
    let inner = a
        .lock(&format!("{x}/locks"), LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let permit = must(
        LIMIT,
        "a permit of x while x/locks is held",
        b.semaphore(&x, 1, LockOptions::default())
            .unwrap()
            .try_acquire(Duration::from_secs(2)),
    )
    .await
    .unwrap()
    .expect("x/locks blocked the semaphore x");
    permit.release().await.unwrap();
    inner.release().await.unwrap();
}

/// A deeply nested name (100 segments, within the 255-byte limit) gets its parents created.
#[tokio::test(flavor = "multi_thread")]
async fn deeply_nested_names_work() {
    let Some(url) = url() else { return };
    let p = provider(&url).await;
    let deep = format!("{}/{}", Names::new().name("deep"), ["d"; 100].join("/"));
    assert!(deep.len() <= 255, "{}", deep.len());
    let g = must(
        LIMIT,
        "a lock 100 levels deep",
        p.lock(&deep, LockOptions::default()).unwrap().acquire(),
    )
    .await
    .unwrap();
    g.release().await.unwrap();
}
