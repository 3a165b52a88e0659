#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

// The ground: the backend's constants, its configuration, errors, keys and scripts.
mod config;
mod consts;
mod error;
mod keys;
mod scripts;

// A script call, the two connections it goes through, the live holds, and what the handles of
// one provider share.
mod call;
mod conn;
mod holds;
mod pubsub;
mod replicas;
mod sentinel;
mod shared;

// The primitives: what differs between them, one hold and one wait loop under them all.
mod acquire;
mod election;
mod hold;
mod mutex;
mod primitive;
mod rwlock;
mod semaphore;

// The provider, which builds the primitives.
mod provider;

pub use crate::config::{
    DEFAULT_FAIR_WAIT, DEFAULT_SENTINEL_PORT, PubSubMode, RedisConfig, SentinelConfig,
    WAIT_TIMEOUT, WaitReplicas,
};
pub use crate::consts::{MIN_LEASE, SCHEMES};
pub use crate::election::{RedisElection, RedisProposals};
pub use crate::provider::RedisProvider;

#[doc(hidden)]
pub use crate::mutex::raw;
