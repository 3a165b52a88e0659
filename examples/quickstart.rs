//! Two tasks contend for one lock, each holding it in turn with a fresh fencing token; then a
//! hold with a fixed lease runs out and its guard reports the loss.
//!
//! ```text
//! cargo run --example quickstart                 # embedded default: a SQLite file
//! cargo run --example quickstart -- memory://    # or any URL dlock::connect takes
//! ```

use std::time::Duration;

use dlock::{Lease, LockOptions};

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DLOCK_URL").ok())
        .unwrap_or_else(dlock::default_url);
    let locks = dlock::connect(&url).await?;
    println!("store: {}", locks.store_id());

    // Two workers, each with its own handle (its own owner), take turns on one name.
    let mut workers = Vec::new();
    for worker in ["alice", "bob"] {
        let lock = locks.lock("quickstart/orders")?;
        workers.push(tokio::spawn(async move {
            for round in 1..=3 {
                let guard = lock.acquire().await?;
                println!(
                    "{worker:>5} holds the lock (round {round}), fencing token {}",
                    guard.fencing_token()
                );
                tokio::time::sleep(Duration::from_millis(20)).await; // the critical section
                guard.release().await?;
                tokio::time::sleep(Duration::from_millis(10)).await; // work outside the lock
            }
            Ok::<_, dlock::Error>(())
        }));
    }
    for worker in workers {
        worker
            .await
            .map_err(|e| dlock::Error::config(format!("worker panicked: {e}")))??;
    }

    // A fixed lease that is not extended ends, and the guard says so.
    let lease = Duration::from_millis(300);
    let lock = locks.lock_with(
        "quickstart/report",
        LockOptions::new().with_lease(Lease::Fixed(lease)),
    )?;
    let guard = lock.acquire().await?;
    println!(
        "carol holds quickstart/report with a {lease:?} fixed lease, token {}",
        guard.fencing_token()
    );
    tokio::select! {
        () = guard.lost() => println!("carol's hold was lost (lease ended): is_held() = {}", guard.is_held()),
        () = tokio::time::sleep(lease * 10) => println!("carol's hold was never reported lost"),
    }
    match guard.release().await {
        Err(dlock::Error::LockLost { name, .. }) => {
            println!("releasing it says: lock {name:?} was lost")
        }
        other => println!("releasing it says: {other:?}"),
    }
    Ok(())
}
