//! dlock on etcd: a mutex, and what the store records (its keys are those of `etcdctl lock`).
//!
//! ```text
//! cargo run --example etcd --features etcd   # etcd://127.0.0.1:2379
//! cargo run --example etcd --features etcd -- etcd://h1:2379,h2:2379,h3:2379/app?ttl_s=10
//! ```
//!
//! Configuration that matters for safety (the `dlock-etcd` docs say more): the lease
//! time-to-live (`?ttl_s=`, 10 s by default) is how long a paused or cut-off holder keeps the
//! lock; give every member of the cluster, so that calls go to those that answer.

#[path = "common/tour.rs"]
mod tour;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DLOCK_ETCD_URL").ok())
        .unwrap_or_else(|| "etcd://127.0.0.1:2379".into());
    tour::tour(&url).await
}
