//! What the core's tests share: a hold that a store always keeps, and a grant of it.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Hold, NewHold, Request};
use dlock_core::{FencingToken, LockGuard, LockKind, Result, async_trait};
use tokio::time::Instant;

/// A hold whose release and renewals always work.
#[derive(Debug)]
pub(crate) struct Yes;

#[async_trait]
impl Hold for Yes {
    async fn release(&self) -> Result<()> {
        Ok(())
    }
    async fn extend(&self, _: Duration) -> Result<()> {
        Ok(())
    }
}

/// The guard of a mutex hold of `req` granted now, with fencing token `token`.
pub(crate) fn granted(req: &Request<'_>, token: u64) -> LockGuard {
    LockGuard::new(NewHold::new(
        "test",
        LockKind::Mutex,
        req.name.clone(),
        FencingToken::new(token),
        req.options.lease,
        Instant::now(),
        Arc::new(Yes),
    ))
}
