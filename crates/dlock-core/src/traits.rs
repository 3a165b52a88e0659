//! The contract traits every backend implements.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::close::Closed;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::name::LockName;
use crate::options::{Capabilities, LockOptions, LockStatus};

/// A lock handle shared behind an `Arc`.
pub type DynLock = Arc<dyn DistributedLock>;
/// A read-write lock handle shared behind an `Arc`.
pub type DynReadWriteLock = Arc<dyn DistributedReadWriteLock>;
/// A semaphore handle shared behind an `Arc`.
pub type DynSemaphore = Arc<dyn DistributedSemaphore>;
/// A provider shared behind an `Arc`.
pub type DynLockProvider = Arc<dyn LockProvider>;

/// A connection to one lock store that creates lock handles by name.
///
/// Creating a handle is cheap and does no I/O; it validates the name and the options and
/// rejects what the backend cannot honour.
///
/// # Contract
///
/// The conformance suite (`dlock-conformance`) checks, for every handle a provider creates:
///
/// 1. **Exclusion**: at most one holder per name among all handles on the same store, for as
///    long as no holder has been told its hold is lost. A lease-based hold excludes while its
///    holder runs within its lease; fence the resource with the token so that a late write is
///    harmless.
/// 2. **Reentrancy**: the owner of a hold is the task that took it through a handle (the
///    thread, outside a task). Tasks that share a handle (an `Arc`, a clone, application
///    state) exclude each other, as with a `tokio::sync::Mutex`. By default a task that
///    acquires again waits for itself; with `reentrant(true)` it re-enters at once with the
///    same token. [`LockGuard::reenter`] hands a hold to another task explicitly. The lock is
///    freed remotely when the hold's last guard is released.
/// 3. **Owner-only release**: a guard whose hold expired and was taken over gets
///    `Err(LockLost)` from `release` and changes nothing.
/// 4. **Expiry**: a holder that dies frees the lock within its lease (or session).
/// 5. **Loss is reported before the lock can pass on**: [`LockGuard::is_held`] turns false
///    and [`LockGuard::lost`] resolves at the hold's horizon (the latest moment at which the
///    store cannot yet have given the lock to anyone else) less the drift allowance
///    ([`LockOptions::drift`]), whatever the network does; a released hold is never reported
///    lost.
/// 6. **Fencing**: tokens strictly increase per name, across releases and clients.
/// 7. **Fairness**: fair locks grant in waiting order, or the option is `Unsupported`.
/// 8. **Waiting**: `try_acquire(wait)` returns `Ok(None)` ("held by someone") no later than
///    `wait` plus [`CALL_GRACE`](crate::backend::CALL_GRACE) (2 s), and only when the store
///    answered that the lock is held: a store that did not answer is a retryable
///    [`Error::Connection`](crate::Error::Connection), one that refuses writes a
///    non-retryable error naming the cause.
/// 9. **Cancellation**: dropping an acquire future leaves nothing behind; a dropped release
///    finishes in the background, sent once.
/// 10. **Read-write**: readers share, a writer excludes all, write→read downgrade works (on a
///     fair lock too) and read→write by the same task is
///     [`Error::WouldDeadlock`](crate::Error::WouldDeadlock); another task's read makes a
///     writer wait.
/// 11. **Semaphore**: at most `permits` holders; permits of dead holders come back.
/// 12. **MultiLock**: see [`MultiLock`](crate::MultiLock).
/// 13. **Bad input** is a clear [`Error`](crate::Error), never a panic or a silent rename.
/// 14. **Dropping a guard** releases in the background (not immediately), on the runtime the
///     hold was taken on.
/// 15. **One name, several kinds**: a mutex, a read-write lock and a semaphore on one name
///     exclude each other (a mutex hold is exclusive like a write hold; reads share only with
///     reads, permits only with permits of the same semaphore); a store that cannot wait
///     across kinds refuses the later request with
///     [`Error::InvalidArgument`](crate::Error::InvalidArgument).
#[async_trait]
pub trait LockProvider: fmt::Debug + Send + Sync + 'static {
    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// Identifies the store (e.g. `redis://127.0.0.1:6379/0`, never with credentials). Two
    /// providers on the same store return the same id; [`MultiLock`](crate::MultiLock) orders
    /// locks by it.
    fn store_id(&self) -> &str;

    /// A mutex handle for `name`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName), or
    /// [`Error::Unsupported`](crate::Error::Unsupported) /
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for options the backend cannot
    /// honour.
    fn lock(&self, name: &str, options: LockOptions) -> Result<DynLock>;

    /// A read-write lock handle for `name`.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and `Unsupported` if the backend has no read-write locks.
    fn read_write_lock(&self, name: &str, options: LockOptions) -> Result<DynReadWriteLock>;

    /// A semaphore handle for `name` with `permits` permits.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), `InvalidArgument` for zero permits, and `Unsupported` if the
    /// backend has no semaphores.
    fn semaphore(&self, name: &str, permits: u32, options: LockOptions) -> Result<DynSemaphore>;

    /// A leader election on `name`: one campaigner at a time leads, with a proposal the
    /// others can read and watch, and a term (the leadership's fencing token) that grows
    /// with every new leader. On most backends an election is the mutex of its name (a lock
    /// of that name excludes the campaigners, and
    /// [`leader`](crate::DistributedElection::leader) names its holder with an empty
    /// proposal); on ZooKeeper (Curator's latch) the two are apart. Give elections names of
    /// their own.
    ///
    /// ```
    /// # async fn lead(provider: &dyn dlock_core::LockProvider) -> dlock_core::Result<()> {
    /// let election = provider.election("scheduler", dlock_core::LockOptions::default())?;
    /// let leadership = election.campaign(b"host-a:8080").await?;
    /// println!("leading in term {}", leadership.term());
    /// leadership.lost().await; // stop acting as the leader
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and `Unsupported` if the backend has no elections (the
    /// default).
    fn election(&self, name: &str, options: LockOptions) -> Result<crate::DynElection> {
        let _ = (name, options);
        Err(crate::Error::unsupported(
            self.capabilities().backend,
            "leader elections",
        ))
    }

    /// What the store records about `name` right now: who holds it and how, for how long,
    /// and the last fencing token. Reads only: never takes the lock or issues a token.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName), connection and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    async fn describe(&self, name: &str) -> Result<LockStatus>;

    /// Closes the provider, for a clean shutdown: acquisitions through its handles fail with
    /// [`Error::Closed`](crate::Error::Closed) from now on, every hold they handed out and
    /// that was not given back is released on the store (its guards turn lost, with
    /// [`LossReason::Closed`](crate::LossReason::Closed), so work under them stops), and the
    /// provider's clean-ups in flight are waited for: a dropped guard's release, a cancelled
    /// acquisition's undo (a queued fair waiter, a lease, a subscription). All within
    /// `within`; what is left then ends with its lease or session, as after a crash.
    ///
    /// Dropping a guard releases in a task of its own, and a runtime that shuts down (when
    /// `main` returns) drops such tasks unfinished: call `close` before.
    ///
    /// ```
    /// # async fn shutdown(provider: &dyn dlock_core::LockProvider) {
    /// let closed = provider.close(std::time::Duration::from_secs(5)).await;
    /// if !closed.is_clean() {
    ///     eprintln!("left to their leases and sessions: {closed:?}");
    /// }
    /// # }
    /// ```
    ///
    /// The default, for a provider whose handles are not the core's, does nothing.
    ///
    /// # Cancel safety
    ///
    /// Dropped, it stops waiting; releases it began run to their end in the background, and
    /// the provider stays closed.
    async fn close(&self, within: Duration) -> Closed {
        let _ = within;
        Closed::default()
    }
}

