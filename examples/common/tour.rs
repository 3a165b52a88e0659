//! The tour `redis.rs`, `zookeeper.rs`, `mysql.rs`, `postgres.rs` and `etcd.rs` take: a mutex, what the store records,
//! two readers, a semaphore. Included by each with `#[path]`.

use std::time::Duration;

/// Connects to `url` and takes every primitive the backend has.
pub(crate) async fn tour(url: &str) -> dlock::Result<()> {
    let locks = dlock::connect(url).await?;
    println!("store {}", locks.store_id());
    let guard = locks.lock("examples/orders/42")?.acquire().await?;
    println!("mutex: token {}", guard.fencing_token());
    println!("status: {:?}", locks.describe("examples/orders/42").await?);
    guard.release().await?;
    let caps = locks.capabilities();
    if caps.read_write {
        let rw = locks.read_write_lock("examples/config")?;
        let r1 = rw.read().await?;
        let r2 = locks.read_write_lock("examples/config")?.read().await?;
        println!(
            "two readers share: tokens {} and {}",
            r1.fencing_token(),
            r2.fencing_token()
        );
        r1.release().await?;
        r2.release().await?;
    }
    if caps.semaphore {
        let slots = locks.semaphore("examples/gpu-slots", 2)?;
        let a = slots.acquire().await?;
        let b = slots.acquire().await?;
        let third = slots.try_acquire(Duration::from_millis(100)).await?;
        println!("semaphore of 2: a third permit? {}", third.is_some());
        a.release().await?;
        b.release().await?;
    }
    Ok(())
}
