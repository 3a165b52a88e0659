#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

mod config;
mod contend;
mod create;
mod election;
mod error;
mod hold;
mod kinds;
mod mutex;
mod nodes;
mod provider;
mod rwlock;
mod semaphore;
mod session;
mod undo;

pub use crate::config::{DEFAULT_PORT, DEFAULT_SESSION_TIMEOUT, ZkConfig};
pub use crate::election::ZkElection;
pub use crate::nodes::is_recipe_node;
pub use crate::provider::{MIN_LEASE, ZkProvider};
pub use crate::session::ZkStats;
/// The client library, for [`ZkProvider::client`].
pub use zookeeper_client;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["zk"];

/// The backend's name in errors, capabilities and spans.
pub(crate) const BACKEND: &str = "zookeeper";
