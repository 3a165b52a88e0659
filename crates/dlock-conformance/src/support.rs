//! Helpers for cases: fresh names, bounded waits, bounded polls.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Fresh lock names under a namespace no other case (or run) uses.
#[derive(Debug, Clone)]
pub struct Names {
    prefix: String,
}

impl Names {
    /// A fresh namespace.
    pub fn new() -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Self {
            prefix: format!("dlock-test/{}/", &id[..12]),
        }
    }

    /// The name `suffix` in this namespace.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// The namespace prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl Default for Names {
    fn default() -> Self {
        Self::new()
    }
}

/// Awaits `fut`, failing the case with `what` if it takes longer than `limit`.
pub async fn must<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not complete within {limit:?}"),
    }
}

/// How long past its limit the check running at the limit may take before it counts as hung.
const CHECK_GRACE: Duration = Duration::from_secs(10);

/// Polls `check` until it returns `Ok`, every 10 ms (doubling to at most 200 ms), failing the
/// case with `what` and the last value seen if `limit` passes first. A check that hangs is cut
/// off 10 s after the limit (and fails the case): a probe of a server that accepted
/// the connection and never answered once hung CI for good.
pub async fn eventually<T, V, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    V: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, V>>,
{
    let deadline = dlock_core::backend::from_now(limit);
    let mut pause = Duration::from_millis(10);
    // A check that started in time may finish a little late (a slow call on a loaded machine);
    // one that does not return at all is cut off, so a hang fails the case.
    let cut_off = dlock_core::backend::later(deadline, CHECK_GRACE);
    loop {
        let last = match tokio::time::timeout_at(cut_off, check()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(last)) => last,
            Err(_) => panic!(
                "{what}: not true within {limit:?}; the last check did not return within \
                 {CHECK_GRACE:?} more"
            ),
        };
        if Instant::now() >= deadline {
            panic!("{what}: not true within {limit:?}; last seen: {last:?}");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}
