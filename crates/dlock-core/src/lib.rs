#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

mod error;
mod guard;
mod keeper;
mod multi;
mod name;
mod options;
mod reentrancy;
mod traits;
mod url;

pub use crate::error::{BoxError, Error, Result};
pub use crate::guard::{Hold, HoldSignal, HoldState, LockGuard, NewHold};
pub use crate::multi::{MultiGuard, MultiLock};
pub use crate::name::{FencingToken, LockName};
pub use crate::options::{Capabilities, Lease, LockOptions, LockStatus};
pub use crate::reentrancy::Reentrancy;
pub use crate::traits::{
    DistributedLock, DistributedReadWriteLock, DistributedSemaphore, DynLock, DynLockProvider,
    DynReadWriteLock, DynSemaphore, LockProvider,
};
pub use crate::url::{RedactedUrl, redact};

/// Re-exported so backends implement the traits with the same macro version.
pub use async_trait::async_trait;
