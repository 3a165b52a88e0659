//! dlock on MySQL or MariaDB: a mutex, a read-write lock, a semaphore, and what the store records.
//!
//! ```text
//! cargo run --example mysql --features mysql           # mysql://dlock:dlock@127.0.0.1/dlock_test
//! cargo run --example mysql --features mysql -- "mysql://u:p@host/db?strategy=for-update"
//! ```
//!
//! Server configuration that matters for safety (the `dlock-sql` docs say more):
//! `innodb_flush_log_at_trx_commit=1` keeps fencing tokens durable; `for-update` pins one
//! connection per held or waiting lock, so size `?pool=` and `max_connections` for it; a
//! Galera cluster gives no cluster-wide row locks.

#[path = "common/tour.rs"]
mod tour;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DLOCK_MYSQL_URL").ok())
        .unwrap_or_else(|| "mysql://dlock:dlock@127.0.0.1:3306/dlock_test".into());
    tour::tour(&url).await
}
