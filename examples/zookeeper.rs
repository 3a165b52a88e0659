//! dlock on ZooKeeper: a mutex, a read-write lock, a semaphore, and what the store records.
//!
//! ```text
//! cargo run --example zookeeper --features zookeeper   # zk://127.0.0.1:2181
//! cargo run --example zookeeper --features zookeeper -- zk://h1:2181,h2:2181/chroot
//! ```
//!
//! Server configuration that matters for safety (the `dlock-zookeeper` docs say more): the
//! session timeout (`?session_timeout_ms=`) is how long a paused or partitioned holder keeps
//! the lock; pick it above your longest expected pause and below what your waiters can
//! tolerate, within the server's `minSessionTimeout`/`maxSessionTimeout`.

#[path = "common/tour.rs"]
mod tour;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DLOCK_ZK_URL").ok())
        .unwrap_or_else(|| "zk://127.0.0.1:2181".into());
    tour::tour(&url).await
}
