//! Read-write locks.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Capabilities, DynLockProvider, DynReadWriteLock, Error, LockOptions};

use super::{
    Need, READ_WRITE_LOCKS, ZERO, assert_not_granted, clients_if, granted_within, joined,
    named_clients_if, release, residue_reaches, rw, take_read, take_write, unsupported,
};
use crate::Factory;
use crate::support::{Names, must};

/// Handles of one read-write lock (a fresh name ending in `suffix`), one through each of `N`
/// fresh clients (returned with them, to keep them open), if the backend offers what `need`
/// asks; `None` otherwise (the case is then noted skipped, and the caller returns).
async fn handles_of_one_lock<const N: usize>(
    f: &impl Factory,
    need: Need,
    suffix: &str,
) -> Option<([DynLockProvider; N], [DynReadWriteLock; N])> {
    let (clients, name) = named_clients_if(f, need, suffix).await?;
    let handles = clients.each_ref().map(|p| rw(p, &name));
    Some((clients, handles))
}

/// Readers of different clients share.
pub async fn rw_readers_share(f: &impl Factory) {
    let Some((_clients, [la, lb])) = handles_of_one_lock(f, READ_WRITE_LOCKS, "rw-share").await
    else {
        return;
    };
    let r1 = take_read(f, &la, "reader 1").await;
    let r2 = take_read(f, &lb, "reader 2").await;
    release(r1).await;
    release(r2).await;
}

/// A writer excludes readers and writers.
pub async fn rw_writer_excludes_everyone(f: &impl Factory) {
    let Some((_clients, [l, other])) = handles_of_one_lock(f, READ_WRITE_LOCKS, "rw-write").await
    else {
        return;
    };
    let w = take_write(f, &l, "writer").await;
    assert_not_granted(other.try_read(ZERO).await, "read during a write");
    assert_not_granted(other.try_write(ZERO).await, "write during a write");
    release(w).await;
    release(take_read(f, &other, "read after the write").await).await;
}

/// A reader blocks writers; the writer gets in after the reader leaves.
pub async fn rw_reader_blocks_writer(f: &impl Factory) {
    let Some((_clients, [l, writer])) = handles_of_one_lock(f, READ_WRITE_LOCKS, "rw-read").await
    else {
        return;
    };
    let r = take_read(f, &l, "reader").await;
    assert_not_granted(writer.try_write(ZERO).await, "write during a read");
    release(r).await;
    release(take_write(f, &writer, "write after the read").await).await;
}

/// The writer may take the read lock (downgrade) and keep reading after releasing the write.
pub async fn rw_downgrade(f: &impl Factory) {
    let offered = |c: &Capabilities| c.read_write && c.reentrant;
    let Some((_clients, [l, other])) =
        handles_of_one_lock(f, Need(offered, "no reentrant read-write locks"), "rw-down").await
    else {
        return;
    };
    let w = take_write(f, &l, "writer").await;
    let r = granted_within(
        f.slack(),
        "downgrade: the writer may read",
        l.try_read(ZERO),
    )
    .await;
    release(w).await;
    assert_not_granted(other.try_write(ZERO).await, "the downgraded read holds");
    release(take_read(f, &other, "readers share after downgrade").await).await;
    release(r).await;
}

/// A reader asking for the write lock gets `WouldDeadlock` at once.
pub async fn rw_upgrade_would_deadlock(f: &impl Factory) {
    let Some([a]) = clients_if(f, READ_WRITE_LOCKS).await else {
        return;
    };
    let l = rw(&a, &Names::new().name("rw-up"));
    let r = take_read(f, &l, "reader").await;
    let e = must(f.slack(), "upgrade answers at once", l.write()).await;
    assert!(matches!(e, Err(Error::WouldDeadlock { .. })), "got {e:?}");
    release(r).await;
    release(take_write(f, &l, "write after read").await).await;
}

/// On a fair read-write lock, the writer reads (downgrades) at once although another fair
/// writer waits behind it: that writer waits for this very write, so queueing the read
/// behind it would deadlock.
pub async fn rw_fair_downgrade_with_a_writer_queued(f: &impl Factory) {
    let offered = |c: &Capabilities| c.read_write && c.fair && c.reentrant;
    let why = "no fair reentrant read-write locks";
    let Some(([a, b], name)) = named_clients_if(f, Need(offered, why), "rw-fair-down").await else {
        return;
    };
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
    let w = take_write(f, &mine, "writer").await;
    let queued = tokio::spawn(async move { theirs.try_write(Duration::from_secs(60)).await });
    residue_reaches(f, &name, 2, "the other writer waits in line").await;
    let what = "the fair downgrade (it must not wait behind the writer queued after it)";
    let r = granted_within(f.slack() * 2, what, mine.try_read(f.slack())).await;
    release(w).await;
    release(r).await;
    let what = "the queued writer after the downgraded read";
    release(granted_within(f.slack() * 3, what, joined(queued)).await).await;
}

/// Tasks that share one read-write handle are owners of their own: one task's read makes
/// another task's write wait (not `WouldDeadlock`, which is for the reader itself), and the
/// write gets in once the read is released.
pub async fn rw_a_sibling_tasks_read_makes_a_writer_wait(f: &impl Factory) {
    let Some([a]) = clients_if(f, READ_WRITE_LOCKS).await else {
        return;
    };
    let l = rw(&a, &Names::new().name("rw-sibling"));
    let r = take_read(f, &l, "reader").await;
    let sibling = Arc::clone(&l);
    let write = tokio::spawn(async move { sibling.try_write(Duration::from_millis(200)).await });
    let tried = must(f.slack() * 2, "a sibling task's write", joined(write)).await;
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
    let what = "the sibling's write after the read";
    release(granted_within(f.slack() * 3, what, joined(writer)).await).await;
}
