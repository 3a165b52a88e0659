//! ZooKeeper-specific tests against the server at `DLOCK_ZK_URL` (and, where a test needs
//! one, a private server or a Curator 5.4 peer), one module per behaviour. The rigs they share
//! are in `tests/support`.

#[path = "../support/mod.rs"]
mod support;

mod curator;
mod curator_sessions;
mod election;
mod kinds;
mod layout;
mod names;
mod read_write;
mod release;
mod renewals;
mod restart;
mod round_trips;
mod semaphore;
mod sessions;
mod silence;
