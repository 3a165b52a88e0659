#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

mod config;
mod election;
mod handles;
mod link;
mod provider;
mod store;

use std::time::Duration;

pub use crate::election::MemoryElection;
pub use crate::provider::MemoryProvider;
#[cfg(feature = "sabotage")]
#[cfg_attr(docsrs, doc(cfg(feature = "sabotage")))]
pub use crate::store::Sabotage;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["memory"];

pub(crate) const BACKEND: &str = "memory";

/// The shortest lease the memory backend accepts.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
