//! Read-write locks.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, LockOptions};

use super::{ZERO, caps, client, release, residue_reaches, rw, unsupported};
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

/// On a fair read-write lock, the writer reads (downgrades) at once although another fair
/// writer waits behind it: that writer waits for this very write, so queueing the read
/// behind it would deadlock.
pub async fn rw_fair_downgrade_with_a_writer_queued(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).read_write || !caps(&a).fair || !caps(&a).reentrant {
        return unsupported(f, "no fair reentrant read-write locks");
    }
    let name = Names::new().name("rw-fair-down");
    let fair = LockOptions::new().with_fair(true);
    let mine = match a.read_write_lock(&name, fair) {
        Ok(l) => l,
        // Fair locks, but no fair read-write locks (Redisson has none).
        Err(Error::Unsupported { .. }) => {
            return unsupported(f, "no fair read-write locks");
        }
        Err(e) => panic!("read_write_lock: {e}"),
    };
    let theirs = b
        .read_write_lock(&name, fair)
        .unwrap_or_else(|e| panic!("read_write_lock: {e}"));
    let w = mine.try_write(f.slack()).await.unwrap().expect("writer");
    let queued = tokio::spawn(async move { theirs.try_write(Duration::from_secs(60)).await });
    residue_reaches(f, &name, 2, "the other writer waits in line").await;
    let r = must(
        f.slack() * 2,
        "the fair downgrade",
        mine.try_read(f.slack()),
    )
    .await
    .unwrap_or_else(|e| panic!("downgrade: {e}"));
    let r = r.expect("the fair writer's downgrade waited behind the writer queued after it");
    release(w).await;
    release(r).await;
    let w2 = must(f.slack() * 3, "the queued writer", queued)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .unwrap_or_else(|e| panic!("queued writer: {e}"))
        .expect("the queued writer after the downgraded read");
    release(w2).await;
}

/// Tasks that share one read-write handle are owners of their own: one task's read makes
/// another task's write wait (not `WouldDeadlock`, which is for the reader itself), and the
/// write gets in once the read is released.
pub async fn rw_a_sibling_tasks_read_makes_a_writer_wait(f: &impl Factory) {
    let a = client(f).await;
    if !caps(&a).read_write {
        return unsupported(f, "no read-write locks");
    }
    let l = rw(&a, &Names::new().name("rw-sibling"));
    let r = l.try_read(f.slack()).await.unwrap().expect("reader");
    let sibling = Arc::clone(&l);
    let tried = must(
        f.slack() * 2,
        "a sibling task's write",
        tokio::spawn(async move { sibling.try_write(Duration::from_millis(200)).await }),
    )
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    match tried {
        Ok(None) => {}
        Ok(Some(_)) => panic!("a sibling task wrote while another task of the handle read"),
        Err(e) => panic!("a sibling task's write must wait for the read, not fail: {e}"),
    }
    let writer = {
        let l = Arc::clone(&l);
        tokio::spawn(async move { l.try_write(Duration::from_secs(60)).await })
    };
    release(r).await;
    let w = must(f.slack() * 3, "the sibling's write after the read", writer)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .unwrap_or_else(|e| panic!("write: {e}"))
        .expect("the write after the read");
    release(w).await;
}
