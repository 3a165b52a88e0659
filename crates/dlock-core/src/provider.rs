//! [`LockProvider`] implemented once for every backend, over a [`RawProvider`]: the shared
//! name rules, the capability, option and permit checks, and the `Unsupported` messages, in
//! one order everywhere.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::close::{Closed, Closer};
use crate::election::{DynElection, Election, Leader, RawElection};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::handles::{
    HandleInfo, Lock, RawLock, RawReadWriteLock, RawSemaphore, ReadWriteLock, Request, Semaphore,
};
use crate::loss::LockKind;
use crate::name::LockName;
use crate::options::{Capabilities, LockOptions, LockStatus};
use crate::traits::{DynLock, DynReadWriteLock, DynSemaphore, LockProvider};

/// What every provider of a backend says about itself: what it can do and which store it
/// talks to. Made once, when the provider is.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProviderMeta {
    /// What the backend can do with this provider's settings.
    pub capabilities: Capabilities,
    /// The store's id (see [`LockProvider::store_id`]), never with credentials.
    pub store_id: Arc<str>,
    /// The provider's live holds and whether it was closed ([`LockProvider::close`]).
    closer: Arc<Closer>,
}

impl ProviderMeta {
    /// The meta of a provider.
    pub fn new(capabilities: Capabilities, store_id: impl Into<Arc<str>>) -> Self {
        Self {
            capabilities,
            store_id: store_id.into(),
            closer: Closer::new(),
        }
    }
}

/// A backend's provider, as the core sees it: one raw primitive per kind it has, made for a
/// name that has passed the shared checks. Every `RawProvider` is a [`LockProvider`]: the core
/// checks the name ([`LockName`]), that the primitive exists, the permits and the options
/// against the [`Capabilities`] (in that order), then the backend's own rules
/// ([`check`](Self::check)), and wraps the raw primitive in the core's handle.
///
/// A backend without read-write locks or semaphores names [`NoPrimitive`] for them and
/// leaves their constructors to the default, which is never called (the capability check
/// comes first).
pub trait RawProvider: fmt::Debug + Send + Sync + 'static {
    /// The backend's mutex.
    type Mutex: RawLock;
    /// The backend's read-write lock, or [`NoPrimitive`].
    type ReadWrite: RawReadWriteLock;
    /// The backend's semaphore, or [`NoPrimitive`].
    type Semaphore: RawSemaphore;
    /// The backend's leader election, or [`NoPrimitive`].
    type Election: RawElection;

    /// What the provider can do and which store it talks to.
    fn meta(&self) -> &ProviderMeta;

    /// The backend's own rules for a name and options of a handle of `kind` (a mutex,
    /// [`LockKind::Write`] for a read-write lock, [`LockKind::Permit`] for a semaphore),
    /// checked after the shared ones: a name its store cannot represent, an option it refuses
    /// for one kind only. The default accepts everything.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::InvalidArgument`] or [`Error::Unsupported`].
    fn check(&self, name: &LockName, kind: LockKind, options: &LockOptions) -> Result<()> {
        let _ = (name, kind, options);
        Ok(())
    }

    /// The raw mutex for `name`.
    ///
    /// # Errors
    ///
    /// What the backend cannot set up for the name.
    fn raw_lock(&self, name: &LockName, options: &LockOptions) -> Result<Self::Mutex>;

    /// The raw read-write lock for `name`. The default refuses (for [`NoPrimitive`]).
    ///
    /// # Errors
    ///
    /// What the backend cannot set up for the name.
    fn raw_read_write(&self, name: &LockName, options: &LockOptions) -> Result<Self::ReadWrite> {
        let _ = (name, options);
        Err(Error::unsupported(
            self.meta().capabilities.backend,
            "read-write locks",
        ))
    }

    /// The raw semaphore for `name` with `permits` permits. The default refuses (for
    /// [`NoPrimitive`]).
    ///
    /// # Errors
    ///
    /// What the backend cannot set up for the name.
    fn raw_semaphore(
        &self,
        name: &LockName,
        permits: u32,
        options: &LockOptions,
    ) -> Result<Self::Semaphore> {
        let _ = (name, permits, options);
        Err(Error::unsupported(
            self.meta().capabilities.backend,
            "semaphores",
        ))
    }

    /// The raw election of `name`. The default refuses (for [`NoPrimitive`]).
    ///
    /// # Errors
    ///
    /// What the backend cannot set up for the name.
    fn raw_election(&self, name: &LockName, options: &LockOptions) -> Result<Self::Election> {
        let _ = (name, options);
        Err(Error::unsupported(
            self.meta().capabilities.backend,
            "leader elections",
        ))
    }

    /// What the store records about `name` right now (see [`LockProvider::describe`]).
    ///
    /// # Errors
    ///
    /// Connection and backend errors.
    fn raw_describe(&self, name: &LockName) -> impl Future<Output = Result<LockStatus>> + Send;
}

