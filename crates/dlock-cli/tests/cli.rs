//! The `dlock` binary end to end: on the embedded SQLite default and on every server backend
//! configured (`DLOCK_REDIS_URL`, `DLOCK_ZK_URL`, `DLOCK_MYSQL_URL`).

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dlock_conformance::{Names, service_url};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// A scratch SQLite file, removed at the end.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Self {
        Self(std::env::temp_dir().join(format!(
            "dlock-cli-{}-{}.db",
            std::process::id(),
            Names::new().prefix().len() + rand_suffix()
        )))
    }
    fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }

    /// A connection of the test's own to the file, which waits out dlock's writes (the
    /// sqlite3 shell, which has no busy timeout, failed with "database is locked" now and
    /// then).
    async fn patient_connection(&self) -> sqlx::SqliteConnection {
        use sqlx::Connection as _;
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&self.0)
            .busy_timeout(Duration::from_secs(20));
        sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap()
    }
}

fn rand_suffix() -> usize {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize)
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for s in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{s}", self.0.display()));
        }
    }
}

/// The embedded default plus every configured server.
fn stores(scratch: &Scratch) -> Vec<String> {
    let mut urls = vec![scratch.url()];
    for var in ["DLOCK_REDIS_URL", "DLOCK_ZK_URL", "DLOCK_MYSQL_URL"] {
        if let Some(url) = service_url(var) {
            urls.push(url);
        }
    }
    urls
}

/// [`stores`], and PostgreSQL and etcd where configured: every backend the CLI has.
fn every_store(scratch: &Scratch) -> Vec<String> {
    let mut urls = stores(scratch);
    for var in ["DLOCK_POSTGRES_URL", "DLOCK_ETCD_URL"] {
        if let Some(url) = service_url(var) {
            urls.push(url);
        }
    }
    urls
}

fn dlock(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(DLOCK);
    c.args(args).env("DLOCK_URL", url).env_remove("RUST_LOG");
    c
}

fn output(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().unwrap()
}

/// Two `dlock run` on one name never overlap: each child appends start/end stamps to a file;
/// the intervals must not intersect.
#[test]
fn runs_on_one_name_never_overlap() {
    let scratch = Scratch::new();
    for url in stores(&scratch) {
        let name = Names::new().name("overlap");
        let log = std::env::temp_dir().join(format!("dlock-overlap-{}.log", rand_suffix()));
        let script = format!(
            "for i in 1 2 3; do echo \"start $(date +%s%N)\" >> {0}; sleep 0.05; echo \"end $(date +%s%N)\" >> {0}; done",
            log.display()
        );
        let children: Vec<_> = (0..2)
            .map(|_| {
                dlock(&url, &["run", &name, "--", "sh", "-c", &script])
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            assert!(c.wait().unwrap().success(), "{url}");
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let _ = std::fs::remove_file(&log);
        // Each process's run is one block of three start/end pairs: no start may follow a start.
        let mut open = false;
        let mut starts = 0;
        for line in text.lines() {
            let is_start = line.starts_with("start");
            assert_ne!(open, is_start, "{url}: overlapping runs:\n{text}");
            open = is_start;
            starts += usize::from(is_start);
        }
        assert_eq!(starts, 6, "{url}: both runs happened");
        // And the two runs did not interleave: a run's three pairs are contiguous.
        let stamps: Vec<u128> = text
            .lines()
            .map(|l| l.split(' ').nth(1).unwrap().parse().unwrap())
            .collect();
        assert!(
            stamps.windows(2).all(|w| w[0] <= w[1]),
            "{url}: stamps go forward"
        );
    }
}

/// The documented exit statuses.
#[test]
fn exit_statuses() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("codes");
    // The command's own status is passed on, and it sees the token and name.
    let out = output(dlock(
        &url,
        &[
            "run",
            &name,
            "--",
            "sh",
            "-c",
            "echo \"$DLOCK_NAME $DLOCK_FENCING_TOKEN\"; exit 7",
        ],
    ));
    assert_eq!(out.status.code(), Some(7));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&name), "{text}");
    // As flock(1) takes it, without `--`: the command's own options stay its own.
    let out = output(dlock(
        &url,
        &["run", &name, "sh", "-c", "echo \"$0\"; exit 9", "-v"],
    ));
    assert_eq!(out.status.code(), Some(9), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "-v", "{out:?}");
    assert!(
        text.trim()
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    // Held elsewhere: 75 with --no-wait, or -E's code; after --wait.
    let mut holder = dlock(&url, &["run", &name, "--", "sleep", "3"])
        .spawn()
        .unwrap();
    let t = Instant::now();
    while output(dlock(&url, &["status", "--json", &name]))
        .stdout
        .windows(11)
        .all(|w| w != b"\"held\":true")
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the holder never held"
        );
    }
    assert_eq!(
        output(dlock(&url, &["run", "--no-wait", &name, "--", "true"]))
            .status
            .code(),
        Some(75)
    );
    assert_eq!(
        output(dlock(&url, &["run", "-n", "-E", "9", &name, "--", "true"]))
            .status
            .code(),
        Some(9)
    );
    let t = Instant::now();
    assert_eq!(
        output(dlock(
            &url,
            &["run", "--wait", "300ms", &name, "--", "true"]
        ))
        .status
        .code(),
        Some(75)
    );
    assert!(t.elapsed() >= Duration::from_millis(300));
    holder.wait().unwrap();
    // Not found, bad name, bad URL, bad duration, unreachable server.
    assert_eq!(
        output(dlock(&url, &["run", &name, "--", "/nonexistent/cmd"]))
            .status
            .code(),
        Some(127)
    );
    assert_eq!(
        output(dlock(&url, &["run", "", "--", "true"]))
            .status
            .code(),
        Some(78)
    );
    assert_eq!(
        output(dlock("consul://x", &["run", "n", "--", "true"]))
            .status
            .code(),
        Some(78)
    );
    // Durations too large for the clock: a wait that long is "as long as it takes", a lease
    // that long is refused (78), and neither panics.
    let huge = "500000000000y";
    let out = output(dlock(&url, &["run", "--wait", huge, &name, "--", "true"]));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A --kill-after that long is not shorter than the hold: refused before the command runs.
    let out = output(dlock(
        &url,
        &["run", "--kill-after", huge, &name, "--", "true"],
    ));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = output(dlock(&url, &["run", "--lease", huge, &name, "--", "true"]));
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lease") && !err.contains("panicked"), "{err}");
    let bad = output(dlock(&url, &["run", "--wait", "soon", "n", "--", "true"]));
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a duration"));
    let down = output(dlock(
        "redis://:hunter2@127.0.0.1:1",
        &["run", "n", "--", "true"],
    ));
    assert_eq!(down.status.code(), Some(69));
    let err = String::from_utf8_lossy(&down.stderr);
    assert!(
        err.contains("127.0.0.1:1") && !err.contains("hunter2"),
        "{err}"
    );
}

/// `dlock` killed with SIGKILL: the lock is free again once its lease has run out.
#[test]
fn killed_dlock_frees_the_lock_after_its_lease() {
    let scratch = Scratch::new();
    for url in stores(&scratch) {
        let name = Names::new().name("sigkill");
        let mut holder = dlock(
            &url,
            &[
                "run",
                "--lease",
                "1s",
                "--kill-after",
                "100ms",
                &name,
                "--",
                "sleep",
                "30",
            ],
        )
        .spawn()
        .unwrap();
        let t = Instant::now();
        while output(dlock(&url, &["run", "--no-wait", &name, "--", "true"]))
            .status
            .code()
            != Some(75)
        {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{url}: the holder never held"
            );
        }
        holder.kill().unwrap();
        holder.wait().unwrap();
        let killed = Instant::now();
        // ZooKeeper frees it at the session timeout instead of the lease.
        let limit = if url.starts_with("zk:") {
            Duration::from_secs(40)
        } else {
            Duration::from_secs(8)
        };
        let out = output(dlock(
            &url,
            &[
                "run",
                "--wait",
                &format!("{}s", limit.as_secs()),
                &name,
                "--",
                "true",
            ],
        ));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{url}: free {:?} after SIGKILL", killed.elapsed());
    }
}

/// A lock lost while the command runs terminates the command, and dlock says why (76).
#[test]
fn lost_lock_terminates_the_command() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("lost");
    let child = dlock(
        &url,
        &[
            "-v",
            "run",
            "--lease",
            "600ms",
            "--kill-after",
            "100ms",
            &name,
            "--",
            "sleep",
            "30",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let t = Instant::now();
    while output(dlock(&url, &["run", "--no-wait", &name, "--", "true"]))
        .status
        .code()
        != Some(75)
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the holder never held"
        );
    }
    // Take the lock away behind its back, waiting out the holder's own writes (its renewals
    // take SQLite's write lock a few times a second: the sqlite3 shell, which has no busy
    // timeout, failed with "database is locked" now and then, and the holder then kept the
    // lock to the end of its command).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let deleted = rt.block_on(async {
        let mut conn = scratch.patient_connection().await;
        sqlx::query("DELETE FROM dlock_holds WHERE name = ?")
            .bind(name.as_bytes())
            .execute(&mut conn)
            .await
            .unwrap()
            .rows_affected()
    });
    assert_eq!(deleted, 1, "the holder's row was there to delete");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{err}");
    assert!(err.contains("lost the lock"), "{err}");
    assert!(
        err.contains("the store no longer has the hold"),
        "the loss reason: {err}"
    );
    // -v shows the library's tracing: the dlock.lost event, with its fields.
    assert!(
        err.contains("dlock.lost") && err.contains("reason"),
        "-v shows the tracing: {err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "the command was not terminated"
    );
}

