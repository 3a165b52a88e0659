//! All-or-nothing acquisition of several locks, read holds and permits.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures::future::select_all;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::name::{FencingToken, LockName};
use crate::time::Deadline;
use crate::traits::{DynLock, DynReadWriteLock, DynSemaphore};

/// One member of a [`MultiLock`]: a mutex, the read or write side of a read-write lock, or a
/// permit of a semaphore.
///
/// `From` turns a [`DynLock`] into a mutex member; [`Member::read`], [`Member::write`] and
/// [`Member::permit`] build the others.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Member {
    /// The mutex.
    Lock(DynLock),
    /// A read hold of the read-write lock.
    Read(DynReadWriteLock),
    /// The write hold of the read-write lock.
    Write(DynReadWriteLock),
    /// One permit of the semaphore.
    Permit(DynSemaphore),
}

impl Member {
    /// A read hold of `rw`.
    pub fn read(rw: DynReadWriteLock) -> Self {
        Self::Read(rw)
    }

    /// The write hold of `rw`.
    pub fn write(rw: DynReadWriteLock) -> Self {
        Self::Write(rw)
    }

    /// One permit of `semaphore`.
    pub fn permit(semaphore: DynSemaphore) -> Self {
        Self::Permit(semaphore)
    }

    /// The store the member lives in.
    pub fn store_id(&self) -> &str {
        match self {
            Self::Lock(l) => l.store_id(),
            Self::Read(rw) | Self::Write(rw) => rw.store_id(),
            Self::Permit(s) => s.store_id(),
        }
    }

    /// The member's name.
    pub fn name(&self) -> &LockName {
        match self {
            Self::Lock(l) => l.name(),
            Self::Read(rw) | Self::Write(rw) => rw.name(),
            Self::Permit(s) => s.name(),
        }
    }

    /// Takes the member's hold (a mutex, a read or the write hold, a permit), waiting as long
    /// as it takes.
    ///
    /// # Errors
    ///
    /// As the member's own `acquire`, `read`, `write`.
    pub async fn acquire(&self) -> Result<LockGuard> {
        match self {
            Self::Lock(l) => l.acquire().await,
            Self::Read(rw) => rw.read().await,
            Self::Write(rw) => rw.write().await,
            Self::Permit(s) => s.acquire().await,
        }
    }

    /// Takes the member's hold, waiting at most `wait`; `None` if it was not had by then.
    ///
    /// # Errors
    ///
    /// As the member's own `try_acquire`, `try_read`, `try_write`.
    pub async fn try_acquire(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_until(Deadline::after(wait)).await
    }

    async fn acquire_until(&self, deadline: Deadline) -> Result<Option<LockGuard>> {
        match (self, deadline.remaining()) {
            (Self::Lock(l), None) => l.acquire().await.map(Some),
            (Self::Lock(l), Some(left)) => l.try_acquire(left).await,
            (Self::Read(rw), None) => rw.read().await.map(Some),
            (Self::Read(rw), Some(left)) => rw.try_read(left).await,
            (Self::Write(rw), None) => rw.write().await.map(Some),
            (Self::Write(rw), Some(left)) => rw.try_write(left).await,
            (Self::Permit(s), None) => s.acquire().await.map(Some),
            (Self::Permit(s), Some(left)) => s.try_acquire(left).await,
        }
    }
}

impl From<DynLock> for Member {
    fn from(lock: DynLock) -> Self {
        Self::Lock(lock)
    }
}

/// Several locks taken as one: all or nothing, over any mix of backends and of mutexes, read
/// or write holds and semaphore permits.
///
/// The members are acquired in one canonical order (by store id, then name), so two
/// `MultiLock`s over the same names never deadlock whatever order they were given in. Before
/// the guard is returned every member is checked again (a fixed lease can run out while a
/// later member is awaited). A partial acquisition is rolled back (released in reverse) before
/// an error or `Ok(None)` is returned, and when the acquiring future is dropped; the
/// [`MultiGuard`] releases all of them in reverse order.
///
/// A name may appear once per store, whatever its kind: two members on one name would wait for
/// each other.
///
/// ```
/// # async fn demo(a: dlock_core::DynLock, b: dlock_core::DynLock) -> dlock_core::Result<()> {
/// use dlock_core::MultiLock;
/// let both = MultiLock::new(vec![a, b])?;
/// let guard = both.acquire().await?;
/// // ... both locks are held ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// Mixed members:
///
/// ```
/// # async fn demo(
/// #     order: dlock_core::DynLock,
/// #     config: dlock_core::DynReadWriteLock,
/// #     slots: dlock_core::DynSemaphore,
/// # ) -> dlock_core::Result<()> {
/// use dlock_core::{Member, MultiLock};
/// let all = MultiLock::new([Member::from(order), Member::read(config), Member::permit(slots)])?;
/// let guard = all.acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiLock {
    members: Vec<Member>,
}

