#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

mod config;
mod election;
mod error;
mod hold;
mod keepalive;
mod keys;
mod members;
mod mutex;
mod provider;
mod renewals;
mod retry;
mod session;
mod stats;
mod wait;

use std::time::Duration;

pub use crate::config::{
    DEFAULT_LEASE_TTL, DEFAULT_PORT, DEFAULT_PREFIX, EtcdConfig, EtcdTls, MAX_LEASE_TTL,
    MIN_LEASE_TTL,
};
pub use crate::election::EtcdElection;
pub use crate::provider::EtcdProvider;
pub use crate::stats::EtcdStats;
/// The client library, for [`EtcdProvider::from_client`] and [`EtcdProvider::client`].
pub use etcd_client;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["etcd", "etcds"];

pub(crate) const BACKEND: &str = "etcd";

/// The shortest lease this backend accepts. A hold lives as long as the provider's etcd
/// lease; the lock's own lease only bounds how long the client vouches for it between
/// checks, and each check is a server call.
pub const MIN_LEASE: Duration = Duration::from_millis(100);