/// `dlock status` shows a hold taken through the library.
#[test]
fn status_shows_a_hold_taken_by_the_library() {
    let scratch = Scratch::new();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for url in stores(&scratch) {
        let name = Names::new().name("status");
        let guard = rt.block_on(async {
            dlock::connect(&url)
                .await
                .unwrap()
                .lock(&name)
                .unwrap()
                .acquire()
                .await
                .unwrap()
        });
        let out = output(dlock(&url, &["status", "--json", &name]));
        assert!(
            out.status.success(),
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["held"], true, "{url}: {v}");
        assert_eq!(v["kind"], "mutex", "{url}: {v}");
        if !url.contains("for-update") {
            assert!(v["holders"][0].is_string(), "{url}: {v}");
        }
        let text =
            String::from_utf8_lossy(&output(dlock(&url, &["status", &name])).stdout).to_string();
        assert!(text.contains("held"), "{url}: {text}");
        let checked = output(dlock(&url, &["status", "--check", &name]));
        assert_eq!(checked.status.code(), Some(0), "{url}: held: {checked:?}");
        rt.block_on(guard.release()).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&output(dlock(&url, &["status", "--json", &name])).stdout)
                .unwrap();
        assert_eq!(v["held"], false, "{url}: {v}");
        let checked = output(dlock(&url, &["status", "--check", "--json", &name]));
        assert_eq!(checked.status.code(), Some(1), "{url}: free: {checked:?}");
        let unchecked = output(dlock(&url, &["status", &name]));
        assert_eq!(unchecked.status.code(), Some(0), "{url}: {unchecked:?}");
    }
}

/// The help texts name every subcommand and the exit statuses.
#[test]
fn help_reads_well() {
    let top = String::from_utf8(output(dlock("", &["--help"])).stdout).unwrap();
    for word in ["run", "status", "bench"] {
        assert!(top.contains(word), "{top}");
    }
    let run = String::from_utf8(output(dlock("", &["run", "--help"])).stdout).unwrap();
    for word in [
        "DLOCK_FENCING_TOKEN",
        "75",
        "76",
        "--wait",
        "--no-wait",
        "--lease",
        "--kill-after",
        "SIGTERM",
        "SIGKILL",
        "69",
    ] {
        assert!(run.contains(word), "{word} missing from:\n{run}");
    }
}

