#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

/// Builder setters, for the option types of the core and of backends: each
/// `name => field: Type;` (with its doc comment) is a `pub fn name(mut self, field: Type) ->
/// Self` that stores its argument in `field`.
///
/// ```
/// pub struct Config {
///     retries: u32,
/// }
///
/// impl Config {
///     dlock_core::setters! {
///         /// Sets how many times a call is tried again.
///         with_retries => retries: u32;
///     }
/// }
///
/// assert_eq!(Config { retries: 0 }.with_retries(3).retries, 3);
/// ```
#[macro_export]
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident => $field:ident: $ty:ty;)*) => {
        $(
            $(#[$attr])*
            pub fn $name(mut self, $field: $ty) -> Self {
                self.$field = $field;
                self
            }
        )*
    };
}

mod close;
mod election;
mod error;
mod ext;
mod finish;
mod gather;
mod guard;
mod handles;
mod hold;
mod holdset;
mod keeper;
mod loss;
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
mod metrics;
mod multi;
mod name;
mod options;
mod provider;
mod reentrancy;
mod shared;
mod starter;
#[cfg(not(loom))]
mod state;
#[cfg(loom)]
#[doc(hidden)]
pub mod state;
mod sync;
mod tally;
mod time;
mod tls;
mod trace;
mod traits;
mod undo;
mod url;

pub use crate::close::Closed;
pub use crate::election::{
    DistributedElection, DynElection, Leader, Leadership, MAX_PROPOSAL, Observer,
};
pub use crate::error::{BoxError, Error, Result};
pub use crate::ext::DistributedLockExt;
pub use crate::guard::LockGuard;
pub use crate::hold::HoldState;
pub use crate::loss::{LockKind, LossReason};
pub use crate::multi::{Member, MultiGuard, MultiLock};
pub use crate::name::{FencingToken, LockName};
pub use crate::options::{Capabilities, DriftAllowance, Lease, LockOptions, LockStatus};
pub use crate::tls::TlsFiles;
pub use crate::traits::{
    DistributedLock, DistributedReadWriteLock, DistributedSemaphore, DynLock, DynLockProvider,
    DynReadWriteLock, DynSemaphore, LockProvider,
};
pub use crate::url::{RedactedUrl, redact};

/// Re-exported so backends implement the traits with the same macro version.
pub use async_trait::async_trait;

/// What backend authors need and users do not: the hold a backend hands to the core, the
/// generic handles that implement the contract traits over one "acquire until this deadline"
/// per primitive, and the time helpers every deadline and lease goes through.
///
/// A backend implements [`RawLock`](backend::RawLock) (and, if it can,
/// [`RawReadWriteLock`](backend::RawReadWriteLock) and [`RawSemaphore`](backend::RawSemaphore)),
/// builds a [`LockGuard`] with [`NewHold`](backend::NewHold) as soon as the store granted a hold,
/// and returns [`Lock`](backend::Lock) (and friends) from its [`LockProvider`]: the core
/// supplies names, options, `acquire`, `try_acquire`, re-entry, the read→write deadlock check
/// and the `dlock.acquire` span.
///
/// ```
/// use std::sync::Arc;
/// use dlock_core::backend::{HandleInfo, Lock, RawLock, Request};
/// use dlock_core::{DistributedLock, LockGuard, LockName, LockOptions, Result, async_trait};
///
/// #[derive(Debug)]
/// struct NeverFree;
///
/// #[async_trait]
/// impl RawLock for NeverFree {
///     async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
///         req.deadline.sleep().await; // someone else always holds it
///         Ok(None)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<()> {
/// let info = HandleInfo::new("never", "never://", LockName::new("a")?, LockOptions::default());
/// let lock: dlock_core::DynLock = Arc::new(Lock::new(info, NeverFree));
/// assert!(lock.try_acquire(std::time::Duration::from_millis(10)).await?.is_none());
/// # Ok(()) }
/// ```
pub mod backend {
    pub use crate::close::cleanup;
    #[cfg(feature = "serde")]
    #[doc(inline)]
    pub use crate::deserialize_from_url;
    pub use crate::election::{Election, POLL, PostedElection, ProposalBoard, RawElection};
    pub use crate::finish::{Finish, finish_if_dropped};
    pub use crate::gather::{Batcher, renewal_window};
    pub use crate::handles::{
        AcquireFn, CALL_GRACE, HandleInfo, Lock, RawLock, RawReadWriteLock, RawSemaphore,
        ReadWriteLock, Request, Semaphore,
    };
    pub use crate::hold::{Hold, HoldSignal, Horizon, NewHold};
    pub use crate::holdset::{HoldSet, Registration};
    pub use crate::provider::{NoPrimitive, ProviderMeta, RawProvider};
    pub use crate::reentrancy::Owner;
    pub use crate::starter::{Later, spawn_at};
    pub use crate::sync::Mutex;
    pub use crate::tally::Tally;
    pub use crate::time::{
        Backoff, Deadline, Retries, earlier, from_now, jitter, later, worth_a_warning,
    };
    pub use crate::undo::{UndoFn, UndoOnDrop};
    #[cfg(feature = "serde")]
    pub use crate::url::deserialize_url;
    pub use crate::url::{HostListUrl, parse_host_list, percent_decode};
}
