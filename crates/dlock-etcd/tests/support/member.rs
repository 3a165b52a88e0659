//! A private etcd member of a test's own (Debian's etcd, as `scripts/services` runs it), for
//! what a test may not do to the shared ones: turn authentication on, serve TLS only, fill
//! its database.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use dlock_conformance::eventually;
use dlock_conformance::tls::free_port;
use dlock_etcd::etcd_client::Client;
use tokio::process::{Child, Command};

/// A private etcd member on loopback ports nobody uses, killed and its data deleted when
/// dropped.
pub(crate) struct PrivateMember {
    dir: PathBuf,
    port: u16,
    peer: u16,
    tls: bool,
    args: Vec<String>,
    child: Option<Child>,
}

impl PrivateMember {
    /// A member serving plain `etcd://` on a fresh data directory under the temporary
    /// directory; `args` may name files in it as `{dir}`, and `prepare` writes them before
    /// the member starts.
    pub(crate) fn start(tag: &str, args: &[&str], prepare: impl FnOnce(&Path)) -> Self {
        Self::launch(tag, false, args, prepare)
    }

    /// As [`start`](Self::start), serving TLS only (`etcds://`): `args` name its
    /// certificates.
    pub(crate) fn start_tls(tag: &str, args: &[&str], prepare: impl FnOnce(&Path)) -> Self {
        Self::launch(tag, true, args, prepare)
    }

    fn launch(tag: &str, tls: bool, args: &[&str], prepare: impl FnOnce(&Path)) -> Self {
        let dir = std::env::temp_dir().join(format!("dlock-etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        prepare(&dir);
        let args = args
            .iter()
            .map(|a| a.replace("{dir}", &dir.display().to_string()))
            .collect();
        let mut m = Self {
            dir,
            port: free_port().expect("a free loopback port"),
            peer: free_port().expect("a free loopback port"),
            tls,
            args,
            child: None,
        };
        m.run();
        m
    }

    /// Starts the member on its data.
    fn run(&mut self) {
        let (port, peer) = (self.port, self.peer);
        let scheme = if self.tls { "https" } else { "http" };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .args(["--name", "private"])
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={scheme}://127.0.0.1:{port}"))
            .arg(format!(
                "--advertise-client-urls={scheme}://127.0.0.1:{port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=private=http://127.0.0.1:{peer}"))
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("etcd runs");
        self.child = Some(child);
    }

    /// The member's client address, `127.0.0.1:{port}`.
    pub(crate) fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The path of `file` in the member's directory.
    pub(crate) fn file(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// Waits until the member answers a status call (over plain `etcd://`).
    pub(crate) async fn await_serving(&self) {
        eventually(Duration::from_secs(30), "the private member serves", || {
            let e = self.endpoint();
            async move {
                Client::connect([e], None)
                    .await
                    .map_err(|e| e.to_string())?
                    .status()
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
        .await;
    }

    /// Runs `etcdctl` against the member; it must succeed.
    pub(crate) async fn etcdctl(&self, args: &[&str]) {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(args)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateMember {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
