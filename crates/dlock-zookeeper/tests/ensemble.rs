//! Failover on a 3-server ensemble (`DLOCK_ZK_ENSEMBLE_URL`, started by
//! `scripts/services up zk-ensemble`): the leader is killed (SIGKILL) while 4 contenders fight
//! over one mutex. Mutual exclusion holds throughout, fencing tokens keep growing across the
//! new leader's epoch, and the contenders go on after the election. The killed server is
//! restarted with `scripts/services up zk-ensemble` at the end (also when the test fails).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{Error, HoldState, LockOptions, LockProvider};
use dlock_zookeeper::{ZkConfig, ZkProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

const CONTENDERS: usize = 4;
/// Long enough that the sessions outlive the election, short enough to matter.
const SESSION_TIMEOUT_MS: u64 = 8000;
/// Contention before the kill, and after the new leader is in place.
const BEFORE_KILL: Duration = Duration::from_secs(2);
const AFTER_FAILOVER: Duration = Duration::from_secs(3);
/// Acquisitions every contender must make once the new leader serves.
const PROGRESS_AFTER: usize = 3;

/// One acquisition, as its contender saw it.
#[derive(Debug, Clone)]
struct Record {
    who: usize,
    token: u64,
    /// When `acquire` returned, and when the contender stopped using the lock (before release).
    start: Instant,
    end: Instant,
    /// The guard was reported lost (`lost()` fired or the state was `Lost`).
    lost: bool,
    /// The guard was vouched for (`is_held()`) when the contender began to use it.
    used: bool,
}

#[derive(Default)]
struct Shared {
    /// Contenders using the lock right now (between a held acquisition and loss or release).
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    records: Mutex<Vec<Record>>,
    /// Failed acquire/release calls (expected while the ensemble elects a leader).
    errors: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Loops acquire / hold a few ms / release until `stop` turns true.
async fn contend(
    who: usize,
    provider: ZkProvider,
    name: String,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let l = provider.lock(&name, LockOptions::default()).unwrap();
    let mut round = 0u64;
    loop {
        if *stop.borrow() {
            return;
        }
        let acquired = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            r = l.acquire() => r,
        };
        let g = match acquired {
            Ok(g) => g,
            Err(e) => {
                lock(&shared.errors).push(format!("contender {who}: acquire: {e}"));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        round += 1;
        let start = Instant::now();
        let used = g.is_held();
        let mut lost = false;
        if used {
            let before = shared.inside.fetch_add(1, Ordering::SeqCst);
            shared.max_inside.fetch_max(before + 1, Ordering::SeqCst);
            // Use the resource for 1-4 ms, stopping at once if the hold is lost.
            let hold = Duration::from_millis(1 + (round + who as u64) % 4);
            lost = tokio::select! {
                _ = g.lost() => true,
                _ = tokio::time::sleep(hold) => false,
            };
            shared.inside.fetch_sub(1, Ordering::SeqCst);
        }
        let end = Instant::now();
        lost |= g.state() == HoldState::Lost;
        lock(&shared.records).push(Record {
            who,
            token: g.fencing_token().get(),
            start,
            end,
            lost,
            used,
        });
        match must(Duration::from_secs(10), "release", g.release()).await {
            Ok(()) => {}
            Err(Error::LockLost { .. }) => {}
            Err(e) => lock(&shared.errors).push(format!("contender {who}: release: {e}")),
        }
    }
}

// ------------------------------------------------------------------ the ensemble

/// Sends `srvr` to `host` and returns the `Mode:` it reports (`None` if it does not serve).
async fn mode(host: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    stream.write_all(b"srvr").await.ok()?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(3), stream.read_to_string(&mut out))
        .await
        .ok()?
        .ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("Mode:"))
        .map(|m| m.trim().to_owned())
}

/// The modes of all servers, in `hosts` order.
async fn modes(hosts: &[String]) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for h in hosts {
        out.push(mode(h).await);
    }
    out
}

