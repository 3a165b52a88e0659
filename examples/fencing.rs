//! Fencing: why a lock alone is not enough, and the write that makes it safe.
//!
//! A lock's holder can be paused (a GC pause, SIGSTOP, a VM migration) past its lease; the lock
//! then goes to someone else while the first holder still believes it holds it. Its late write
//! would overwrite the newer holder's. The cure is at the resource: every write carries the
//! fencing token of the hold it was made under, and the resource refuses a token that is not
//! above the last one it accepted. Here the "resource" is a row in a SQL table, updated with
//! `UPDATE ... WHERE fence < token`.
//!
//! ```text
//! cargo run --example fencing                  # on an in-process store
//! cargo run --example fencing -- sqlite:///tmp/locks.db
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::{FencingToken, Lease, LockOptions};

/// The protected resource: a value and the highest token a write was accepted with. A real
/// one is a table (`UPDATE t SET value = ?, fence = ? WHERE id = ? AND fence < ?`), an object
/// store with a conditional write, or a service that checks the token.
#[derive(Debug, Default)]
struct Resource {
    value: String,
    fence: u64,
}

impl Resource {
    /// Accepts the write only if `token` is newer than every token seen before.
    fn write(&mut self, token: FencingToken, value: &str) -> Result<(), String> {
        if token.get() <= self.fence {
            return Err(format!(
                "stale token {token} (the resource has seen {})",
                self.fence
            ));
        }
        self.fence = token.get();
        self.value = value.to_owned();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    let locks = dlock::connect(&url).await?;
    let resource = Arc::new(Mutex::new(Resource::default()));

    // The slow holder: a short fixed lease stands in for a holder whose renewals stopped.
    let slow = locks.lock_with(
        "fencing/report",
        LockOptions::new().with_lease(Lease::Fixed(Duration::from_millis(200))),
    )?;
    let first = slow.acquire().await?;
    let first_token = first.fencing_token();
    println!("slow holder: token {first_token}, now 'paused' past its lease");
    first.lost().await;
    println!(
        "slow holder: its guard says the hold is lost ({:?})",
        first.loss_reason()
    );

    // Meanwhile someone else takes the lock and writes.
    let fast = locks.lock("fencing/report")?;
    let second = fast.acquire().await?;
    let second_token = second.fencing_token();
    let wrote = resource.lock().unwrap().write(second_token, "fresh report");
    println!("fast holder: token {second_token}, write: {wrote:?}");

    // The slow holder wakes up and, not having watched lost(), writes anyway: refused.
    let late = resource.lock().unwrap().write(first_token, "stale report");
    println!("slow holder's late write with token {first_token}: {late:?}");
    assert!(late.is_err(), "the resource must refuse the stale token");
    second.release().await?;

    let r = resource.lock().unwrap();
    println!("resource: {:?} written with token {}", r.value, r.fence);
    Ok(())
}
