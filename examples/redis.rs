//! dlock on Redis: a mutex, a read-write lock, a semaphore, and what the store records.
//!
//! ```text
//! cargo run --example redis --features redis           # redis://127.0.0.1:6379
//! cargo run --example redis --features redis -- redis://host:6379/0
//! ```
//!
//! Server configuration that matters for safety (the `dlock-redis` docs say more): persistence
//! (AOF with `appendfsync always`) keeps holds and fencing tokens across restarts;
//! `maxmemory-policy` must never evict lock keys (`noeviction`); asynchronous replicas can lose
//! a hold at failover (`?wait_replicas=N` narrows it).

#[path = "common/tour.rs"]
mod tour;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DLOCK_REDIS_URL").ok())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    tour::tour(&url).await
}
