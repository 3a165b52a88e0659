//! SQL-specific tests against real databases (MariaDB, PostgreSQL, SQLite), by behaviour.
//!
//! Some holders and waiters are separate OS processes: this test binary run again
//! ([`separate_processes::worker_process`], which does nothing unless `DLOCK_WORKER` is
//! set), so the workers have their own pools.

#[path = "../support/mod.rs"]
mod support;

mod a_database_that_refuses_writes;
mod a_silent_database;
mod advisory_downgrades;
mod connection_bound_holds;
mod connections_and_pools;
mod fencing_tokens;
mod opening_and_tables;
mod release_notifications;
mod renewals;
mod separate_processes;
mod statements_on_the_wire;
