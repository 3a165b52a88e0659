//! Downgrades of the read-write lock: a read taken by the writer never sits beside another
//! writer, and its fencing token is below the next writer's.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must};
use dlock_core::{LockOptions, LockProvider};

use crate::support::{LIMIT, admin, provider, recipe_children, url};

/// A downgrade whose write node is already gone (here deleted behind the holder's back, as a
/// release by another task of the same handle or an expiry would) must not grant the read
/// beside a writer that got in meanwhile; it waits as a plain reader.
#[tokio::test(flavor = "multi_thread")]
async fn downgrade_after_the_write_vanished_waits_for_the_new_writer() {
    let Some(url) = url() else { return };
    let (a, b, admin) = (
        provider(&url).await,
        provider(&url).await,
        admin(&url).await,
    );
    let name = Names::new().name("downgrade-race");
    let path = a.lock_path(&name).unwrap();
    let mine = a.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = mine.write().await.unwrap();
    for node in recipe_children(&admin, &path).await {
        admin.delete(&format!("{path}/{node}"), None).await.unwrap();
    }
    let other = b.read_write_lock(&name, LockOptions::default()).unwrap();
    let w2 = must(LIMIT, "the other writer", other.try_write(LIMIT))
        .await
        .unwrap()
        .expect("the write node is gone: the other writer gets in");
    // `w` has not noticed yet (its session is fine), so this read asks for a downgrade.
    let r = must(LIMIT, "the read", mine.try_read(Duration::from_millis(500))).await;
    assert!(
        matches!(r, Ok(None)),
        "a read granted beside another writer: {r:?}"
    );
    w2.release().await.unwrap();
    drop(w);
}

/// A read downgraded from a write carries the write's fencing token, so a writer queued
/// behind that write (whose node, and token, came later) gets a higher token than the read.
#[tokio::test(flavor = "multi_thread")]
async fn downgraded_read_token_is_below_the_next_writers() {
    let Some(url) = url() else { return };
    let (a, b) = (provider(&url).await, provider(&url).await);
    let name = Names::new().name("downgrade-fence");
    let mine = a.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = mine.write().await.unwrap();
    let other = b.read_write_lock(&name, LockOptions::default()).unwrap();
    let queued = tokio::spawn(async move {
        let g = other.write().await.unwrap();
        let token = g.fencing_token().get();
        g.release().await.unwrap();
        token
    });
    // The other writer's node exists (it waits) before the downgrade.
    let admin = admin(&url).await;
    let path = a.lock_path(&name).unwrap();
    eventually(LIMIT, "the other writer queued", || async {
        let n = recipe_children(&admin, &path).await;
        if n.len() == 2 { Ok(()) } else { Err(n) }
    })
    .await;
    let r = mine.read().await.unwrap();
    w.release().await.unwrap();
    let read_token = r.fencing_token().get();
    r.release().await.unwrap();
    let next = must(LIMIT, "the queued writer", queued).await.unwrap();
    assert!(
        next > read_token,
        "the next writer's token {next} is not above the downgraded read's {read_token}"
    );
}
