//! Failover on a 3-server ensemble (`DLOCK_ZK_ENSEMBLE_URL`, started by
//! `scripts/services up zk-ensemble`), while 4 contenders fight over one mutex:
//! - the leader is killed (SIGKILL): the sessions outlive the election;
//! - the leader and a follower are killed, so the quorum is gone for longer than the session
//!   timeout: every session expires while no leader is elected.
//!
//! Mutual exclusion holds throughout (holds reported lost included, up to when their owner
//! learned of the loss), fencing tokens keep growing across the new leader's epoch, and the
//! contenders go on after the election. The killed servers are restarted with
//! `scripts/services up zk-ensemble` (also when the test fails). The two cases take turns.

mod support;

use std::time::Duration;

use dlock_conformance::contention::Contention;
use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{DynLock, Error, LockOptions, LockProvider};
use dlock_zookeeper::{ZkConfig, ZkProvider};
use tokio::time::Instant;

use crate::support::ensemble::{Restore, a_leader_among, kill_server, modes, port_of, server_pid};

const CONTENDERS: usize = 4;
/// Long enough that the sessions outlive the election, short enough to matter.
const SESSION_TIMEOUT_MS: u64 = 8000;
/// The sessions of the quorum-loss case: short, so that they expire during the outage.
const SHORT_SESSION_TIMEOUT_MS: u64 = 4000;

/// The two cases kill servers of one ensemble: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the case does to the ensemble.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGKILL the leader; two servers stay, a quorum.
    KillLeader,
    /// SIGKILL the leader and a follower; the one left has no quorum until they are back,
    /// which is after every session timed out.
    LoseQuorum,
}
/// Contention before the kill, and after the new leader is in place.
const BEFORE_KILL: Duration = Duration::from_secs(2);
const AFTER_FAILOVER: Duration = Duration::from_secs(3);
/// Acquisitions every contender must make once the new leader serves.
const PROGRESS_AFTER: usize = 3;

/// Kill the leader under contention: no two holders at once, tokens strictly increasing,
/// progress after the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_during_contention() {
    run(Fault::KillLeader).await;
}

/// The quorum is lost for longer than the session timeout, so every session expires during
/// the election (the client gives its session up once it has heard nothing for the timeout).
/// A holder of another name is told its hold is lost (SessionTimedOut, at its session's
/// horizon) before the ensemble is back; once it is, a new session takes that name (the old
/// session's node goes when the new leader expires it), no two holders overlap, tokens only
/// grow, and every contender acquires again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_lost_past_the_session_timeout() {
    run(Fault::LoseQuorum).await;
}

