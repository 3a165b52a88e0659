//! A standalone ZooKeeper of the test's own, for the tests that stop a server or need its
//! settings.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dlock_conformance::eventually;

use super::{four_letter, java_dir, skip};

/// A standalone ZooKeeper on a free loopback port (Debian's jars); killed on drop. Its
/// container manager checks every 100 ms (the server's default: a minute), so a test sees
/// empty containers go.
pub(crate) struct PrivateZk {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateZk {
    /// Starts one, or returns `None` (skip) when the jars or `java` are missing and skipping is
    /// allowed.
    pub(crate) async fn start() -> Option<Self> {
        let missing = !java_dir().join("zookeeper.jar").exists()
            || Command::new("java")
                .arg("-version")
                .stderr(Stdio::null())
                .status()
                .is_err();
        if missing {
            skip("java or zookeeper.jar is missing", "java");
            return None;
        }
        let port = dlock_conformance::tls::free_port().expect("a free loopback port");
        let dir = std::env::temp_dir().join(format!("dlock-zk-test-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            port,
            dir,
            child: None,
        };
        server.spawn().await;
        Some(server)
    }

    /// Its URL, with `query` (`""`, or `?key=value...`).
    pub(crate) fn url(&self, query: &str) -> String {
        format!("zk://127.0.0.1:{}{query}", self.port)
    }

    /// Starts the server (again, on the same port and data) and waits until it answers.
    pub(crate) async fn spawn(&mut self) {
        let java_dir = java_dir();
        let classpath = [
            "zookeeper.jar",
            "zookeeper-jute.jar",
            "slf4j-api.jar",
            "slf4j-nop.jar",
        ]
        .iter()
        .map(|j| java_dir.join(j).display().to_string())
        .collect::<Vec<_>>()
        .join(":");
        let child = Command::new("java")
            .args(["-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", &classpath])
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg("-Dznode.container.checkIntervalMs=100")
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(self.port.to_string())
            .arg(&self.dir)
            .arg("2000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let host = format!("127.0.0.1:{}", self.port);
        eventually(
            Duration::from_secs(20),
            "private zookeeper answers",
            || async {
                // A server that is starting may accept and not answer: ask again.
                match four_letter(&host, "srvr", Duration::from_secs(1)).await {
                    Some(out) if out.contains("Zookeeper version") => Ok(()),
                    Some(out) => Err(out),
                    None => Err("refused, or no answer within 1 s".to_owned()),
                }
            },
        )
        .await;
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateZk {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
