//! A Curator 5.4 peer (`tests/java/CuratorPeer.java`), compiled once per test binary and run
//! as a child process that takes, holds and releases a lock, reporting on stdout.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use dlock_conformance::must;
use dlock_zookeeper::ZkConfig;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::{LIMIT, java_dir, skip};

/// The jars of Curator and its dependencies, under [`java_dir`].
const JARS: &[&str] = &[
    "curator-recipes.jar",
    "curator-framework.jar",
    "curator-client.jar",
    "guava.jar",
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
    "netty-handler.jar",
    "netty-transport.jar",
    "netty-common.jar",
    "netty-buffer.jar",
    "netty-resolver.jar",
    "netty-codec.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
];

/// Compiles `tests/java/CuratorPeer.java` once per test binary; `None` (skip) if `javac` or a
/// jar is missing, unless `DLOCK_TEST_REQUIRE` is `all` or names `curator`.
pub(crate) fn curator_classpath() -> Option<String> {
    static CLASSPATH: OnceLock<Option<String>> = OnceLock::new();
    CLASSPATH
        .get_or_init(|| {
            let cannot_run = |why: String| {
                skip(&format!("Curator interop cannot run: {why}"), "curator");
                None
            };
            let java_dir = java_dir();
            let mut jars = Vec::new();
            for jar in JARS {
                let p = java_dir.join(jar);
                if !p.exists() {
                    return cannot_run(format!("{} is missing", p.display()));
                }
                jars.push(p.display().to_string());
            }
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("curator-peer-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&out);
            std::fs::create_dir_all(&out).unwrap();
            let source =
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java/CuratorPeer.java");
            let jar_path = jars.join(":");
            let status = match std::process::Command::new("javac")
                .args(["-nowarn", "-cp", &jar_path, "-d"])
                .arg(&out)
                .arg(&source)
                .status()
            {
                Ok(s) => s,
                Err(e) => return cannot_run(format!("javac cannot run ({e})")),
            };
            assert!(status.success(), "javac failed on {}", source.display());
            Some(format!("{}:{jar_path}", out.display()))
        })
        .clone()
}

/// A running Curator peer.
pub(crate) struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Peer {
    /// Starts `java CuratorPeer <connect string of url> args...`.
    pub(crate) async fn start(url: &str, args: &[&str]) -> Self {
        let classpath = curator_classpath().unwrap();
        let config = ZkConfig::from_url(url).unwrap();
        let mut child = Command::new("java")
            .args([
                "-Xmx128m",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                &classpath,
                "CuratorPeer",
            ])
            .arg(config.connect_string())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// Waits for the next line the peer prints and checks it.
    pub(crate) async fn expect(&mut self, want: &str) {
        let line = must(
            Duration::from_secs(20),
            &format!("peer prints {want}"),
            self.lines.next_line(),
        )
        .await
        .unwrap();
        assert_eq!(
            line.as_deref(),
            Some(want),
            "the Curator peer said {line:?}"
        );
    }

    /// Checks the peer is still waiting: it says nothing (no ACQUIRED) for 300 ms. Called
    /// once its node is queued, so a peer that wrongly got in has every chance to say so.
    pub(crate) async fn still_waiting(&mut self, what: &str) {
        if let Ok(line) =
            tokio::time::timeout(Duration::from_millis(300), self.lines.next_line()).await
        {
            panic!("{what}: the Curator peer said {line:?} while it should still wait");
        }
    }

    /// Tells the peer to release, and waits until it has.
    pub(crate) async fn release(&mut self) {
        let mut stdin = self.stdin.take().unwrap();
        stdin.write_all(b"release\n").await.unwrap();
        drop(stdin);
        self.expect("RELEASED").await;
        self.finish().await;
    }

    /// Sends the peer process `signal` (`STOP`, `CONT`, `KILL`), as `kill -<signal>`.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("the peer runs").to_string();
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Kills the peer (SIGKILL, stopped or not) and waits until it is gone.
    pub(crate) async fn kill(&mut self) {
        self.signal("KILL");
        must(LIMIT, "the killed peer exits", self.child.wait())
            .await
            .unwrap();
    }

    /// Waits for the peer to exit, successfully.
    pub(crate) async fn finish(&mut self) {
        let status = must(LIMIT, "peer exits", self.child.wait()).await.unwrap();
        assert!(status.success(), "peer exited with {status}");
    }
}
