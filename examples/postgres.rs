//! dlock on PostgreSQL: a mutex, a read-write lock (advisory strategy), and what the store
//! records.
//!
//! ```text
//! cargo run --example postgres --features postgres   # postgres://dlock:dlock@127.0.0.1/dlock_test
//! cargo run --example postgres --features postgres -- "postgres://u:p@host/db?strategy=for-update"
//! ```
//!
//! Server configuration that matters for safety (the `dlock-sql` docs say more): keep
//! `synchronous_commit` on so fencing tokens survive a crash; a `for-update` hold is an open
//! transaction that holds back `VACUUM` while it lasts (use `advisory` for long holds); the
//! pinned strategies need a session each, so not behind a transaction-mode pooler.

#[path = "common/tour.rs"]
mod tour;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| {
            std::env::var("DLOCK_POSTGRES_URL")
                .ok()
                .map(|u| format!("{u}?strategy=advisory&table=dlock_example"))
        })
        .unwrap_or_else(|| {
            "postgres://dlock:dlock@127.0.0.1:5432/dlock_test?strategy=advisory&table=dlock_example"
                .into()
        });
    tour::tour(&url).await
}