impl MultiLock {
    /// Orders `members` canonically.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the list is empty or names the same lock twice.
    pub fn new<M: Into<Member>>(members: impl IntoIterator<Item = M>) -> Result<Self> {
        let mut members: Vec<Member> = members.into_iter().map(Into::into).collect();
        if members.is_empty() {
            return Err(Error::invalid_argument(
                "locks",
                "a MultiLock needs at least one lock",
            ));
        }
        members.sort_by(|a, b| (a.store_id(), a.name()).cmp(&(b.store_id(), b.name())));
        if let Some(w) = members
            .windows(2)
            .find(|w| (w[0].store_id(), w[0].name()) == (w[1].store_id(), w[1].name()))
        {
            return Err(Error::invalid_argument(
                "locks",
                format!("lock {:?} appears twice", w[0].name()),
            ));
        }
        Ok(Self { members })
    }

    /// The members in acquisition order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Waits as long as it takes for all the members.
    ///
    /// # Errors
    ///
    /// The first error of any member, or [`Error::LockLost`] if a member taken earlier was lost
    /// while a later one was awaited; the members taken are released first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: members already taken are dropped, which releases them in the background.
    pub async fn acquire(&self) -> Result<MultiGuard> {
        self.acquire_until(Deadline::NEVER)
            .await?
            .ok_or_else(|| Error::unbounded_wait_ended("multilock", "MultiLock"))
    }

    /// Waits at most `wait` (in all) for all the members; `Ok(None)`, with nothing held, if
    /// they were not all had by then. A `wait` too long for the clock (`Duration::MAX`) waits
    /// as long as it takes.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self, wait: Duration) -> Result<Option<MultiGuard>> {
        self.acquire_until(Deadline::after(wait)).await
    }

    async fn acquire_until(&self, deadline: Deadline) -> Result<Option<MultiGuard>> {
        let mut guards = Taken(Vec::with_capacity(self.members.len()));
        for member in &self.members {
            match member.acquire_until(deadline).await {
                Ok(Some(guard)) => guards.0.push(guard),
                Ok(None) => {
                    rollback(guards.take()).await;
                    return Ok(None);
                }
                Err(e) => {
                    rollback(guards.take()).await;
                    return Err(e);
                }
            }
        }
        // The members taken before the last were held while the others were awaited: one may
        // have ended without its lease ending (a connection-bound hold whose connection was
        // reset), so ask the store, not only the lease.
        let mut lost = None;
        for (i, g) in guards.0.iter().enumerate() {
            let held = if i + 1 == guards.0.len() {
                Ok(g.is_held())
            } else {
                g.verify().await
            };
            match held {
                Ok(true) => {}
                Ok(false) => {
                    lost = Some(Error::lock_lost(g.name()));
                    tracing::warn!(lock = %g.name(), reason = ?g.loss_reason(), "MultiLock: a member was lost while the others were awaited; rolling back");
                    break;
                }
                Err(e) => {
                    lost = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = lost {
            rollback(guards.take()).await;
            return Err(e);
        }
        Ok(Some(MultiGuard {
            guards: guards.take(),
        }))
    }
}

/// The members a MultiLock acquisition has taken so far. Dropped with guards still in it (the
/// acquisition was cancelled), they are released without their least time: the caller never
/// got them.
struct Taken(Vec<LockGuard>);

impl Taken {
    fn take(&mut self) -> Vec<LockGuard> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        for g in &self.0 {
            g.forget_least_time();
        }
    }
}

async fn rollback(guards: Vec<LockGuard>) {
    for guard in guards.into_iter().rev() {
        let name = guard.name().clone();
        // The caller never got these holds: no least time to keep.
        if let Err(e) = guard.release_now().await {
            tracing::warn!(lock = %name, error = %e, "MultiLock rollback: release failed");
        }
    }
}

/// The guards of a [`MultiLock`], released together in reverse acquisition order.
#[must_use = "dropping the guard releases the locks in the background"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The individual guards, in acquisition order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The individual guards, to watch or release one by one (each still releases itself when
    /// dropped).
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }

    /// The fencing tokens, in acquisition order.
    pub fn fencing_tokens(&self) -> Vec<FencingToken> {
        self.guards.iter().map(LockGuard::fencing_token).collect()
    }

    /// Whether every hold is vouched for.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when any of the holds is lost.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let futures: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            if !futures.is_empty() {
                select_all(futures).await;
            }
        }
    }

    /// Releases every lock, last acquired first; all are attempted even if one fails.
    ///
    /// # Errors
    ///
    /// The first error met (e.g. [`Error::LockLost`] for a hold that was lost).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the guards not yet released are dropped, which releases them in the
    /// background.
    pub async fn release(self) -> Result<()> {
        let mut first = None;
        for guard in self.guards.into_iter().rev() {
            if let Err(e) = guard.release().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}
