//! One acquisition by one owner, as the strategies and the pinned connections take it.

use std::time::Duration;

use dlock_core::{Lease, LockName};

use crate::Inner;

/// How long even a zero-wait attempt may take to get a connection from the pool.
pub(crate) const CONNECT_GRACE: Duration = Duration::from_secs(1);

/// One acquisition by one owner.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub(crate) name: LockName,
    pub(crate) owner: String,
    pub(crate) lease: Lease,
}

impl Attempt {
    /// An acquisition of `name` by a new owner of `inner`.
    pub(crate) fn new(inner: &Inner, name: &LockName, lease: Lease) -> Self {
        Self {
            name: name.clone(),
            owner: inner.next_owner(),
            lease,
        }
    }

    /// The name as the tables store it.
    pub(crate) fn key(&self) -> &[u8] {
        self.name.as_str().as_bytes()
    }

    /// The lease's length.
    pub(crate) fn ttl(&self) -> Duration {
        self.lease.ttl()
    }
}
