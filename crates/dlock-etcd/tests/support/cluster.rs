//! The 3-member cluster of `scripts/services` (`DLOCK_ETCD_CLUSTER_URL`), for a test that
//! kills a member: which member leads, its process, and the cluster brought back whole.

use std::path::PathBuf;
use std::time::Duration;

use dlock_conformance::eventually;
use dlock_etcd::etcd_client::Client;
use tokio::time::Instant;

/// The pid `scripts/services` recorded for the cluster member with client port `port`, if
/// that process still runs that member (its command line names the member's data dir).
pub(crate) fn member_pid(port: &str) -> Option<u32> {
    let state_dir = std::env::var_os("DLOCK_SERVICES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("dlock-services"));
    let pid: u32 = std::fs::read_to_string(state_dir.join(format!("etcd/{port}/etcd.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains(&format!("etcd/{port}/data"))
        .then_some(pid)
}

/// Which of `endpoints` leads, asking each member itself.
pub(crate) async fn leader_among(endpoints: &[String]) -> Result<String, String> {
    let mut seen = Vec::new();
    for e in endpoints {
        let status = async {
            let mut c = Client::connect([e.as_str()], None).await.ok()?;
            tokio::time::timeout(Duration::from_secs(2), c.status())
                .await
                .ok()?
                .ok()
        }
        .await;
        match status {
            Some(s) if s.header().map(|h| h.member_id()) == Some(s.leader()) => {
                return Ok(e.clone());
            }
            Some(_) => seen.push(format!("{e}: follower")),
            None => seen.push(format!("{e}: no answer")),
        }
    }
    Err(seen.join(", "))
}

/// Brings the cluster back whole (`scripts/services up etcd-cluster` restarts a member that
/// is down) when dropped, so a failing test leaves it whole too.
pub(crate) struct Restore;

impl Restore {
    fn run() -> Result<(), String> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = std::process::Command::new(root.join("scripts/services"))
            .args(["up", "etcd-cluster"])
            .current_dir(&root)
            .env("DLOCK_SERVICES_TIMEOUT", "30")
            .output()
            .map_err(|e| format!("cannot run scripts/services: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "scripts/services up etcd-cluster failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Err(e) = Self::run() {
            eprintln!("{e}");
        }
    }
}

/// The cluster of `DLOCK_ETCD_CLUSTER_URL`, for a test that kills its leader: taken for the
/// test alone ([`SERIAL`](super::SERIAL)), with the member that leads it and its process.
pub(crate) struct ToKill {
    pub(crate) url: String,
    pub(crate) endpoints: Vec<String>,
    leader: String,
    pid: u32,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl ToKill {
    /// The cluster and its leader; `None` (the test skips, and says so) if the URL is not
    /// set or `scripts/services` did not start the leader, which `DLOCK_TEST_REQUIRE` forbids.
    pub(crate) async fn find() -> Option<Self> {
        let url = dlock_conformance::service_url("DLOCK_ETCD_CLUSTER_URL")?;
        let serial = super::SERIAL.lock().await;
        let endpoints = dlock_etcd::EtcdConfig::from_url(&url).ok()?.endpoints;
        assert!(endpoints.len() >= 3, "{url} names fewer than 3 members");
        let leader = eventually(Duration::from_secs(10), "the cluster has a leader", || {
            leader_among(&endpoints)
        })
        .await;
        let port = leader.rsplit(':').next().unwrap_or_default().to_owned();
        let Some(pid) = member_pid(&port) else {
            let require = std::env::var("DLOCK_TEST_REQUIRE").unwrap_or_default();
            let why = format!(
                "the leader {leader} was not started by scripts/services (no \
                 etcd/{port}/etcd.pid), so it cannot be killed"
            );
            // Servers that compose started (`DLOCK_SERVICES=compose scripts/test`) are not
            // ours to kill.
            let compose = std::env::var("DLOCK_TEST_SERVERS").as_deref() == Ok("compose");
            assert!(
                require.is_empty() || compose,
                "{why}, but DLOCK_TEST_REQUIRE={require} forbids skipping"
            );
            eprintln!("skipped: {why}");
            return None;
        };
        Some(Self {
            url,
            endpoints,
            leader,
            pid,
            _serial: serial,
        })
    }

    /// Kills the leader (SIGKILL) and waits until the other members elect one.
    pub(crate) async fn kill_the_leader(&self) -> Killed {
        kill_and_elect(&self.endpoints, &self.leader, self.pid).await
    }
}

/// A leader killed by [`ToKill::kill_the_leader`]: the cluster is made whole again when it
/// is dropped.
pub(crate) struct Killed {
    /// When the leader was killed.
    pub(crate) at: Instant,
    /// When the other members were found led again.
    pub(crate) elected_at: Instant,
    /// The endpoints of the members that live.
    pub(crate) survivors: Vec<String>,
    _restore: Restore,
}

/// Kills the leading member `leader` (process `pid`) of the cluster of `endpoints` with
/// SIGKILL and waits until the others elect a leader.
async fn kill_and_elect(endpoints: &[String], leader: &str, pid: u32) -> Killed {
    let restore = Restore;
    let at = Instant::now();
    let ok = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -KILL {pid}");
    let others: Vec<String> = endpoints.iter().filter(|e| *e != leader).cloned().collect();
    let new_leader = eventually(
        Duration::from_secs(20),
        "the survivors elect a leader",
        || leader_among(&others),
    )
    .await;
    let elected_at = Instant::now();
    eprintln!(
        "killed the leader {leader} (pid {pid}); {new_leader} leads after {:?}",
        elected_at - at
    );
    Killed {
        at,
        elected_at,
        survivors: others,
        _restore: restore,
    }
}
