//! The `curator (java)` target: workloads W1-W4 through Apache Curator's `InterProcessMutex`,
//! and W1S through its `InterProcessSemaphoreV2`, against the same ZooKeeper, for comparison
//! with the `zk` rows of the same run.
//!
//! A small Java program (`CuratorBench.java`, embedded here) is compiled with `javac` at bench
//! time against the Curator 5.x jars in `DLOCK_JAVA_DIR` (default `/usr/share/java`, Debian's
//! `libcurator-recipes-java`), run once for all the requested workloads, and its one JSON line
//! of results becomes [`Row`]s. Without a zk:// URL, `javac`, `java` or a jar, the rows say why
//! they were skipped.

use std::path::PathBuf;
use std::time::Duration;

use super::measure::{finish, tail_known, uuid_like};
use super::{Row, WORKLOAD_LIMIT, Workload};

/// The backend column of the Curator rows.
pub(super) const LABEL: &str = "curator (java)";

const SOURCE: &str = include_str!("CuratorBench.java");

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

/// The workloads the Java program runs.
fn supported(w: Workload) -> bool {
    matches!(
        w,
        Workload::W1 | Workload::W1S | Workload::W2 | Workload::W3 | Workload::W4
    )
}

/// Runs the requested workloads of W1-W4 and W1S through Curator against the ZooKeeper of
/// `url` (`None`: no zk:// store is configured). One row per requested workload of those; a row's
/// `skipped` starts with `error:` when the run failed, and gives the reason when it could not
/// run at all.
pub(super) async fn rows(
    url: Option<&str>,
    workloads: &[Workload],
    cycles: u64,
    limit: Option<Duration>,
) -> Vec<Row> {
    let wanted: Vec<Workload> = workloads
        .iter()
        .copied()
        .filter(|w| supported(*w))
        .collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let skipped = |why: String| {
        wanted
            .iter()
            .map(|w| Row::skipped(LABEL, format!("{w:?}"), why.clone()))
            .collect()
    };
    let Some(url) = url else {
        return skipped("DLOCK_ZK_URL is not set".into());
    };
    let (connect, chroot) = match server(url) {
        Ok(s) => s,
        Err(why) => return skipped(why),
    };
    let classpath = match compile().await {
        Ok(cp) => cp,
        Err(why) => return skipped(why),
    };
    let result = run(&classpath, &connect, &chroot, &wanted, cycles, limit).await;
    let _ = std::fs::remove_dir_all(classpath.dir);
    match result {
        Ok(rows) => rows,
        Err(e) => skipped(format!("error: {e}")),
    }
}

/// The first server of a zk:// URL, and its chroot.
#[cfg(feature = "zookeeper")]
fn server(url: &str) -> Result<(String, String), String> {
    let config = dlock_zookeeper::ZkConfig::from_url(url)
        .map_err(|e| format!("error: bad zk:// URL: {e}"))?;
    if url.split("://").nth(1).is_some_and(|rest| {
        rest.split(['/', '?'])
            .next()
            .is_some_and(|auth| auth.contains('@'))
    }) {
        return Err("credentials in the zk:// URL are not passed to Curator".into());
    }
    let host = config
        .hosts
        .first()
        .cloned()
        .ok_or_else(|| "error: the zk:// URL names no server".to_owned())?;
    Ok((host, config.chroot.trim_end_matches('/').to_owned()))
}

#[cfg(not(feature = "zookeeper"))]
fn server(_url: &str) -> Result<(String, String), String> {
    Err("dlock was built without the zookeeper feature".into())
}

struct Classpath {
    dir: PathBuf,
    full: String,
}

/// Compiles `CuratorBench.java` into a fresh temporary directory.
async fn compile() -> Result<Classpath, String> {
    let java_dir =
        PathBuf::from(std::env::var("DLOCK_JAVA_DIR").unwrap_or_else(|_| "/usr/share/java".into()));
    let mut jars = Vec::new();
    for jar in JARS {
        let p = java_dir.join(jar);
        if !p.exists() {
            return Err(format!(
                "{} is missing (Debian: libcurator-recipes-java)",
                p.display()
            ));
        }
        jars.push(p.display().to_string());
    }
    let jars = jars.join(":");
    let dir = std::env::temp_dir().join(format!("dlock-bench-curator-{}", uuid_like()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let source = dir.join("CuratorBench.java");
    let compiled = async {
        std::fs::write(&source, SOURCE)
            .map_err(|e| format!("cannot write {}: {e}", source.display()))?;
        let out = tokio::process::Command::new("javac")
            .args(["-nowarn", "-cp", &jars, "-d"])
            .arg(&dir)
            .arg(&source)
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| format!("javac cannot run ({e})"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "error: javac failed ({}): {}",
                out.status,
                tail(&out.stderr)
            ))
        }
    };
    match tokio::time::timeout(Duration::from_secs(120), compiled).await {
        Ok(Ok(())) => Ok(Classpath {
            full: format!("{}:{jars}", dir.display()),
            dir,
        }),
        Ok(Err(e)) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(e)
        }
        Err(_) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err("error: javac did not finish within 120 s".into())
        }
    }
}