/// A handle on one named mutex.
///
/// # Who owns a hold
///
/// The owner of a hold is the **task** that acquired it through this handle (outside a tokio
/// task, the thread), not the handle: share one handle among tasks (an `Arc`, application
/// state) as you would a `tokio::sync::Mutex`, and the tasks exclude each other. By default a
/// handle is not reentrant, as a `tokio::sync::Mutex` is not: a guard is often moved to a
/// worker task, and the task that acquired it must then wait for that worker like anyone
/// else. A handle built [`reentrant(true)`](crate::LockOptions::reentrant) lets the same task
/// acquire again at once, with the same fencing token, as a Redisson thread does (then do
/// not move its guards to other tasks: the acquiring task would re-enter a hold another task
/// is using). [`LockGuard::reenter`](crate::LockGuard::reenter) hands a hold to another task
/// explicitly, with either setting. The hold is released on the store when its last guard is.
///
/// | | `tokio::sync::Mutex` in an `Arc` | a dlock handle in an `Arc` |
/// | --- | --- | --- |
/// | two tasks lock it | the second waits | the second waits (in the store, like any other holder) |
/// | one task locks it twice | deadlock | waits for itself; re-enters with `reentrant(true)` |
/// | the guard moves to another task | fine | fine; the acquiring task's next acquire waits for it |
/// | the holder dies | n/a | the store frees it within the lease |
///
/// Two handles of one name are separate owners even in one task.
#[async_trait]
pub trait DistributedLock: fmt::Debug + Send + Sync + 'static {
    /// The lock's name.
    fn name(&self) -> &LockName;

    /// The options the handle was created with.
    fn options(&self) -> &LockOptions;

    /// The store's id (see [`LockProvider::store_id`]).
    fn store_id(&self) -> &str;

    /// Waits as long as it takes for the lock.
    ///
    /// # Errors
    ///
    /// Connection and backend errors the backend could not retry away.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any await leaves no hold, queue entry or node
    /// behind, at this cost:
    ///
    /// - What the attempt may already have placed on the store (a fair-queue entry, a
    ///   contender node or key, a grant whose answer was still on its way) is removed by a
    ///   clean-up task on the runtime the attempt ran on. A runtime that shuts down first (when
    ///   `main` returns) drops it, and the store keeps the leftover until its lease or session
    ///   ends: await [`LockProvider::close`] before.
    /// - A dropped fair waiter gives up its place: asking again queues it last.
    /// - On the connection-bound SQL strategies (for-update, advisory, get-lock) the waiting
    ///   statement is ended on the server from another connection (`KILL`,
    ///   `pg_terminate_backend`), so the waiter's connection is closed, not reused.
    async fn acquire(&self) -> Result<LockGuard>;

    /// Waits at most `wait` for the lock; `Ok(None)` if the store says someone else holds it
    /// at the end of the wait. `Duration::ZERO` tries once. Returns by `wait` plus
    /// [`CALL_GRACE`](crate::backend::CALL_GRACE) (2 s) whatever the store does.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); a store that did not answer in time is a retryable
    /// [`Error::Connection`](crate::Error::Connection), never `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>>;
}