/// The primitive of a backend that has none of that kind: it cannot be made, and its
/// capability says so, so the core answers `Unsupported` before asking for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoPrimitive {}

#[async_trait]
impl RawReadWriteLock for NoPrimitive {
    async fn read(&self, _: &Request<'_>, _: bool) -> Result<Option<LockGuard>> {
        match *self {}
    }

    async fn write(&self, _: &Request<'_>) -> Result<Option<LockGuard>> {
        match *self {}
    }
}

#[async_trait]
impl RawSemaphore for NoPrimitive {
    async fn acquire(&self, _: &Request<'_>, _: u32) -> Result<Option<LockGuard>> {
        match *self {}
    }
}

#[async_trait]
impl RawElection for NoPrimitive {
    async fn campaign(&self, _: &Request<'_>, _: &[u8]) -> Result<Option<LockGuard>> {
        match *self {}
    }

    async fn proclaim(&self, _: &LockGuard, _: &[u8]) -> Result<()> {
        match *self {}
    }

    async fn leader(&self) -> Result<Option<Leader>> {
        match *self {}
    }
}

fn info<P: RawProvider>(p: &P, name: LockName, options: LockOptions) -> HandleInfo {
    let meta = p.meta();
    HandleInfo::new(
        meta.capabilities.backend,
        Arc::clone(&meta.store_id),
        name,
        options,
    )
    .with_max_lease(meta.capabilities.max_lease)
    .with_closer(Arc::clone(&meta.closer))
}

#[async_trait]
impl<P: RawProvider> LockProvider for P {
    fn capabilities(&self) -> Capabilities {
        self.meta().capabilities
    }

    fn store_id(&self) -> &str {
        &self.meta().store_id
    }

    fn lock(&self, name: &str, options: LockOptions) -> Result<DynLock> {
        let name = LockName::new(name)?;
        self.meta().capabilities.check(&options)?;
        self.check(&name, LockKind::Mutex, &options)?;
        let raw = self.raw_lock(&name, &options)?;
        Ok(Arc::new(Lock::new(info(self, name, options), raw)))
    }

    fn read_write_lock(&self, name: &str, options: LockOptions) -> Result<DynReadWriteLock> {
        let name = LockName::new(name)?;
        let caps = self.meta().capabilities;
        if !caps.read_write {
            return Err(Error::unsupported(caps.backend, "read-write locks"));
        }
        caps.check(&options)?;
        self.check(&name, LockKind::Write, &options)?;
        let raw = self.raw_read_write(&name, &options)?;
        Ok(Arc::new(ReadWriteLock::new(info(self, name, options), raw)))
    }

    fn semaphore(&self, name: &str, permits: u32, options: LockOptions) -> Result<DynSemaphore> {
        let name = LockName::new(name)?;
        let caps = self.meta().capabilities;
        caps.check_permits(permits)?;
        caps.check(&options)?;
        self.check(&name, LockKind::Permit, &options)?;
        let raw = self.raw_semaphore(&name, permits, &options)?;
        Ok(Arc::new(Semaphore::new(
            info(self, name, options),
            permits,
            raw,
        )))
    }

    fn election(&self, name: &str, options: LockOptions) -> Result<DynElection> {
        let name = LockName::new(name)?;
        let caps = self.meta().capabilities;
        if !caps.election {
            return Err(Error::unsupported(caps.backend, "leader elections"));
        }
        caps.check(&options)?;
        self.check(&name, LockKind::Mutex, &options)?;
        let raw = self.raw_election(&name, &options)?;
        Ok(Arc::new(Election::new(info(self, name, options), raw)))
    }

    async fn close(&self, within: Duration) -> Closed {
        self.meta().closer.close(within).await
    }

    async fn describe(&self, name: &str) -> Result<LockStatus> {
        let name = LockName::new(name)?;
        self.raw_describe(&name).await
    }
}
