#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

mod attempt;
mod config;
mod db;
mod election;
mod error;
mod handles;
#[cfg(feature = "_sqlite")]
mod mounts;
mod pinned;
mod provider;
pub mod raw;
mod schema;
mod sql;
mod strategy;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod transaction;
mod wait;

pub use crate::config::{Dialect, SqlConfig, SqlPool, Strategy};
pub use crate::election::{SqlElection, SqlProposals};
pub(crate) use crate::provider::Inner;
pub use crate::provider::{MIN_LEASE, SCHEMES, SqlProvider};
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub use crate::transaction::TxLock;