async fn run(fault: Fault) {
    let Some(url) = service_url("DLOCK_ZK_ENSEMBLE_URL") else {
        eprintln!("(the ensemble is optional: `eval \"$(scripts/services up zk-ensemble)\"`)");
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    // Each step below is bounded too; this bounds their sum. On a timeout the scenario is
    // dropped, and its `Restore` brings the killed servers back.
    // The sum of the steps' own bounds (JVM restarts, the election, progress, stopping, the
    // expired session's node) stays below it.
    must(
        Duration::from_secs(150),
        "the failover scenario",
        failover(url, fault),
    )
    .await;
}

async fn failover(url: String, fault: Fault) {
    let config = ZkConfig::from_url(&url).unwrap();
    let hosts = config.hosts.clone();
    assert!(
        hosts.len() >= 3,
        "DLOCK_ZK_ENSEMBLE_URL names {} servers: {url}",
        hosts.len()
    );

    // The ensemble is whole (one leader), and we can kill its servers.
    let leader = eventually(Duration::from_secs(10), "the ensemble has a leader", || {
        let hosts = hosts.clone();
        async move {
            let m = modes(&hosts).await;
            let leaders: Vec<usize> = (0..m.len())
                .filter(|i| m[*i].as_deref() == Some("leader"))
                .collect();
            let followers = m
                .iter()
                .filter(|m| m.as_deref() == Some("follower"))
                .count();
            if leaders.len() == 1 && followers == hosts.len() - 1 {
                Ok(hosts[leaders[0]].clone())
            } else {
                Err(m)
            }
        }
    })
    .await;
    let leader_port = port_of(&leader).to_owned();
    let Some(leader_pid) = server_pid(&leader_port) else {
        support::skip(
            &format!(
                "the leader on {leader} was not started by scripts/services (no pid file or \
                 process for zk-ensemble/{leader_port}), so it cannot be killed"
            ),
            "zk_ensemble",
        );
        return;
    };

    let sep = if url.contains('?') { '&' } else { '?' };
    let session_timeout_ms = match fault {
        Fault::KillLeader => SESSION_TIMEOUT_MS,
        Fault::LoseQuorum => SHORT_SESSION_TIMEOUT_MS,
    };
    let contender_url = if url.contains("session_timeout_ms") {
        url.clone()
    } else {
        format!("{url}{sep}session_timeout_ms={session_timeout_ms}")
    };
    let session_timeout = ZkConfig::from_url(&contender_url).unwrap().session_timeout;
    let name = Names::new().name("failover");
    let mut providers = Vec::new();
    let mut locks: Vec<DynLock> = Vec::new();
    for _ in 0..CONTENDERS {
        let p = must(
            Duration::from_secs(10),
            "connect",
            ZkProvider::connect(&contender_url),
        )
        .await
        .unwrap();
        locks.push(p.lock(&name, LockOptions::default()).unwrap());
        providers.push(p);
    }
    let diagnose = || diagnose(&providers, &name);

    // Contention runs: every contender gets in a few times.
    let run = Contention::start(locks);
    let t0 = Instant::now();
    run.await_progress(
        t0,
        PROGRESS_AFTER,
        Duration::from_secs(5),
        "all contenders get in",
        diagnose,
    )
    .await;
    tokio::time::sleep(BEFORE_KILL.saturating_sub(t0.elapsed())).await;

    // In the quorum-loss case, a holder of a name of its own, to be told of the expiry.
    let long = Names::new().name("expiring");
    let long_holder = match fault {
        Fault::KillLeader => None,
        Fault::LoseQuorum => {
            let p = ZkProvider::connect(&contender_url).await.unwrap();
            let g = p
                .lock(&long, LockOptions::default())
                .unwrap()
                .acquire()
                .await
                .unwrap();
            Some((p, g))
        }
    };

    // SIGKILL the leader (and a follower); from here on, the ensemble is restored however the
    // test ends.
    let mut restore = Some(Restore::armed());
    let killed_at = Instant::now();
    kill_server(&leader, leader_pid).await;
    let others: Vec<String> = hosts.iter().filter(|h| **h != leader).cloned().collect();
    let new_leader = match fault {
        Fault::KillLeader => a_leader_among(&others, "the survivors elect a new leader").await,
        Fault::LoseQuorum => {
            let follower = others[0].clone();
            let follower_pid = server_pid(port_of(&follower)).unwrap_or_else(|| {
                panic!("the follower on {follower} was not started by scripts/services")
            });
            kill_server(&follower, follower_pid).await;
            // The quorum is gone. The holder hears nothing, and is told its hold is lost at
            // its session's horizon (before the client gives the session up), while no
            // leader is there to expire the session on the server's side.
            let (_, g) = long_holder.as_ref().unwrap();
            must(
                session_timeout.saturating_mul(2),
                "the holder is told its session may have expired",
                g.lost(),
            )
            .await;
            assert_eq!(
                g.loss_reason(),
                Some(dlock_core::LossReason::SessionTimedOut),
                "the long hold's loss"
            );
            restore.take().unwrap().now();
            a_leader_among(&hosts, "the restarted servers elect a leader").await
        }
    };
    let elected_at = Instant::now();
    eprintln!(
        "{fault:?}: killed the leader {leader} (pid {leader_pid}); {new_leader} leads after {:?}",
        elected_at - killed_at
    );

    // Contention goes on under the new leader: every contender gets in again.
    run.await_progress(
        elected_at,
        PROGRESS_AFTER,
        Duration::from_secs(15),
        "every contender acquires after the failover",
        diagnose,
    )
    .await;
    tokio::time::sleep(AFTER_FAILOVER.saturating_sub(elected_at.elapsed())).await;
    let report = run.stop(Duration::from_secs(12)).await;

    // Bring the killed server back (and check the ensemble is whole again).
    if let Some(restore) = restore {
        restore.now();
    }
    eventually(
        Duration::from_secs(10),
        "the restarted server serves",
        || {
            let hosts = hosts.clone();
            async move {
                let m = modes(&hosts).await;
                if m.iter().all(Option::is_some) {
                    Ok(())
                } else {
                    Err(m)
                }
            }
        },
    )
    .await;

    // The expired session's node is gone once the new leader expired that session (within
    // its timeout): the name is free for a new session.
    if let Some((p, g)) = long_holder {
        let other = ZkProvider::connect(&contender_url).await.unwrap();
        let taken = must(
            session_timeout.saturating_mul(3),
            "the expired holder's name is free again",
            other.lock(&long, LockOptions::default()).unwrap().acquire(),
        )
        .await
        .unwrap();
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        taken.release().await.unwrap();
        drop(p);
    }

    // ---------------------------------------------------------------- checks
    let records = &report.records;
    let during = records
        .iter()
        .filter(|r| r.start > killed_at && r.start <= elected_at)
        .count();
    report.print(&format!(
        "{fault:?}: {during} acquisitions during the election, {} after it",
        report.after(elected_at)
    ));
    // Unique tokens growing in the order the contenders got in, and never two holders at
    // once (lost holds included, up to when their owner was told).
    report.check();
    // Every acquisition made a new node; the new leader's zxids are from a later epoch.
    let first = report.in_order()[0].token;
    assert!(
        records.iter().any(|r| r.start < killed_at)
            && records
                .iter()
                .any(|r| r.start > elected_at && r.token >> 32 > first >> 32),
        "acquisitions after the failover carry tokens of the new leader's epoch"
    );
    assert!(
        report.after(elected_at) >= CONTENDERS * PROGRESS_AFTER,
        "progress after the failover"
    );
}

/// The lock's contender nodes and their owners, and each contender's session and holds.
async fn diagnose(providers: &[ZkProvider], name: &str) -> String {
    let p = &providers[0];
    let path = p.lock_path(name).unwrap();
    let client = p.client();
    let mut out = format!("path {path}:");
    match client.list_children(&path).await {
        Ok(children) => {
            for c in children {
                let owner = match client.check_stat(&format!("{path}/{c}")).await {
                    Ok(Some(stat)) => format!("{:#x}", stat.ephemeral_owner),
                    other => format!("{other:?}"),
                };
                out += &format!(" {c} (owner {owner})");
            }
        }
        Err(e) => out += &format!(" list failed: {e}"),
    }
    for (i, p) in providers.iter().enumerate() {
        out += &format!(
            "; contender {i}: session {:#x}, {} live holds, {:?}",
            p.session_id(),
            p.live_holds(),
            p.stats()
        );
    }
    out
}