/// Shell completions and manual pages come from the same definitions as the help: bash
/// takes the completion script (`complete -p dlock` names its function), zsh's and fish's
/// name the subcommands and options, and the pages are roff with every option of theirs.
#[test]
fn completions_and_man_pages_are_generated() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = output(dlock("", &["completions", shell]));
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        for word in ["torture", "url-file", "kill-after"] {
            assert!(
                script.contains(word),
                "{word} missing from the {shell} completions"
            );
        }
    }
    let bash = Command::new("bash")
        .args([
            "-c",
            r#"source <("$0" completions bash) && complete -p dlock"#,
            DLOCK,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let registered = String::from_utf8_lossy(&bash.stdout);
    assert!(
        bash.status.success() && registered.contains("_dlock"),
        "bash did not take the completions: {bash:?}"
    );

    let top = String::from_utf8(output(dlock("", &["man"])).stdout).unwrap();
    assert!(top.contains(".TH dlock 1"), "{top}");
    for sub in ["run", "status", "bench", "torture", "completions"] {
        assert!(top.contains(sub), "{sub} missing from dlock(1)");
    }
    let run = String::from_utf8(output(dlock("", &["man", "run"])).stdout).unwrap();
    assert!(run.contains(".TH dlock-run 1"), "{run}");
    for option in [
        r"\-\-kill\-after",
        r"\-\-url\-file",
        r"\-\-shared",
        "DLOCK_FENCING_TOKEN",
    ] {
        assert!(run.contains(option), "{option} missing from dlock-run(1)");
    }
    let unknown = output(dlock("", &["man", "reap"]));
    assert_eq!(unknown.status.code(), Some(78), "{unknown:?}");
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(said.contains("known: run"), "{said}");
}

/// A smoke run of the benchmark: the table, the JSON (schema, non-empty series) and the chart.
#[test]
fn bench_smoke_writes_json_and_chart() {
    let scratch = Scratch::new();
    let dir = std::env::temp_dir();
    let (json, svg) = (
        dir.join(format!("dlock-bench-{}.json", rand_suffix())),
        dir.join(format!("dlock-bench-{}.svg", rand_suffix())),
    );
    let out = output(dlock(
        "",
        &[
            "bench",
            "--url",
            &scratch.url(),
            "--url",
            "memory://smoke",
            "--cycles",
            "20",
            "--json",
            json.to_str().unwrap(),
            "--chart",
            svg.to_str().unwrap(),
        ],
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("cycles/s") && table.contains("sqlite/unique-insert"),
        "{table}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        30,
        "2 stores × 15 rows (13 workloads, and W9's two loads)"
    );
    for row in rows {
        for key in [
            "backend",
            "workload",
            "cycles",
            "cycles_per_sec",
            "acquire_p99_us",
            "violations",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        assert_eq!(row["violations"], 0);
    }
    let w1 = rows
        .iter()
        .find(|r| r["workload"] == "W1" && r["backend"] == "sqlite/unique-insert")
        .unwrap();
    assert!(w1["cycles"].as_u64().unwrap() > 0 && w1["cycles_per_sec"].as_f64().unwrap() > 0.0);
    assert!(
        w1["ratio_to_floor"].as_f64().unwrap() > 0.0,
        "the floor was measured"
    );
    let w3 = rows.iter().find(|r| r["workload"] == "W3").unwrap();
    assert!(w3["handoff_p50_us"].as_u64().unwrap() > 0);
    // Starvation and cost are measured: owner switches and the longest wait on one name
    // (the memory store's fair lock hands over on nearly every cycle), CPU per cycle, and the
    // W4 floor of 8 raw clients.
    let of = |backend: &str, workload: &str| {
        rows.iter()
            .find(|r| r["workload"] == workload && r["backend"] == backend)
            .unwrap()
    };
    // A permit of a semaphore, where the store has semaphores.
    assert!(of("memory", "W1S")["cycles"].as_u64().unwrap() > 0);
    assert_eq!(
        of("sqlite/unique-insert", "W1S")["skipped"],
        "no semaphores"
    );
    // 64 tasks on one provider, on a name each and on 8 names.
    for wl in ["W7", "W7H"] {
        let r = of("memory", wl);
        assert!(r["cycles"].as_u64().unwrap() >= 64, "{r}");
    }
    for wl in ["W2", "W2F"] {
        let r = of("memory", wl);
        let switches = r["owner_switch_pct"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&switches), "{r}");
        assert!(r["max_wait_ms"].as_f64().unwrap() >= 0.0, "{r}");
    }
    assert_eq!(
        of("sqlite/unique-insert", "W2F")["skipped"],
        "no fair locks",
        "SQLite has no fair lock"
    );
    for wl in ["W1", "W2", "W4"] {
        let r = of("sqlite/unique-insert", wl);
        assert!(r["cpu_us_per_cycle"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        of("sqlite/unique-insert", "W4")["ratio_to_floor"]
            .as_f64()
            .unwrap()
            > 0.0,
        "the W4 floor was measured"
    );
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(
        chart.starts_with("<svg")
            && chart.contains("<rect")
            && chart.contains("sqlite/unique-insert")
    );
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(svg);
}

/// Every SQL strategy's W1 is set against its own statements made raw (`dlock_sql::raw`),
/// whose client CPU is measured too; MySQL for-update also against its row lock alone. A floor
/// that fails (a statement that does not fit the strategy's tables) leaves the row without a
/// ratio.
#[test]
fn bench_sets_each_sql_strategy_against_its_own_statements() {
    let scratch = Scratch::new();
    let mut urls = vec![
        format!("{}?table=dlock_floor_ui", scratch.url()),
        format!("{}?strategy=optimistic&table=dlock_floor_op", scratch.url()),
    ];
    let mut servers = Vec::new();
    if cfg!(feature = "mysql") {
        servers.extend(service_url("DLOCK_MYSQL_URL").map(|u| {
            (
                u,
                &["unique-insert", "optimistic", "for-update", "get-lock"][..],
            )
        }));
    }
    if cfg!(feature = "postgres") {
        servers.extend(service_url("DLOCK_POSTGRES_URL").map(|u| {
            (
                u,
                &["unique-insert", "optimistic", "for-update", "advisory"][..],
            )
        }));
    }
    for (url, strategies) in servers {
        for s in strategies {
            let table = format!("dlock_floor_{}", s.replace('-', "_"));
            let sep = if url.contains('?') { '&' } else { '?' };
            urls.push(format!("{url}{sep}strategy={s}&table={table}"));
        }
    }
    let doc = bench_json(&urls, &["--workload", "W1", "--cycles", "20"]);
    let rows: Vec<_> = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["backend"].as_str().unwrap().starts_with("sqlx"))
        .collect();
    assert_eq!(rows.len(), urls.len(), "{doc}");
    for r in rows {
        assert_eq!(r["skipped"], serde_json::Value::Null, "{r}");
        assert!(r["ratio_to_floor"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["floor_cpu_us_per_cycle"].as_f64().is_some(), "{r}");
        // A MySQL for-update lock is a row lock, measured alone besides; on PostgreSQL it is
        // an advisory lock, whose floor is the lock alone already.
        let backend = r["backend"].as_str().unwrap();
        let row_lock = backend.ends_with("/for-update") && !backend.starts_with("postgres");
        assert_eq!(
            r["ratio_to_lock_floor"].as_f64().is_some_and(|x| x > 0.0),
            row_lock,
            "only a MySQL for-update lock is set against its row lock alone: {r}"
        );
    }
}

/// W7 (64 tasks on one provider) is set against 64 raw tasks on one shared client where the
/// store multiplexes one (Redis, ZooKeeper, etcd), and on PostgreSQL's advisory locks against
/// 64 raw tasks on a pool the size of the provider's lock pool.
#[test]
fn bench_sets_w7_against_raw_tasks_on_one_client() {
    let mut urls = Vec::new();
    for (var, built) in [
        ("DLOCK_REDIS_URL", cfg!(feature = "redis")),
        ("DLOCK_ZK_URL", cfg!(feature = "zookeeper")),
        ("DLOCK_ETCD_URL", cfg!(feature = "etcd")),
    ] {
        if built {
            urls.extend(service_url(var));
        }
    }
    if cfg!(feature = "postgres") {
        urls.extend(
            service_url("DLOCK_POSTGRES_URL")
                .map(|u| format!("{u}?strategy=advisory&table=dlock_floor_advisory")),
        );
    }
    if urls.is_empty() {
        return;
    }
    let doc = bench_json(&urls, &["--workload", "W7", "--cycles", "128"]);
    let rows: Vec<_> = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            // Not the peers that follow Redis and ZooKeeper.
            let backend = r["backend"].as_str().unwrap();
            r["workload"] == "W7" && backend != "rslock" && !backend.starts_with("curator")
        })
        .collect();
    assert_eq!(rows.len(), urls.len(), "{doc}");
    // rslock (crates.io) runs W7 beside the Redis store: 64 tasks on one of its managers.
    if urls.iter().any(|u| u.starts_with("redis")) {
        let rslock = doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["backend"] == "rslock" && r["workload"] == "W7")
            .unwrap_or_else(|| panic!("no rslock row: {doc}"));
        assert!(rslock["cycles"].as_u64().unwrap() > 0, "{rslock}");
    }
    for r in rows {
        assert_eq!(r["violations"], 0, "{r}");
        assert!(
            r["floor_cycles_per_sec"].as_f64().is_some_and(|x| x > 0.0)
                && r["ratio_to_floor"].as_f64().is_some_and(|x| x > 0.0),
            "W7 without its floor: {r}"
        );
    }
}

/// `dlock bench` on `urls` with `args`: its JSON report (the run must succeed).
fn bench_json(urls: &[String], args: &[&str]) -> serde_json::Value {
    let json = std::env::temp_dir().join(format!("dlock-bench-{}.json", rand_suffix()));
    let mut all = vec!["bench"];
    all.extend(args);
    for u in urls {
        all.extend(["--url", u.as_str()]);
    }
    all.extend(["--json", json.to_str().unwrap()]);
    let out = output(dlock("", &all));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(json);
    doc
}

/// W9, the open loop: a row per load, each offering that share of the closed loop's cycles
/// per second measured in the same run, all its arrivals done, with latencies from when each
/// was due (p99 from its 1,200 arrivals, p99.9 not: too few samples).
#[test]
fn bench_open_loop_offers_shares_of_the_closed_loop() {
    let doc = bench_json(
        &["memory://".to_owned()],
        &["--workload", "W9", "--cycles", "600"],
    );
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{doc}");
    for (r, (label, share)) in rows.iter().zip([("W9/50%", 0.5), ("W9/80%", 0.8)]) {
        assert_eq!(r["workload"], label, "{r}");
        assert_eq!(r["cycles"], 1200, "{r}");
        let closed = r["closed_loop_per_sec"].as_f64().unwrap();
        let offered = r["offered_per_sec"].as_f64().unwrap();
        assert!(
            closed > 0.0 && (offered - closed * share).abs() < 1e-6 * closed,
            "{r}"
        );
        let (p50, p99) = (
            r["acquire_p50_us"].as_u64().unwrap(),
            r["acquire_p99_us"].as_u64(),
        );
        assert!(p99.is_some_and(|p99| p99 >= p50) && p50 > 0, "{r}");
        assert!(r["acquire_p999_us"].is_null(), "{r}");
    }
}

/// The workloads across processes: W2P's 8 worker processes on one name (every cycle counted
/// on their shared board, no violation), W3P's pair timing each handoff, W8P's rows of 1 to 64
/// processes, drawn as curves; the memory store, one process's, is skipped with its reason.
#[test]
fn bench_runs_workers_in_processes_of_their_own() {
    let scratch = Scratch::new();
    let svg = std::env::temp_dir().join(format!("dlock-bench-{}.svg", rand_suffix()));
    let doc = bench_json(
        &[scratch.url(), "memory://".to_owned()],
        &[
            "--workload",
            "W2P,W3P,W8P",
            "--cycles",
            "64",
            "--chart",
            svg.to_str().unwrap(),
        ],
    );
    let chart = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(
        chart.contains("W8P: cycles/s by worker processes") && chart.contains("<polyline"),
        "no curve of W8P in the chart"
    );
    let rows = doc["rows"].as_array().unwrap();
    let of = |backend: &str, workload: &str| {
        rows.iter()
            .find(|r| r["workload"] == workload && r["backend"] == backend)
            .unwrap_or_else(|| panic!("no {backend} {workload} row in {doc}"))
    };
    let sqlite = "sqlite/unique-insert";
    let w2p = of(sqlite, "W2P");
    assert_eq!(w2p["cycles"], 128, "{w2p}");
    assert_eq!(w2p["violations"], 0, "{w2p}");
    assert!(w2p["owner_switch_pct"].as_f64().is_some(), "{w2p}");
    assert!(w2p["cpu_us_per_cycle"].as_f64().unwrap() > 0.0, "{w2p}");
    let w3p = of(sqlite, "W3P");
    assert_eq!(
        w3p["cycles"], 16,
        "every handoff timed by its waiter: {w3p}"
    );
    assert!(w3p["handoff_p50_us"].as_u64().unwrap() > 0, "{w3p}");
    for procs in [1, 4, 16, 64] {
        let r = of(sqlite, &format!("W8P/{procs}"));
        assert_eq!(r["processes"], procs, "{r}");
        assert!(r["skipped"].is_null(), "{r}");
        assert_eq!(r["cycles"].as_u64().unwrap(), 128 / procs * procs, "{r}");
    }
    assert_eq!(
        of("memory", "W2P")["skipped"],
        "the memory store is one process's"
    );
}

/// The exclusion checker can fail: a broken lock (every client its own store) shows
/// violations, in one process (W2) and across processes (W2P), and the run exits non-zero.
/// Enough cycles that the worker processes of W2P run at once on a loaded machine (with 25
/// each, one could finish its cycles before the next was scheduled).
#[test]
fn bench_reports_injected_violations() {
    let json = std::env::temp_dir().join(format!("dlock-broken-{}.json", rand_suffix()));
    let out = output(dlock(
        "",
        &[
            "bench",
            "--url",
            "broken://",
            "--workload",
            "W2,W2P",
            "--cycles",
            "4000",
            "--json",
            json.to_str().unwrap(),
        ],
    ));
    assert!(!out.status.success());
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for row in 0..2 {
        assert!(
            doc["rows"][row]["violations"].as_u64().unwrap() > 0,
            "{doc}"
        );
    }
    assert_eq!(doc["rows"][1]["workload"], "W2P", "{doc}");
    let _ = std::fs::remove_file(json);
    let _ = std::io::stderr().flush();
}

/// An interactive bash under a pseudo-terminal (`script`, of util-linux), typed into and read
/// as a user would.
struct Terminal {
    shell: std::process::Child,
    keys: std::process::ChildStdin,
    screen: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Terminal {
    fn new(url: &str) -> Self {
        let mut shell = Command::new("script")
            .args(["-qfec", "bash --norc --noprofile -i", "/dev/null"])
            .env("PS1", "$ ")
            .env("DLOCK_URL", url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("script(1), of util-linux, runs a shell under a pseudo-terminal");
        let keys = shell.stdin.take().unwrap();
        let screen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut out = shell.stdout.take().unwrap();
        let seen = std::sync::Arc::clone(&screen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut out, &mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self {
            shell,
            keys,
            screen,
        }
    }

    fn type_in(&mut self, text: &str) {
        self.keys.write_all(text.as_bytes()).unwrap();
        self.keys.flush().unwrap();
    }

    fn shows(&self, what: &str) -> bool {
        self.screen.lock().unwrap().contains(what)
    }

    /// Types `echo <tag>-$?` and returns once the shell printed the status it stands for.
    fn status_is(&mut self, tag: &str, status: i32) {
        self.type_in(&format!("echo {tag}-$?\n"));
        within(Duration::from_secs(10), "the shell said the status", || {
            self.shows(&format!("{tag}-{status}"))
        });
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // Also while a failed test unwinds: a panic here would abort the whole binary.
        let _ = self.keys.write_all(b"exit\n");
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

/// A `dlock run NAME` typed at `terminal` whose command writes its pid to `dir/pid`, waits for
/// `dir/go` and then writes `dir/done`; once the command runs, its pid and dlock's.
fn job(terminal: &mut Terminal, dir: &std::path::Path, name: &str) -> (i32, i32) {
    job_of(
        terminal,
        dir,
        name,
        "while [ ! -e {dir}/go ]; do sleep 0.05; done; echo done > {dir}/done",
        "",
    )
}

/// A `dlock run NAME` typed at `terminal` (with the shell redirection `redirect`) whose
/// command writes its pid to `dir/pid` and then runs `script` (`{dir}` stands for `dir`);
/// once the command runs, its pid and dlock's. The command is bash, not sh: dash (Debian's sh)
/// starts commands with vfork, and a Ctrl-Z that stops the child between vfork and exec leaves
/// the shell in an uninterruptible wait for it, never stopped, so no job control (bash's own
/// included) sees the job stop.
fn job_of(
    terminal: &mut Terminal,
    dir: &std::path::Path,
    name: &str,
    script: &str,
    redirect: &str,
) -> (i32, i32) {
    std::fs::create_dir_all(dir).unwrap();
    let dir = dir.display().to_string();
    terminal.type_in(&format!(
        "{DLOCK} run {name} -- bash -c 'echo $$ > {dir}/pid; {}' {redirect}\n",
        script.replace("{dir}", &dir)
    ));
    let command = pid_in(&std::path::Path::new(&dir).join("pid"));
    (command, parent_of(command))
}

/// Polls `dlock run --no-wait NAME -- sh -c SCRIPT` every 200 ms until it runs, failing after
/// `limit`.
fn until_another_run_gets(url: &str, name: &str, script: &str, limit: Duration) {
    within(limit, "another run got the name", || {
        std::thread::sleep(Duration::from_millis(200));
        output(dlock(
            url,
            &["run", "--no-wait", name, "--", "sh", "-c", script],
        ))
        .status
        .success()
    });
}

/// Another run gets `name` (once the stopped holder's lease is over), and `command` (`what`),
/// which writes stamps to `dir`/stamps while it lives, was killed before that: it is dead
/// (a zombie: its parent, stopped, cannot reap it) and its last stamp is older than the
/// other run's.
fn died_before_another_run_got_it(
    url: &str,
    name: &str,
    dir: &std::path::Path,
    command: i32,
    what: &str,
) {
    let taken = dir.join("taken");
    until_another_run_gets(
        url,
        name,
        &format!("date +%s%N > {}", taken.display()),
        Duration::from_secs(60),
    );
    assert!(
        !alive(command),
        "{what} still ran when another run got the name"
    );
    let taken: u128 = std::fs::read_to_string(&taken)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let last = std::fs::read_to_string(dir.join("stamps"))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse::<u128>().ok())
        .max()
        .unwrap();
    assert!(
        last < taken,
        "{what} wrote at {last}, after another run got the name at {taken}"
    );
}

/// Ctrl-Z at `terminal` stops `command` and dlock (`dlock_pid`) with it, and the shell has its
/// prompt back.
fn suspend(terminal: &mut Terminal, command: i32, dlock_pid: i32) {
    terminal.type_in("\x1a");
    within(Duration::from_secs(10), "the command stopped", || {
        state_of(command) == Some('T')
    });
    within(Duration::from_secs(10), "dlock stopped with it", || {
        state_of(dlock_pid) == Some('T')
    });
    within(
        Duration::from_secs(10),
        "the shell said the job stopped",
        || terminal.shows("Stopped"),
    );
    terminal.type_in("echo prompt-$((20+22))\n");
    within(
        Duration::from_secs(10),
        "the shell has its prompt back",
        || terminal.shows("prompt-42"),
    );
}

/// Job control in an interactive shell, under a pseudo-terminal: Ctrl-Z stops the command and
/// dlock with it, so the shell gets its prompt back while the lock stays held; `fg` continues
/// both, the command finishes under the same hold, and dlock exits 0 and frees the name.
#[test]
fn ctrl_z_stops_the_job_and_fg_resumes_it_under_the_lock() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("jobs");
    let dir = std::env::temp_dir().join(format!("dlock-jobs-{}", rand_suffix()));
    let mut terminal = Terminal::new(&url);
    let (command, dlock_pid) = job(&mut terminal, &dir, &name);
    suspend(&mut terminal, command, dlock_pid);
    let busy = output(dlock(&url, &["run", "--no-wait", &name, "--", "true"]));
    assert_eq!(
        busy.status.code(),
        Some(75),
        "the stopped job lost its lock"
    );
    terminal.type_in("fg\n");
    within(Duration::from_secs(10), "the command continued", || {
        state_of(command).is_some_and(|s| s != 'T')
    });
    std::fs::write(dir.join("go"), "").unwrap();
    within(Duration::from_secs(20), "the job finished", || {
        !alive(dlock_pid)
    });
    assert!(dir.join("done").exists(), "the command did not finish");
    terminal.status_is("exit", 0);
    let free = output(dlock(&url, &["run", "--no-wait", &name, "--", "true"]));
    assert!(free.status.success(), "the name was not freed: {free:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job stopped past its lease (the default 30 s watchdog: a stopped dlock renews nothing)
/// loses the lock to another run; continued with `fg`, its command is killed while still
/// stopped, never running another instruction without the lock, and dlock exits 76.
#[test]
fn a_job_continued_after_its_lease_ended_is_killed_before_it_runs() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("jobs-lost");
    let dir = std::env::temp_dir().join(format!("dlock-jobs-{}", rand_suffix()));
    let mut terminal = Terminal::new(&url);
    let (command, dlock_pid) = job(&mut terminal, &dir, &name);
    suspend(&mut terminal, command, dlock_pid);
    // The command would finish at once if it ran again.
    std::fs::write(dir.join("go"), "").unwrap();
    until_another_run_gets(&url, &name, "true", Duration::from_secs(60));
    terminal.type_in("fg\n");
    within(Duration::from_secs(20), "the job ended", || {
        !alive(dlock_pid)
    });
    terminal.status_is("exit", 76);
    assert!(!alive(command), "the command outlived its lock");
    assert!(
        !dir.join("done").exists(),
        "the command ran on after its lock had passed to another run"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stopped job whose command someone else continues (`kill -CONT`) while dlock stays
/// stopped: the reaper, which never stops, kills the command when the hold ends (the default
/// 30 s lease), so it writes nothing after another run got the name; `fg` then ends dlock
/// with 76.
#[test]
fn a_command_continued_behind_a_stopped_dlock_dies_when_the_hold_ends() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("jobs-cont");
    let dir = std::env::temp_dir().join(format!("dlock-jobs-{}", rand_suffix()));
    let mut terminal = Terminal::new(&url);
    let (command, dlock_pid) = job_of(
        &mut terminal,
        &dir,
        &name,
        "while true; do date +%s%N >> {dir}/stamps; sleep 0.05; done",
        "",
    );
    suspend(&mut terminal, command, dlock_pid);
    // `kill -CONT -GROUP`: the command and what it runs (its `sleep`, stopped with it).
    let group = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(command))).unwrap();
    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGCONT).unwrap();
    within(Duration::from_secs(10), "the command ran again", || {
        state_of(command).is_some_and(|s| s != 'T')
    });
    assert_eq!(state_of(dlock_pid), Some('T'), "dlock did not stay stopped");
    died_before_another_run_got_it(&url, &name, &dir, command, "the continued command");
    terminal.type_in("fg\n");
    within(Duration::from_secs(20), "the job ended", || {
        !alive(dlock_pid)
    });
    terminal.status_is("exit", 76);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A SIGSTOP to dlock alone (which it cannot catch) while its command runs: dlock renews
/// nothing, and its command runs on. The reaper, which dlock keeps told of the hold's end,
/// kills the command when that end passes (the default 30 s lease), so it writes nothing
/// after another run got the name; continued, dlock finds the hold gone and exits 76.
#[test]
fn the_command_of_a_dlock_stopped_alone_dies_when_the_hold_ends() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("sigstop");
    let dir = std::env::temp_dir().join(format!("dlock-sigstop-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let stamps = dir.join("stamps");
    let pidfile = dir.join("pid");
    let script = format!(
        "echo $$ > {}; while true; do date +%s%N >> {}; sleep 0.05; done",
        pidfile.display(),
        stamps.display()
    );
    let child = dlock(&url, &["run", &name, "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    // A failed assertion must not leave a stopped dlock behind (it is not waited for then).
    struct KillOnUnwind(nix::unistd::Pid);
    impl Drop for KillOnUnwind {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
    let _kill = KillOnUnwind(pid);
    within(Duration::from_secs(10), "the command runs", || {
        stamps.exists()
    });
    let command = pid_in(&pidfile);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    died_before_another_run_got_it(
        &url,
        &name,
        &dir,
        command,
        "the command of the stopped dlock",
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reaper kills the command's group at the hold's end it was started with, not before,
/// though it never hears from its dlock (one stopped before it first wrote to the reaper:
/// the stopped dlock above, in a window a loaded machine sometimes hits).
#[test]
fn a_reaper_that_hears_nothing_kills_the_group_at_the_end_it_was_started_with() {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    fn now_ns() -> u64 {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
        u64::try_from(now.tv_sec()).unwrap() * 1_000_000_000 + u64::try_from(now.tv_nsec()).unwrap()
    }
    // Kills the group should the test fail half way.
    struct KillOnUnwind(i32);
    impl Drop for KillOnUnwind {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(self.0),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let until = now_ns() + 5_000_000_000;
    let mut reaper = Command::new(DLOCK)
        .args(["reap", &format!("--until={until}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = i32::try_from(reaper.id()).unwrap();
    let _kill = KillOnUnwind(group);
    // Its stdin stays open, and nothing is written to it: the end alone ends the group.
    let _stdin = reaper.stdin.take();
    let mut ready = [0u8; 6];
    reaper
        .stdout
        .take()
        .unwrap()
        .read_exact(&mut ready)
        .unwrap();
    assert_eq!(&ready, b"ready\n");
    let mut command = Command::new("sleep")
        .arg("60")
        .process_group(group)
        .spawn()
        .unwrap();
    // The command's end, as an event: a thread waits for it and says when it came.
    let (ended, end) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let status = command.wait();
        let _ = ended.send((now_ns(), status));
    });
    let before_the_end = Duration::from_nanos((until - 500_000_000).saturating_sub(now_ns()));
    assert!(
        end.recv_timeout(before_the_end).is_err(),
        "the reaper killed the group before its end"
    );
    let (at, status) = end
        .recv_timeout(Duration::from_secs(20))
        .expect("the reaper killed the group within 20 s of its end");
    assert!(at >= until, "the reaper killed the group before its end");
    let status = status.unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status:?}"
    );
    let _ = reaper.wait();
}

/// Ctrl-Z while dlock's own group has the terminal (its stdin is not the terminal, so it
/// keeps it): dlock asks the command to stop, then stops itself, and the shell has its
/// prompt back (the command may run on meanwhile, under the reaper's deadline: Linux
/// sometimes continues it); `fg` continues both and the command finishes under the lock.
#[test]
fn ctrl_z_to_dlock_itself_stops_the_job() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("jobs-tstp");
    let dir = std::env::temp_dir().join(format!("dlock-jobs-{}", rand_suffix()));
    let mut terminal = Terminal::new(&url);
    let (command, dlock_pid) = job_of(
        &mut terminal,
        &dir,
        &name,
        "while [ ! -e {dir}/go ]; do sleep 0.05; done; echo done > {dir}/done",
        "< /dev/null",
    );
    terminal.type_in("\x1a");
    within(Duration::from_secs(10), "dlock stopped", || {
        state_of(dlock_pid) == Some('T')
    });
    terminal.type_in("echo prompt-$((20+22))\n");
    within(
        Duration::from_secs(10),
        "the shell has its prompt back",
        || terminal.shows("prompt-42"),
    );
    terminal.type_in("fg\n");
    within(Duration::from_secs(10), "the command continued", || {
        state_of(command).is_some_and(|s| s != 'T')
    });
    std::fs::write(dir.join("go"), "").unwrap();
    within(Duration::from_secs(20), "the job finished", || {
        !alive(dlock_pid)
    });
    assert!(dir.join("done").exists(), "the command did not finish");
    terminal.status_is("exit", 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The state letter of process `pid` in `/proc` (`T`: stopped), if it exists.
fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The parent of process `pid`.
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap()
}

/// Whether process `pid` still runs (a zombie counts as gone).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                != Some("Z")
        })
        .unwrap_or(false)
}

/// Polls `check` every 20 ms until it holds, failing with `what` after `limit`.
fn within(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let t = Instant::now();
    while !check() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads a pid a command wrote to `file`, once it is there.
fn pid_in(file: &std::path::Path) -> i32 {
    let mut pid = None;
    within(Duration::from_secs(10), "the command wrote its pid", || {
        pid = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok());
        pid.is_some()
    });
    pid.unwrap()
}

/// A lock lost while the command runs stops the command's whole process group: a grandchild
/// started by `sh -c` dies too.
#[test]
fn loss_stops_the_whole_process_group() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("group");
    let pidfile = std::env::temp_dir().join(format!("dlock-grandchild-{}", rand_suffix()));
    // The grandchild keeps no pipe of ours open: dlock's exit is what the test waits for.
    let script = format!(
        "sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {}; wait",
        pidfile.display()
    );
    let child = dlock(
        &url,
        &[
            "run",
            "--lease",
            "600ms",
            "--kill-after",
            "100ms",
            &name,
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let grandchild = pid_in(&pidfile);
    assert!(alive(grandchild));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .unwrap();
        sqlx::query("DELETE FROM dlock_holds WHERE name = ?")
            .bind(name.as_bytes())
            .execute(&pool)
            .await
            .unwrap();
    });
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    within(
        Duration::from_secs(5),
        "the grandchild is stopped too",
        || !alive(grandchild),
    );
    let _ = std::fs::remove_file(&pidfile);
}

/// A Ctrl-C while `dlock run` waits in a fair queue leaves no queue entry behind: dlock ends
/// the wait and finishes its undo (the entry's removal, in a background task) before it
/// exits, rather than letting the runtime drop it with `main`. On Redis, whose fair queue is
/// a list, the list is empty the moment dlock has exited; a ghost entry would keep every
/// later fair waiter out until it timed out.
#[cfg(feature = "redis")]
#[test]
fn ctrl_c_during_a_fair_wait_leaves_no_queue_entry() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let name = Names::new().name("ctrl-c-queue");
    let held = std::env::temp_dir().join(format!("dlock-held-{}", rand_suffix()));
    let hold = format!("touch {}; read line || true", held.display());
    let mut holder = dlock(&url, &["run", "--fair", &name, "--", "sh", "-c", &hold])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    within(Duration::from_secs(10), "the holder runs", || held.exists());
    let waiter = dlock(&url, &["run", "--fair", &name, "--", "true"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let queue = format!("redisson_lock_queue:{{{name}}}");
    let mut queued = || {
        redis::cmd("LLEN")
            .arg(&queue)
            .query::<i64>(&mut redis)
            .unwrap()
    };
    within(Duration::from_secs(10), "the waiter is queued", || {
        queued() == 1
    });
    let pid = nix::unistd::Pid::from_raw(i32::try_from(waiter.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert_eq!(queued(), 0, "the waiter's queue entry outlived it");
    drop(holder.stdin.take());
    assert_eq!(holder.wait().unwrap().code(), Some(0));
    let _ = std::fs::remove_file(&held);
}

/// A Ctrl-C while `dlock run` waits, on every store: dlock ends the wait and finishes its
/// undo before it exits, so nothing of the waiter is left on the store (no contender node on
/// ZooKeeper, no key on etcd, no subscription on Redis; the SQL strategies keep nothing of a
/// waiter there), and the next run gets the name as soon as its holder ends. A ghost
/// contender would keep that run out for a session (10 s) or a lease (60 s).
#[test]
fn ctrl_c_during_a_wait_leaves_nothing_of_the_waiter() {
    let scratch = Scratch::new();
    let urls = every_store(&scratch);
    let rt = tokio::runtime::Runtime::new().unwrap();
    for url in urls {
        let name = Names::new().name("ctrl-c-wait");
        let held = std::env::temp_dir().join(format!("dlock-held-{}", rand_suffix()));
        let hold = format!("touch {}; read line || true", held.display());
        let mut holder = dlock(&url, &["run", &name, "--", "sh", "-c", &hold])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        within(Duration::from_secs(10), "the holder runs", || held.exists());
        let alone = rt.block_on(contenders(&url, &name));
        let waiter = dlock(&url, &["run", &name, "--", "true"])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(waiter.id()).unwrap());
        // dlock catches SIGINT from when it has connected and asks for the lock; where the
        // store shows a waiter, the waiter is there too.
        within(Duration::from_secs(10), "the waiter waits", || {
            catches_sigint(pid.as_raw())
                && alone.is_none_or(|alone| rt.block_on(contenders(&url, &name)) == Some(alone + 1))
        });
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let out = waiter.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(130), "{url}: {out:?}");
        if url.starts_with("redis://") {
            // A subscription ends with its connection, which Redis may close a moment after
            // the process is gone.
            within(
                Duration::from_secs(5),
                "the waiter's subscription ended",
                || rt.block_on(contenders(&url, &name)) == alone,
            );
        } else {
            // The undo removed the node or key before dlock exited.
            assert_eq!(
                rt.block_on(contenders(&url, &name)),
                alone,
                "{url}: the waiter's contender outlived it"
            );
        }
        drop(holder.stdin.take());
        assert_eq!(holder.wait().unwrap().code(), Some(0), "{url}");
        let next = output(dlock(&url, &["run", "--wait", "5s", &name, "--", "true"]));
        assert!(
            next.status.success(),
            "{url}: the name did not come to the next run when its holder ended: {next:?}"
        );
        let _ = std::fs::remove_file(&held);
    }
}

/// Whether process `pid` has a handler of its own for SIGINT (`SigCgt` in `/proc`).
fn catches_sigint(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (nix::libc::SIGINT - 1)) != 0)
    })
}

/// How many contenders for `name` the store of `url` records: nodes under the lock's path on
/// ZooKeeper, keys under its name on etcd, subscribers of its channel on Redis. `None` for
/// the stores whose waiters keep nothing there (SQL).
async fn contenders(url: &str, name: &str) -> Option<usize> {
    if url.starts_with("redis://") {
        return redis_subscribers(url, name);
    }
    if url.starts_with("zk://") {
        return zk_children(url, name).await;
    }
    if url.starts_with("etcd://") {
        let endpoint = url.trim_start_matches("etcd://").split(['/', '?']).next()?;
        let key = format!("dlock/{}/", name.replace('%', "%25").replace('/', "%2F"));
        let out = Command::new("etcdctl")
            .args([
                "--endpoints",
                endpoint,
                "get",
                "--prefix",
                "--keys-only",
                &key,
            ])
            .output()
            .expect("etcdctl (scripts/services installs it with etcd)");
        assert!(out.status.success(), "etcdctl get: {out:?}");
        return Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count(),
        );
    }
    None
}

#[cfg(feature = "redis")]
fn redis_subscribers(url: &str, name: &str) -> Option<usize> {
    let mut redis = redis::Client::open(url).unwrap().get_connection().unwrap();
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let counts: Vec<(String, usize)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channel)
        .query(&mut redis)
        .unwrap();
    Some(counts.first().map_or(0, |(_, n)| *n))
}

#[cfg(not(feature = "redis"))]
fn redis_subscribers(_: &str, _: &str) -> Option<usize> {
    None
}

#[cfg(feature = "zookeeper")]
async fn zk_children(url: &str, name: &str) -> Option<usize> {
    let hosts = url.trim_start_matches("zk://").split(['/', '?']).next()?;
    let client = zookeeper_client::Client::connect(hosts).await.unwrap();
    match client.list_children(&format!("/{name}")).await {
        Ok(children) => Some(children.len()),
        Err(zookeeper_client::Error::NoNode) => Some(0),
        Err(e) => panic!("list the contenders of {name:?}: {e}"),
    }
}

#[cfg(not(feature = "zookeeper"))]
async fn zk_children(_: &str, _: &str) -> Option<usize> {
    None
}

/// A Ctrl-C while the command runs, on every store: the command gets it and ends, dlock
/// releases and exits with the command's status (130), and the name is free at once, nothing
/// of the hold left on the store for its lease or session to end.
#[test]
fn ctrl_c_while_the_command_runs_leaves_the_name_free() {
    let scratch = Scratch::new();
    let urls = every_store(&scratch);
    for url in urls {
        let name = Names::new().name("ctrl-c-run");
        let ready = std::env::temp_dir().join(format!("dlock-run-{}", rand_suffix()));
        let script = format!(
            "echo $$ > {}; sleep 30 </dev/null >/dev/null 2>&1 & wait",
            ready.display()
        );
        let child = dlock(&url, &["run", &name, "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        pid_in(&ready);
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(130), "{url}: {out:?}");
        let status: serde_json::Value =
            serde_json::from_slice(&output(dlock(&url, &["status", "--json", &name])).stdout)
                .unwrap();
        assert_eq!(
            status["held"], false,
            "{url}: the hold outlived dlock: {status}"
        );
        let next = output(dlock(&url, &["run", "--no-wait", &name, "--", "true"]));
        assert!(
            next.status.success(),
            "{url}: the name is not free: {next:?}"
        );
        let _ = std::fs::remove_file(&ready);
    }
}

/// A Ctrl-C (SIGINT to dlock's whole process group, as a terminal sends it) reaches the
/// command exactly once: the command is not in dlock's group, and dlock forwards it.
#[test]
fn ctrl_c_reaches_the_command_once() {
    use std::os::unix::process::CommandExt;
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("ctrl-c");
    let dir = std::env::temp_dir().join(format!("dlock-int-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ready, ints) = (dir.join("ready"), dir.join("ints"));
    let script = format!(
        "trap 'echo int >> {ints}' INT; echo $$ > {ready}; \
         sleep 30 </dev/null >/dev/null 2>&1 & wait; sleep 30 </dev/null >/dev/null 2>&1 & wait",
        ints = ints.display(),
        ready = ready.display()
    );
    let mut child = dlock(&url, &["run", &name, "--", "sh", "-c", &script])
        .process_group(0)
        .spawn()
        .unwrap();
    let command = pid_in(&ready);
    let group = i32::try_from(child.id()).unwrap();
    // The command runs in a process group of its own (its reaper's), out of the terminal's
    // reach: a Ctrl-C cannot reach it twice (directly, and forwarded by dlock).
    let stat = std::fs::read_to_string(format!("/proc/{command}/stat")).unwrap();
    let pgrp: i32 = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(2))
        .and_then(|p| p.parse().ok())
        .unwrap();
    assert_ne!(pgrp, group, "the command is in dlock's process group");
    // The terminal's Ctrl-C: SIGINT to the foreground process group, dlock's.
    assert!(
        Command::new("kill")
            .args(["-INT", "--", &format!("-{group}")])
            .status()
            .unwrap()
            .success()
    );
    within(
        Duration::from_secs(10),
        "the command got the SIGINT",
        || std::fs::read_to_string(&ints).is_ok_and(|t| !t.is_empty()),
    );
    // End the run (dlock forwards SIGTERM to the command's group), then count.
    assert!(
        Command::new("kill")
            .args(["-TERM", &group.to_string()])
            .status()
            .unwrap()
            .success()
    );
    child.wait().unwrap();
    let count = std::fs::read_to_string(&ints).unwrap().lines().count();
    assert_eq!(count, 1, "the command got {count} SIGINTs for one Ctrl-C");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A dlock killed with SIGKILL takes its command along (its reaper kills the command's
/// process group): nothing keeps running without the lock.
#[test]
fn killed_dlock_takes_its_command_along() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("orphan");
    let pidfile = std::env::temp_dir().join(format!("dlock-orphan-{}", rand_suffix()));
    let script = format!(
        "sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {}; wait",
        pidfile.display()
    );
    let mut child = dlock(&url, &["run", &name, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let grandchild = pid_in(&pidfile);
    child.kill().unwrap();
    child.wait().unwrap();
    within(
        Duration::from_secs(5),
        "the command dies with its dlock",
        || !alive(grandchild),
    );
    let _ = std::fs::remove_file(&pidfile);
}

/// A dlock killed the moment its command starts still takes the command along. The command
/// kills its dlock as its first act, after starting a grandchild: the reaper must be in
/// place before the command runs (the command joins the reaper's process group), or a dlock
/// killed in between leaves the command running without the lock.
#[test]
fn a_dlock_killed_as_its_command_starts_takes_the_command_along() {
    let scratch = Scratch::new();
    let url = scratch.url();
    for i in 0..20 {
        let name = Names::new().name(&format!("at-once-{i}"));
        let pidfile = std::env::temp_dir().join(format!("dlock-at-once-{}", rand_suffix()));
        let script = format!(
            "sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {}; kill -9 $PPID; wait",
            pidfile.display()
        );
        let mut child = dlock(&url, &["run", &name, "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        let grandchild = pid_in(&pidfile);
        child.wait().unwrap();
        within(
            Duration::from_secs(5),
            "the command dies with the dlock it killed",
            || !alive(grandchild),
        );
        let _ = std::fs::remove_file(&pidfile);
    }
}

/// A reader that went away (`dlock bench | head -1`) ends dlock quietly with 141, the status
/// `SIGPIPE` gives a Unix tool, instead of a panic (the old code panicked in `println!`). The
/// pipe's reading end is closed before dlock starts, so every write meets it closed.
#[test]
fn a_closed_standard_output_ends_dlock_without_a_panic() {
    for args in [
        &[
            "bench",
            "--url",
            "memory://",
            "--workload",
            "W1",
            "--cycles",
            "20",
        ][..],
        &["status", "--url", "memory://", "a-name"][..],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(DLOCK)
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
    }
}

/// A `--kill-after` not shorter than what the hold has left at the grant is refused (78)
/// before the command runs: its SIGTERM would come as the command starts.
#[test]
fn a_kill_after_not_shorter_than_the_hold_is_refused() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("kill-after");
    let ran = std::env::temp_dir().join(format!("dlock-kill-after-{}", rand_suffix()));
    let touch = format!("touch {}", ran.display());
    let out = output(dlock(
        &url,
        &[
            "run",
            "--lease",
            "1s",
            "--kill-after",
            "2s",
            &name,
            "--",
            "sh",
            "-c",
            &touch,
        ],
    ));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("is vouched for only") && err.contains("use a shorter --kill-after"),
        "{err}"
    );
    assert!(!ran.exists(), "the command ran");
    // The hold was released: the name is free at once.
    assert_eq!(
        output(dlock(&url, &["run", "--no-wait", &name, "--", "true"]))
            .status
            .code(),
        Some(0)
    );
    let _ = std::fs::remove_file(&ran);
}

/// A Redis connection of the test's own, straight to the server.
#[cfg(feature = "redis")]
async fn redis_admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A hold that vanished while the command ran (its Redis hash deleted behind dlock's back)
/// and is found gone only at the release, after the command exited 0: dlock exits 76 and
/// says so, not 0.
#[cfg(feature = "redis")]
#[test]
fn a_loss_found_at_the_release_exits_76() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let name = Names::new().name("lost-at-release");
    let pidfile = std::env::temp_dir().join(format!("dlock-at-release-{}", rand_suffix()));
    // A 2 s command under the default 30 s lease: no renewal (every 10 s) finds the loss
    // while it runs.
    let script = format!("echo $$ > {}; sleep 2", pidfile.display());
    let child = dlock(&url, &["run", &name, "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The command runs: the lock is held.
    pid_in(&pidfile);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let deleted: i64 = rt.block_on(async {
        redis::cmd("DEL")
            .arg(&name)
            .query_async(&mut redis_admin(&url).await)
            .await
            .unwrap()
    });
    assert_eq!(deleted, 1, "the holder's hash was there to delete");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{err}");
    assert!(
        err.contains("lost the lock") && err.contains("no longer had the hold"),
        "{err}"
    );
    let _ = std::fs::remove_file(&pidfile);
}

/// A store that does not answer is an error (69), never "held by someone" (75): the proxy in
/// front of Redis holds every reply 3 s, so the connection is made (slowly) but the
/// `--no-wait` acquire is cut off with no answer.
#[cfg(feature = "redis")]
#[test]
fn a_store_that_does_not_answer_is_an_error() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (cut, proxied) = rt
        .block_on(dlock_conformance::ProxyPartition::start(&url, 6379))
        .unwrap();
    cut.delay_replies(Duration::from_secs(3));
    let name = Names::new().name("no-answer");
    let started = Instant::now();
    let out = output(dlock(&proxied, &["run", "--no-wait", &name, "--", "true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "no answer: exit {:?} after {:?}: {err}",
        out.status.code(),
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains("cannot acquire") && err.contains("is held is not known"),
        "{err}"
    );
    assert!(!err.contains("held by someone"), "{err}");
}

/// Under the defaults (30 s lease, 2 s --kill-after), a holder cut off from Redis stops its
/// command before anyone else can hold the lock: the command gets SIGTERM, then is killed,
/// both while the store still has the cut-off hold, so strictly before a second `dlock run`
/// is granted the name. One iteration of the poll sees the command's processes gone and
/// then the store still holding the first hold: the kill came first.
#[cfg(feature = "redis")]
#[test]
fn a_cut_off_holder_stops_its_command_before_the_lock_passes_on() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (cut, proxied) = rt
        .block_on(dlock_conformance::ProxyPartition::start(&url, 6379))
        .unwrap();
    let name = Names::new().name("cut-off");
    let dir = std::env::temp_dir().join(format!("dlock-cut-off-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let (pids, term, granted) = (dir.join("pids"), dir.join("term"), dir.join("granted"));
    // The shell notes the SIGTERM and keeps waiting; its child ignores SIGTERM: only the
    // SIGKILL ends them.
    let script = format!(
        "trap 'echo TERM >> {term}' TERM; \
         (trap '' TERM; exec sleep 600) </dev/null >/dev/null 2>&1 & \
         echo \"$$ $!\" > {pids}.new; mv {pids}.new {pids}; \
         while :; do wait; done",
        term = term.display(),
        pids = pids.display()
    );
    let first = dlock(&proxied, &["run", &name, "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut text = String::new();
    within(
        Duration::from_secs(10),
        "the command wrote its pids",
        || {
            text = std::fs::read_to_string(&pids).unwrap_or_default();
            text.ends_with('\n')
        },
    );
    let procs: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(procs.len(), 2, "{text}");
    let mut admin = rt.block_on(redis_admin(&url));
    let fields: Vec<String> = rt.block_on(async {
        redis::cmd("HKEYS")
            .arg(&name)
            .query_async(&mut admin)
            .await
            .unwrap()
    });
    assert_eq!(fields.len(), 1, "the first holder's field: {fields:?}");
    let field = fields[0].clone();
    dlock_conformance::Partition::set_partitioned(&cut, true);
    let cut_at = Instant::now();
    let second = dlock(
        &url,
        &[
            "run",
            "--wait",
            "90s",
            &name,
            "--",
            "sh",
            "-c",
            &format!("touch {}", granted.display()),
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Each pass: the SIGTERM note, the processes, the store's hold, the second's grant.
    let (mut told, mut gone, mut last_held, mut freed, mut second_ran) =
        (None, None, None, None, None);
    rt.block_on(async {
        let deadline = cut_at + Duration::from_secs(90);
        while second_ran.is_none() {
            assert!(
                Instant::now() < deadline,
                "the second run was not granted within 90 s of the cut \
                 (told {told:?}, gone {gone:?}, freed {freed:?})"
            );
            if told.is_none() && std::fs::read_to_string(&term).is_ok_and(|t| !t.is_empty()) {
                told = Some(Instant::now());
            }
            if gone.is_none() && procs.iter().all(|p| !alive(*p)) {
                gone = Some(Instant::now());
            }
            if freed.is_none() {
                let asked = Instant::now();
                let held: bool = redis::cmd("HEXISTS")
                    .arg(&name)
                    .arg(&field)
                    .query_async(&mut admin)
                    .await
                    .unwrap();
                if held {
                    last_held = Some(asked);
                } else {
                    freed = Some(Instant::now());
                }
            }
            if granted.exists() {
                second_ran = Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let out = first.wait_with_output().unwrap();
    let first_err = String::from_utf8_lossy(&out.stderr).to_string();
    let out2 = second.wait_with_output().unwrap();
    let second_err = String::from_utf8_lossy(&out2.stderr).to_string();
    let _ = std::fs::remove_dir_all(&dir);
    let (told, gone, last_held) = (
        told.expect("the command had no SIGTERM when the second run was granted"),
        gone.expect("the command still ran when the second run was granted"),
        last_held.unwrap(),
    );
    let (freed, second_ran) = (freed.unwrap(), second_ran.unwrap());
    eprintln!(
        "cut at 0: SIGTERM seen at {:?}, processes gone at {:?}, the store last had the first \
         hold at {:?} and no longer at {:?}, the second command ran at {:?}; margins: SIGTERM \
         {:?} and kill {:?} before the store let the hold go",
        told - cut_at,
        gone - cut_at,
        last_held - cut_at,
        freed - cut_at,
        second_ran - cut_at,
        last_held - told,
        last_held - gone,
    );
    assert!(told < gone, "SIGTERM came before the kill");
    assert!(
        gone < last_held,
        "the command was gone while the store still had its hold (so before any grant)"
    );
    assert!(last_held < second_ran);
    // The grace period is what --kill-after says, less the poll's own step.
    assert!(
        gone - told >= Duration::from_millis(1500),
        "the SIGTERM came {:?} before the kill",
        gone - told
    );
    assert_eq!(out.status.code(), Some(76), "{first_err}");
    assert!(
        first_err.contains("unless renewed; terminating the command")
            && first_err.contains("lost the lock"),
        "{first_err}"
    );
    assert_eq!(out2.status.code(), Some(0), "{second_err}");
}

/// Five schedulers fire one job 0 to 3 s apart, each `dlock run --no-wait --hold-at-least
/// 10s`, on the embedded default: exactly one runs it (the first keeps the lock for 10 s
/// although its job takes 1 s; the others find it held and exit 75). Without
/// `--hold-at-least` the same fleet runs the job more than once: the lock is free again
/// after the first job's second.
#[test]
fn a_fleet_of_schedulers_runs_a_job_once_with_hold_at_least() {
    let scratch = Scratch::new();
    let url = scratch.url();
    for (hold, expected) in [
        (Some("10s"), "exactly one run"),
        (None, "more than one run"),
    ] {
        let name = Names::new().name("cron");
        let ran = std::env::temp_dir().join(format!("dlock-cron-{}", rand_suffix()));
        let job = format!("echo ran >> {}; sleep 1", ran.display());
        let mut args = vec!["run", "--no-wait"];
        if let Some(h) = hold {
            args.extend(["--hold-at-least", h]);
        }
        args.extend([name.as_str(), "--", "sh", "-c", job.as_str()]);
        let start = std::time::Instant::now();
        let mut fleet = Vec::new();
        for i in 0..5u64 {
            // The schedulers fire at 0, 0.75, 1.5, 2.25 and 3 s.
            let at = Duration::from_millis(750 * i);
            if let Some(left) = at.checked_sub(start.elapsed()) {
                std::thread::sleep(left);
            }
            fleet.push(dlock(&url, &args).stdin(Stdio::null()).spawn().unwrap());
        }
        let codes: Vec<i32> = fleet
            .into_iter()
            .map(|mut c| c.wait().unwrap().code().unwrap_or(-1))
            .collect();
        let runs = std::fs::read_to_string(&ran)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        let _ = std::fs::remove_file(&ran);
        match hold {
            Some(_) => {
                assert_eq!(runs, 1, "{expected}: exit codes {codes:?}");
                assert_eq!(codes.iter().filter(|c| **c == 0).count(), 1, "{codes:?}");
                assert_eq!(codes.iter().filter(|c| **c == 75).count(), 4, "{codes:?}");
            }
            None => assert!(runs > 1, "{expected}: {runs} (exit codes {codes:?})"),
        }
    }
}

/// A shell script that marks `me` present, waits (polling, 10 s at most) until `other` is
/// present too, and then stays until the test says `go` (10 s at most): it exits 0 only if
/// the two runs were inside at the same time.
fn meet(dir: &std::path::Path, me: &str, other: &str) -> String {
    format!(
        "touch {d}/{me}; met=1; \
         for i in $(seq 100); do [ -e {d}/{other} ] && met=0 && break; sleep 0.1; done; \
         for i in $(seq 100); do [ -e {d}/go ] && break; sleep 0.1; done; exit $met",
        d = dir.display()
    )
}

/// `--shared` runs hold the name together (a read hold, as `flock -s`) while an exclusive run
/// finds it held; `--permits 2` lets two runs in at once and turns a third away; `-w` is
/// `--wait` in seconds, as flock's. Where the backend has no read-write locks or semaphores
/// (the embedded SQLite), they are refused with a configuration error (78) and run nothing.
#[test]
fn shared_and_permit_runs_hold_a_name_together() {
    let scratch = Scratch::new();
    let refused_name = Names::new().name("refused");
    for refused in [["--shared"].as_slice(), ["--permits", "2"].as_slice()] {
        let mut args = vec!["run"];
        args.extend(refused);
        args.extend([refused_name.as_str(), "--", "true"]);
        let out = output(dlock(&scratch.url(), &args));
        assert_eq!(out.status.code(), Some(78), "{refused:?} on SQLite");
    }
    let servers = ["DLOCK_REDIS_URL", "DLOCK_ZK_URL"];
    for url in servers.iter().filter_map(|v| service_url(v)) {
        for mode in [["--shared"].as_slice(), ["--permits", "2"].as_slice()] {
            let name = Names::new().name("together");
            let dir = std::env::temp_dir().join(format!("dlock-together-{}", rand_suffix()));
            std::fs::create_dir_all(&dir).unwrap();
            let run = |me: &str, other: &str| {
                let mut args = vec!["run".to_string()];
                args.extend(mode.iter().map(|s| s.to_string()));
                args.extend([name.clone(), "--".into(), "sh".into(), "-c".into()]);
                args.push(meet(&dir, me, other));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                dlock(&url, &args).stdin(Stdio::null()).spawn().unwrap()
            };
            let (a, b) = (run("a", "b"), run("b", "a"));
            // Both inside: the third is turned away (exclusive, or a third permit of two).
            let t = Instant::now();
            while !(dir.join("a").exists() && dir.join("b").exists()) {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "{url} {mode:?}: not both in"
                );
                std::thread::yield_now();
            }
            // An exclusive run beside shared ones; a third permit of two.
            let third_mode: &[&str] = if mode[0] == "--shared" { &[] } else { mode };
            let mut third = vec!["run", "-w", "0.2"];
            third.extend(third_mode);
            third.extend([name.as_str(), "--", "true"]);
            assert_eq!(
                output(dlock(&url, &third)).status.code(),
                Some(75),
                "{url} {mode:?}"
            );
            std::fs::write(dir.join("go"), "").unwrap();
            for mut c in [a, b] {
                assert!(
                    c.wait().unwrap().success(),
                    "{url} {mode:?}: the two were not in together"
                );
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// `--signal` chooses the signal that tells the command to stop before the lock ends: here
/// USR1, sent when the holder's renewals cannot reach the store (another writer holds the
/// SQLite file's write lock), and the command, which notes it and exits, ends dlock with 76.
/// KILL and STOP are refused (the command could not act on them).
#[test]
fn the_stop_signal_is_the_one_asked_for() {
    let scratch = Scratch::new();
    let url = scratch.url();
    for bad in ["KILL", "SIGSTOP", "NOPE"] {
        let out = output(dlock(&url, &["run", "--signal", bad, "x", "--", "true"]));
        assert_eq!(out.status.code(), Some(2), "--signal {bad}");
    }
    let name = Names::new().name("signal");
    let dir = std::env::temp_dir().join(format!("dlock-signal-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let (running, got) = (dir.join("running"), dir.join("got"));
    let script = format!(
        "trap 'echo USR1 > {got}; exit 0' USR1; touch {running}; while :; do sleep 0.05; done",
        got = got.display(),
        running = running.display()
    );
    let child = dlock(
        &url,
        &[
            "run",
            "--lease",
            "1500ms",
            "--kill-after",
            "500ms",
            "--signal",
            "usr1",
            &name,
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let t = Instant::now();
    while !running.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the command never ran"
        );
        std::thread::yield_now();
    }
    // Another writer takes the file's write lock and keeps it: the holder's renewals wait
    // for it (past the lease), so the lock nears its end unrenewed.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let blocker = rt.block_on(async {
        let mut conn = scratch.patient_connection().await;
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut conn)
            .await
            .unwrap();
        conn
    });
    let out = child.wait_with_output().unwrap();
    drop(blocker);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        std::fs::read_to_string(&got).unwrap_or_default().trim(),
        "USR1",
        "the command did not get USR1: {err}"
    );
    assert_eq!(out.status.code(), Some(76), "{err}");
    assert!(err.contains("SIGUSR1"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `dlock run --hold-at-least` whose command has ended keeps the lock until then, but a
/// SIGTERM (a service manager stopping it), before or after the command ended, ends the wait
/// at once: dlock releases and exits with the command's status, and the lock is free.
#[test]
fn a_signal_ends_the_hold_at_least_wait() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let name = Names::new().name("least-signal");
    let ran = std::env::temp_dir().join(format!("dlock-least-signal-{}", rand_suffix()));
    let job = format!("touch {}", ran.display());
    let child = dlock(
        &url,
        &[
            "run",
            "--hold-at-least",
            "120s",
            &name,
            "--",
            "sh",
            "-c",
            &job,
        ],
    )
    .stdin(Stdio::null())
    .spawn()
    .unwrap();
    let t = Instant::now();
    // The command has run (and is ending, or has ended: the signal then comes in the wait).
    while !ran.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the command never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&ran);
    // The lock is kept after the command.
    let kept = output(dlock(&url, &["run", "--no-wait", &name, "--", "true"]));
    assert_eq!(kept.status.code(), Some(75), "not kept for --hold-at-least");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let signalled = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "SIGTERM did not end the wait"
    );
    // The command's status: 0, or 143 if the SIGTERM came before the shell had exited (dlock
    // passes it on).
    let code = out.status.code();
    assert!(matches!(code, Some(0 | 143)), "{code:?}");
    let again = output(dlock(&url, &["run", "--no-wait", &name, "--", "true"]));
    assert_eq!(again.status.code(), Some(0), "the lock was not released");
}

/// The URL can come from a file (`--url-file`, `DLOCK_URL_FILE`, before `DLOCK_URL`), and the command never
/// inherits `DLOCK_URL` or `DLOCK_URL_FILE` (a URL may carry a password); an unreadable file
/// is a configuration error (78) that runs nothing.
#[test]
fn the_url_comes_from_a_file_and_the_command_does_not_see_it() {
    let scratch = Scratch::new();
    let dir = std::env::temp_dir().join(format!("dlock-url-file-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("url");
    std::fs::write(&file, format!("{}\n", scratch.url())).unwrap();
    let seen = dir.join("env");
    let name = Names::new().name("url-file");
    let script = format!(
        "echo \"url=${{DLOCK_URL:-}} file=${{DLOCK_URL_FILE:-}}\" > {}",
        seen.display()
    );
    // The file wins over DLOCK_URL, which names another store.
    let other = Scratch::new();
    let mut c = Command::new(DLOCK);
    c.args(["run", &name, "--", "sh", "-c", &script])
        .env("DLOCK_URL", other.url())
        .env("DLOCK_URL_FILE", &file)
        .env_remove("RUST_LOG");
    let out = output(c);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), "url= file=");
    // The lock was taken in the file's store: the SQLite file it names now exists.
    assert!(scratch.0.exists(), "no store at {}", scratch.0.display());
    assert!(!other.0.exists(), "DLOCK_URL's store was used");
    let missing = dir.join("no-such-file");
    let mut c = Command::new(DLOCK);
    c.args(["run", "--url-file"])
        .arg(&missing)
        .args([name.as_str(), "--", "true"])
        .env_remove("DLOCK_URL")
        .env_remove("DLOCK_URL_FILE");
    assert_eq!(output(c).status.code(), Some(78));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dlock elect` on every store: the command runs only while its campaigner leads (a second
/// campaigner finds the election led, exit 75), with the term in DLOCK_FENCING_TOKEN;
/// `dlock elect --observe` prints each leader (term and proposal) and `none` between them;
/// the next leader's term is greater.
#[test]
fn elect_runs_the_command_while_leading_and_observe_sees_each_leader() {
    let scratch = Scratch::new();
    for url in every_store(&scratch) {
        let name = Names::new().name("elect");
        let probe = output(dlock(&url, &["elect", "-n", &name, "probe", "--", "true"]));
        assert!(probe.status.success(), "{url}: {probe:?}");
        let dir = std::env::temp_dir().join(format!("dlock-elect-{}", rand_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut observer = dlock(&url, &["elect", "--observe", &name])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = lines_of(observer.stdout.take().unwrap());
        let next = |what: &str| {
            lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("{url}: the observer printed nothing on {what}"))
        };
        assert_eq!(next("nobody leading"), "none", "{url}");
        // Each leader writes its term and leads until told to go.
        let leader = |proposal: &str| {
            let script = format!(
                "echo $DLOCK_FENCING_TOKEN > {0}/{1}; while [ ! -e {0}/{1}-go ]; do sleep 0.05; \
                 done",
                dir.display(),
                proposal
            );
            dlock(&url, &["elect", &name, proposal, "--", "sh", "-c", &script])
                .stdin(Stdio::null())
                .spawn()
                .unwrap()
        };
        // Where the proposal is posted after the grant (Redis, SQL, memory), the observer may
        // see the new leader before its proposal: a line with the term alone, then the
        // proposal.
        let leads = |term: u64, proposal: &str| {
            let mut seen = next(proposal);
            if seen == format!("{term} ") {
                seen = next(proposal);
            }
            assert_eq!(seen, format!("{term} {proposal}"), "{url}");
        };
        let mut first = leader("first");
        let term = token_in(&dir.join("first"));
        leads(term, "first");
        let busy = output(dlock(&url, &["elect", "-n", &name, "second", "--", "true"]));
        assert_eq!(busy.status.code(), Some(75), "{url}: two leaders: {busy:?}");
        std::fs::write(dir.join("first-go"), "").unwrap();
        assert!(first.wait().unwrap().success(), "{url}: the first run");
        assert_eq!(next("the first resigning"), "none", "{url}");
        let mut second = leader("second");
        let next_term = token_in(&dir.join("second"));
        assert!(next_term > term, "{url}: term {next_term} after {term}");
        leads(next_term, "second");
        std::fs::write(dir.join("second-go"), "").unwrap();
        assert!(second.wait().unwrap().success(), "{url}: the second run");
        let _ = observer.kill();
        let _ = observer.wait();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Reads a fencing token a command wrote to `file`, once it is there (a token is a u64: the
/// SQL row strategies' are a row id in the high bits).
fn token_in(file: &std::path::Path) -> u64 {
    let mut token = None;
    within(
        Duration::from_secs(20),
        "the command wrote its term",
        || {
            token = std::fs::read_to_string(file)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            token.is_some()
        },
    );
    token.unwrap()
}

/// The lines `out` prints, as they come, on a channel.
fn lines_of(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}