fn port_of(host: &str) -> &str {
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
fn server_pid(port: &str) -> Option<u32> {
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
struct Restore {
    armed: bool,
}

impl Restore {
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

    fn now(mut self) {
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

fn skip_or_panic(why: &str) {
    let require = std::env::var("DLOCK_TEST_REQUIRE").unwrap_or_default();
    if require
        .split(',')
        .any(|r| r.trim() == "all" || r.trim().eq_ignore_ascii_case("zk_ensemble"))
    {
        panic!("{why}, but DLOCK_TEST_REQUIRE={require} forbids skipping");
    }
    eprintln!("skipped: {why}");
}

// ------------------------------------------------------------------ the test

/// Kill the leader under contention: no two holders at once, tokens strictly increasing,
/// progress after the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_during_contention() {
    let Some(url) = service_url("DLOCK_ZK_ENSEMBLE_URL") else {
        eprintln!("(the ensemble is optional: `eval \"$(scripts/services up zk-ensemble)\"`)");
        return;
    };
    // Each step below is bounded too; this bounds their sum. On a timeout the scenario is
    // dropped, and its `Restore` brings the killed server back.
    must(
        Duration::from_secs(50),
        "the failover scenario",
        failover(url),
    )
    .await;
}

async fn failover(url: String) {
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
        skip_or_panic(&format!(
            "the leader on {leader} was not started by scripts/services (no pid file or \
             process for zk-ensemble/{leader_port}), so it cannot be killed"
        ));
        return;
    };

    let sep = if url.contains('?') { '&' } else { '?' };
    let contender_url = if url.contains("session_timeout_ms") {
        url.clone()
    } else {
        format!("{url}{sep}session_timeout_ms={SESSION_TIMEOUT_MS}")
    };
    let name = Names::new().name("failover");
    let shared = Arc::new(Shared::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut providers = Vec::new();
    for who in 0..CONTENDERS {
        let p = must(
            Duration::from_secs(10),
            "connect",
            ZkProvider::connect(&contender_url),
        )
        .await
        .unwrap();
        providers.push(p.clone());
        tasks.push(tokio::spawn(contend(
            who,
            p,
            name.clone(),
            Arc::clone(&shared),
            stop_rx.clone(),
        )));
    }
    let count = |since: Instant| {
        let mut per = [0usize; CONTENDERS];
        for r in lock(&shared.records).iter().filter(|r| r.start > since) {
            per[r.who] += 1;
        }
        per
    };

    // Contention runs: every contender gets in a few times.
    let t0 = Instant::now();
    eventually(Duration::from_secs(5), "all contenders get in", || async {
        let per = count(t0);
        if per.iter().all(|n| *n >= PROGRESS_AFTER) {
            Ok(())
        } else {
            Err(per)
        }
    })
    .await;
    tokio::time::sleep(BEFORE_KILL.saturating_sub(t0.elapsed())).await;

    // SIGKILL the leader; from here on, the ensemble is restored however the test ends.
    let restore = Restore { armed: true };
    let killed_at = Instant::now();
    let status = Command::new("kill")
        .args(["-KILL", &leader_pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -KILL {leader_pid} failed");
    eventually(Duration::from_secs(5), "the killed leader is gone", || {
        let leader = leader.clone();
        async move {
            match tokio::net::TcpStream::connect(&leader).await {
                Err(_) => Ok(()),
                Ok(_) => Err("still accepting connections"),
            }
        }
    })
    .await;
    let others: Vec<String> = hosts.iter().filter(|h| **h != leader).cloned().collect();
    let new_leader = eventually(
        Duration::from_secs(15),
        "the survivors elect a new leader",
        || {
            let others = others.clone();
            async move {
                let m = modes(&others).await;
                match m.iter().position(|m| m.as_deref() == Some("leader")) {
                    Some(i) => Ok(others[i].clone()),
                    None => Err(m),
                }
            }
        },
    )
    .await;
    let elected_at = Instant::now();
    eprintln!(
        "killed the leader {leader} (pid {leader_pid}); {new_leader} leads after {:?}",
        elected_at - killed_at
    );

    // Contention goes on under the new leader: every contender gets in again.
    eventually(
        Duration::from_secs(15),
        "every contender acquires after the failover",
        || async {
            let per = count(elected_at);
            if per.iter().all(|n| *n >= PROGRESS_AFTER) {
                Ok(())
            } else {
                Err(format!(
                    "{per:?}; {}; errors: {:?}",
                    diagnose(&providers, &name).await,
                    lock(&shared.errors)
                ))
            }
        },
    )
    .await;
    tokio::time::sleep(AFTER_FAILOVER.saturating_sub(elected_at.elapsed())).await;
    stop_tx.send(true).unwrap();
    for t in must(
        Duration::from_secs(12),
        "contenders stop",
        futures::future::join_all(tasks),
    )
    .await
    {
        t.unwrap();
    }

    // Bring the killed server back (and check the ensemble is whole again).
    restore.now();
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

    // ---------------------------------------------------------------- checks
    let records = lock(&shared.records).clone();
    let errors = lock(&shared.errors).clone();
    let lost = records.iter().filter(|r| r.lost).count();
    let after = records.iter().filter(|r| r.start > elected_at).count();
    let during = records
        .iter()
        .filter(|r| r.start > killed_at && r.start <= elected_at)
        .count();
    eprintln!(
        "{} acquisitions ({during} during the election, {after} after it), {lost} lost, {} \
         failed calls, {} used while not vouched for",
        records.len(),
        errors.len(),
        records.iter().filter(|r| !r.used).count()
    );
    for e in errors.iter().take(10) {
        eprintln!("  {e}");
    }

    // Every acquisition made a new node: unique tokens, and they grow in the order the
    // contenders got in (the new leader's zxids are from a later epoch).
    let mut by_token: BTreeMap<u64, &Record> = BTreeMap::new();
    for r in &records {
        if let Some(other) = by_token.insert(r.token, r) {
            panic!("token {} handed out twice: {other:?} and {r:?}", r.token);
        }
    }
    let mut in_order: Vec<&Record> = records.iter().collect();
    in_order.sort_by_key(|r| r.start);
    for w in in_order.windows(2) {
        if w[1].token <= w[0].token && !w[0].lost && !w[1].lost {
            panic!("fencing tokens went backwards: {:?} then {:?}", w[0], w[1]);
        }
    }
    assert!(
        records.iter().any(|r| r.start < killed_at)
            && records
                .iter()
                .any(|r| r.start > elected_at && r.token >> 32 > in_order[0].token >> 32),
        "acquisitions after the failover carry tokens of the new leader's epoch"
    );

    // Never two holders at once: intervals of guards never reported lost do not overlap,
    // and (with no loss at all) the in-process counter never went above one.
    let mut end_so_far: Option<&Record> = None;
    for r in in_order.iter().filter(|r| !r.lost && r.used) {
        if let Some(prev) = end_so_far {
            assert!(
                r.start >= prev.end,
                "two holders at once: {prev:?} still used the lock when {r:?} got it"
            );
        }
        if end_so_far.is_none_or(|p| r.end > p.end) {
            end_so_far = Some(r);
        }
    }
    if lost == 0 {
        assert_eq!(
            shared.max_inside.load(Ordering::SeqCst),
            1,
            "two contenders were inside at once"
        );
    }
    assert!(
        after >= CONTENDERS * PROGRESS_AFTER,
        "progress after the failover"
    );
}
