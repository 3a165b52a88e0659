//! Read-write locks.

use dlock_core::Error;

use super::{ZERO, caps, client, release, rw, unsupported};
use crate::Factory;
use crate::support::{Names, must};

/// Readers of different clients share.
pub async fn rw_readers_share(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).read_write {
        return unsupported(f, "no read-write locks");
    }
    let name = Names::new().name("rw-share");
    let r1 = rw(&a, &name)
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("reader 1");
    let r2 = rw(&b, &name)
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("reader 2");
    release(r1).await;
    release(r2).await;
}

/// A writer excludes readers and writers.
pub async fn rw_writer_excludes_everyone(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).read_write {
        return unsupported(f, "no read-write locks");
    }
    let name = Names::new().name("rw-write");
    let w = rw(&a, &name)
        .try_write(f.slack())
        .await
        .unwrap()
        .expect("writer");
    let other = rw(&b, &name);
    assert!(
        other.try_read(ZERO).await.unwrap().is_none(),
        "read during a write"
    );
    assert!(
        other.try_write(ZERO).await.unwrap().is_none(),
        "write during a write"
    );
    release(w).await;
    let r = other
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("read after the write");
    release(r).await;
}

/// A reader blocks writers; the writer gets in after the reader leaves.
pub async fn rw_reader_blocks_writer(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).read_write {
        return unsupported(f, "no read-write locks");
    }
    let name = Names::new().name("rw-read");
    let r = rw(&a, &name)
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("reader");
    let writer = rw(&b, &name);
    assert!(
        writer.try_write(ZERO).await.unwrap().is_none(),
        "write during a read"
    );
    release(r).await;
    let w = writer
        .try_write(f.slack())
        .await
        .unwrap()
        .expect("write after the read");
    release(w).await;
}

/// The writer may take the read lock (downgrade) and keep reading after releasing the write.
pub async fn rw_downgrade(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).read_write || !caps(&a).reentrant {
        return unsupported(f, "no reentrant read-write locks");
    }
    let name = Names::new().name("rw-down");
    let l = rw(&a, &name);
    let w = l.try_write(f.slack()).await.unwrap().expect("writer");
    let r = must(f.slack(), "downgrade", l.try_read(ZERO))
        .await
        .unwrap();
    let r = r.expect("the writer may read");
    release(w).await;
    let other = rw(&b, &name);
    assert!(
        other.try_write(ZERO).await.unwrap().is_none(),
        "the downgraded read holds"
    );
    let r2 = other
        .try_read(f.slack())
        .await
        .unwrap()
        .expect("readers share after downgrade");
    release(r2).await;
    release(r).await;
}

/// A reader asking for the write lock gets `WouldDeadlock` at once.
pub async fn rw_upgrade_would_deadlock(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).read_write {
        return unsupported(f, "no read-write locks");
    }
    let l = rw(&a, &Names::new().name("rw-up"));
    let r = l.try_read(f.slack()).await.unwrap().expect("reader");
    let e = must(f.slack(), "upgrade answers at once", l.write()).await;
    assert!(matches!(e, Err(Error::WouldDeadlock { .. })), "got {e:?}");
    release(r).await;
    release(
        l.try_write(f.slack())
            .await
            .unwrap()
            .expect("write after read"),
    )
    .await;
}
