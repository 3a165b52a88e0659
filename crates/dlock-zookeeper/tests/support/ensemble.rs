//! The ensemble `scripts/services up zk-ensemble` started (`DLOCK_ZK_ENSEMBLE_URL`): the mode
//! of each server, the pid of each, killing one, and putting the ensemble back.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use dlock_conformance::eventually;

use super::four_letter;

/// Sends `srvr` to `host` and returns the `Mode:` it reports (`None` if it does not serve).
pub(crate) async fn mode(host: &str) -> Option<String> {
    four_letter(host, "srvr", Duration::from_secs(3))
        .await?
        .lines()
        .find_map(|l| l.strip_prefix("Mode:"))
        .map(|m| m.trim().to_owned())
}

/// The modes of all servers, in `hosts` order.
pub(crate) async fn modes(hosts: &[String]) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for h in hosts {
        out.push(mode(h).await);
    }
    out
}

/// The port of `host:port`.
pub(crate) fn port_of(host: &str) -> &str {
    host.rsplit(':').next().unwrap_or(host)
}

/// Whether process `pid` runs the zk-ensemble server of `port` (its command line names the
/// config `scripts/services` wrote for that port).
fn runs_server(pid: u32, port: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'));
    !zombie
        && String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .contains(&format!("zk-ensemble/{port}/zoo.cfg"))
}

/// The pid of the server `scripts/services` started for client port `port`: from its pid file
/// `<state dir>/zk-ensemble/<port>/zk.pid`, else by its config path (`pgrep -f`).
pub(crate) fn server_pid(port: &str) -> Option<u32> {
    let state_dir = std::env::var_os("DLOCK_SERVICES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("dlock-services"));
    let pidfile = state_dir.join(format!("zk-ensemble/{port}/zk.pid"));
    let from_file = std::fs::read_to_string(pidfile)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|pid| runs_server(*pid, port));
    from_file.or_else(|| {
        let out = Command::new("pgrep")
            .args(["-f", &format!("zk-ensemble/{port}/zoo.cfg")])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .find(|pid| runs_server(*pid, port))
    })
}

/// Restores the ensemble with `scripts/services up zk-ensemble` when dropped, so a failing
/// test leaves it whole too.
pub(crate) struct Restore {
    armed: bool,
}

impl Restore {
    /// A restore that runs when dropped.
    pub(crate) fn armed() -> Self {
        Self { armed: true }
    }

    fn run() -> Result<(), String> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = Command::new(root.join("scripts/services"))
            .args(["up", "zk-ensemble"])
            .current_dir(&root)
            .env("DLOCK_SERVICES_TIMEOUT", "20")
            .output()
            .map_err(|e| format!("cannot run scripts/services: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "scripts/services up zk-ensemble failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Restores the ensemble now (and not again on drop); panics if it cannot.
    pub(crate) fn now(mut self) {
        self.armed = false;
        if let Err(e) = Self::run() {
            panic!("{e}");
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = Self::run()
        {
            eprintln!("{e}");
        }
    }
}

/// Sends SIGKILL to `pid` and waits until `host` no longer accepts connections.
pub(crate) async fn kill_server(host: &str, pid: u32) {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -KILL {pid} failed");
    eventually(Duration::from_secs(5), "the killed server is gone", || {
        let host = host.to_owned();
        async move {
            match tokio::net::TcpStream::connect(&host).await {
                Err(_) => Ok(()),
                Ok(_) => Err("still accepting connections"),
            }
        }
    })
    .await;
}

/// Waits until one of `hosts` leads, and returns it.
pub(crate) async fn a_leader_among(hosts: &[String], what: &str) -> String {
    eventually(Duration::from_secs(20), what, || {
        let hosts = hosts.to_vec();
        async move {
            let m = modes(&hosts).await;
            match m.iter().position(|m| m.as_deref() == Some("leader")) {
                Some(i) => Ok(hosts[i].clone()),
                None => Err(m),
            }
        }
    })
    .await
}