/// Runs the program and turns its JSON line into rows.
async fn run(
    classpath: &Classpath,
    connect: &str,
    chroot: &str,
    wanted: &[Workload],
    cycles: u64,
    limit: Option<Duration>,
) -> Result<Vec<Row>, String> {
    let base = format!(
        "{chroot}/dlock-bench-curator/{}-{}",
        std::process::id(),
        uuid_like()
    );
    let list = wanted
        .iter()
        .map(|w| format!("{w:?}"))
        .collect::<Vec<_>>()
        .join(",");
    let limit_ms = limit.map_or(0, |l| l.as_millis().max(1));
    let child = tokio::process::Command::new("java")
        .args(["-Xmx256m", "-cp", &classpath.full, "CuratorBench", connect])
        .arg(&base)
        .arg(cycles.to_string())
        .arg(limit_ms.to_string())
        .arg(&list)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let runs = u32::try_from(wanted.len()).unwrap_or(1);
    let out = tokio::time::timeout(WORKLOAD_LIMIT * runs, child)
        .await
        .map_err(|_| format!("java did not finish within {:?}", WORKLOAD_LIMIT * runs))?
        .map_err(|e| format!("java cannot run ({e})"))?;
    if !out.status.success() {
        return Err(format!(
            "java CuratorBench exited with {}: {}",
            out.status,
            tail(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| {
            format!(
                "no JSON line in CuratorBench's output: {}",
                tail(&out.stdout)
            )
        })?;
    parse(line, wanted)
}

/// One workload's results as CuratorBench prints them.
#[derive(Debug, serde::Deserialize)]
struct Measured {
    cycles: u64,
    seconds: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    #[serde(default)]
    violations: u64,
}

fn parse(line: &str, wanted: &[Workload]) -> Result<Vec<Row>, String> {
    let mut by_workload: std::collections::HashMap<String, Measured> =
        serde_json::from_str(line).map_err(|e| format!("bad CuratorBench output {line:?}: {e}"))?;
    let mut rows = Vec::new();
    for w in wanted {
        let name = format!("{w:?}");
        let mut row = Row::new(LABEL, name.clone());
        match by_workload.remove(&name) {
            None => row.skipped = Some("error: CuratorBench reported nothing".into()),
            Some(m) => {
                finish(
                    &mut row,
                    m.cycles,
                    Duration::from_secs_f64(m.seconds.max(0.0)),
                );
                // Percentiles only from enough samples, as dlock's own rows.
                let p99 = tail_known(m.cycles, 0.99).then_some(m.p99_us);
                if *w == Workload::W3 {
                    row.handoff_p50_us = Some(m.p50_us);
                    row.handoff_p99_us = p99;
                } else {
                    row.acquire_p50_us = m.p50_us;
                    row.acquire_p99_us = p99;
                    row.acquire_p999_us = tail_known(m.cycles, 0.999).then_some(m.p999_us);
                }
                row.violations = m.violations;
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The last few lines of a program's output, for error messages.
fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::targets::Via;

    #[test]
    fn parses_the_json_line() {
        let line = r#"{"W1":{"cycles":2000,"seconds":0.5,"p50_us":400,"p99_us":900,"p999_us":1200,"violations":0},"W3":{"cycles":25,"seconds":0.2,"p50_us":700,"p99_us":1500,"p999_us":1600,"violations":0}}"#;
        let rows = parse(line, &[Workload::W1, Workload::W3]).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].backend, LABEL);
        assert_eq!(rows[0].workload, "W1");
        assert_eq!(rows[0].cycles, 2000);
        assert!((rows[0].cycles_per_sec - 4000.0).abs() < 1e-6);
        // 2,000 samples tell the 99th percentile, not the 99.9th; 25 tell only the median.
        assert_eq!(
            (
                rows[0].acquire_p50_us,
                rows[0].acquire_p99_us,
                rows[0].acquire_p999_us
            ),
            (400, Some(900), None)
        );
        assert_eq!(rows[0].handoff_p50_us, None);
        assert_eq!(rows[1].workload, "W3");
        assert_eq!(rows[1].handoff_p50_us, Some(700));
        assert_eq!(rows[1].handoff_p99_us, None);
        assert!(parse("{}", &[Workload::W2]).unwrap()[0].skipped.is_some());
        assert!(parse("not json", &[Workload::W1]).is_err());
    }

    #[test]
    fn every_zk_store_is_followed_by_curator_and_redis_by_rslock() {
        let opts = super::super::BenchOpts {
            urls: vec!["memory://x".into(), "zk://h:1/c".into(), "redis://r".into()],
            workload: vec![Workload::W1],
            cycles: 1,
            holds: vec![1],
            hold_for: std::time::Duration::ZERO,
            duration: None,
            json: None,
            chart: None,
            from_json: None,
            baseline: None,
        };
        let (targets, _) = super::super::targets::targets(&opts);
        let labels: Vec<&str> = targets.iter().map(|t| t.label.as_str()).collect();
        // rslock follows a Redis store as Curator follows ZooKeeper.
        assert_eq!(labels, ["memory", "zk", LABEL, "redis", "rslock"]);
        assert!(targets[2].via == Via::Curator && targets[2].url == "zk://h:1/c");
        assert_eq!(targets[1].via, Via::Dlock);
    }

    #[tokio::test]
    async fn skips_without_a_zookeeper() {
        let got = rows(None, &[Workload::W1, Workload::W5, Workload::W3], 10, None).await;
        assert_eq!(got.len(), 2, "W5 is not run through Curator");
        assert!(
            got.iter()
                .all(|r| r.skipped.as_deref() == Some("DLOCK_ZK_URL is not set"))
        );
        assert!(rows(None, &[Workload::W6], 10, None).await.is_empty());
    }
}
