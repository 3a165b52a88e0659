//! etcd beyond the conformance suite, against real servers from
//! `scripts/services up etcd etcd-cluster` (and private members of the tests' own), one
//! module per behaviour: interop with `etcdctl lock` and `etcdctl elect` (and with both
//! through a leader kill), releasing, the time limit on calls, a
//! silent network, a frozen holder process, the leader killed, connecting with TLS and
//! authentication, and a full database. The rigs they share are in `tests/support`.

#[path = "../support/mod.rs"]
mod support;

mod a_dead_member;
mod connecting;
mod election;
mod failover;
mod frozen;
mod full_database;
mod interop;
mod lease_end;
mod peers_through_a_leader_kill;
mod release;
mod renewals;
mod silence;
mod time_limits;
