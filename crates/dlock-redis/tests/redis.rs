//! Redis-specific tests against real servers, one module per behaviour: Redisson's layout and
//! Java clients beside dlock, how waiters are woken, which names and kinds are refused, faults
//! (killed connections, deleted keys, restarts), replies lost in flight, replicas and Sentinel
//! failover, a store that does not answer, and how a provider connects.
//!
//! Tests on the shared server use `DLOCK_REDIS_URL` (and `DLOCK_REDIS_CLUSTER_URL`,
//! `DLOCK_REDIS_SENTINEL_URL`). Tests that kill connections, restart or pause the server or
//! count commands each start a private `redis-server` on a free loopback port (the rigs in
//! `support/`), so they cannot disturb (or be disturbed by) anything else.

mod support;

#[path = "redis/connecting.rs"]
mod connecting;
#[path = "redis/faults.rs"]
mod faults;
#[path = "redis/interop.rs"]
mod interop;
#[path = "redis/lost_replies.rs"]
mod lost_replies;
#[path = "redis/names_and_kinds.rs"]
mod names_and_kinds;
#[path = "redis/renewals.rs"]
mod renewals;
#[path = "redis/replication.rs"]
mod replication;
#[path = "redis/unanswered.rs"]
mod unanswered;
#[path = "redis/wakeups.rs"]
mod wakeups;