/// A handle on one named read-write lock. As for a mutex, each task that acquires through it
/// is an owner of its own: the task that writes may also read (downgrade); a task that reads
/// and asks to write gets [`Error::WouldDeadlock`](crate::Error::WouldDeadlock); another
/// task's read makes a writer wait.
#[async_trait]
pub trait DistributedReadWriteLock: fmt::Debug + Send + Sync + 'static {
    /// The lock's name.
    fn name(&self) -> &LockName;

    /// The options the handle was created with.
    fn options(&self) -> &LockOptions;

    /// The store's id.
    fn store_id(&self) -> &str;

    /// Waits for a shared (read) hold. The owner of the write hold may also read (downgrade).
    ///
    /// # Errors
    ///
    /// Connection and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, at the cost [`DistributedLock::acquire`] describes.
    async fn read(&self) -> Result<LockGuard>;

    /// Waits at most `wait` for a read hold.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, at the cost [`DistributedLock::acquire`] describes.
    async fn try_read(&self, wait: Duration) -> Result<Option<LockGuard>>;

    /// Waits for the exclusive (write) hold.
    ///
    /// # Errors
    ///
    /// [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) at once if this owner holds a
    /// read hold and not the write hold; connection and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, at the cost [`DistributedLock::acquire`] describes.
    async fn write(&self) -> Result<LockGuard>;

    /// Waits at most `wait` for the write hold.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, at the cost [`DistributedLock::acquire`] describes.
    async fn try_write(&self, wait: Duration) -> Result<Option<LockGuard>>;
}

/// A handle on one named counting semaphore. Every acquisition takes one more permit, even by
/// the same handle.
#[async_trait]
pub trait DistributedSemaphore: fmt::Debug + Send + Sync + 'static {
    /// The semaphore's name.
    fn name(&self) -> &LockName;

    /// The number of permits this handle counts against.
    fn permits(&self) -> u32;

    /// The options the handle was created with.
    fn options(&self) -> &LockOptions;

    /// The store's id.
    fn store_id(&self) -> &str;

    /// Waits for a permit.
    ///
    /// # Errors
    ///
    /// Connection and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, at the cost [`DistributedLock::acquire`] describes.
    async fn acquire(&self) -> Result<LockGuard>;

    /// Waits at most `wait` for a permit.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, at the cost [`DistributedLock::acquire`] describes.
    async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>>;

    /// How many of the [`permits`](Self::permits) are free right now, as the store counts
    /// them (Redisson's `availablePermits`, Curator's leases). Permits whose lease ended count
    /// as free. A snapshot: another process may take or return one the next moment; use it
    /// for metrics and admission hints, never instead of `try_acquire`.
    ///
    /// # Errors
    ///
    /// Connection and backend errors; [`Error::Unsupported`](crate::Error::Unsupported) where
    /// the backend cannot count (the default).
    async fn available(&self) -> Result<u32> {
        Err(crate::Error::unsupported(
            "dlock",
            "counting a semaphore's available permits",
        ))
    }
}
