#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

// The provider and what its handles share.
mod config;
mod conn;
mod error;
mod holds;
mod provider;
mod pubsub;

// The primitives, one engine under them, and the scripts and keys they use.
mod acquire;
mod call;
mod hold;
mod keys;
mod mutex;
mod primitive;
mod rwlock;
mod scripts;
mod semaphore;

pub use crate::config::{
    DEFAULT_FAIR_WAIT, DEFAULT_SENTINEL_PORT, PubSubMode, RedisConfig, SentinelConfig,
};
pub use crate::provider::{MIN_LEASE, RedisProvider, SCHEMES};

#[doc(hidden)]
pub use crate::mutex::raw;
