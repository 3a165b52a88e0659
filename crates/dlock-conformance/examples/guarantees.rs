//! Turns a directory of conformance results (written by the suite when `DLOCK_RESULTS_DIR` is
//! set) into `docs/guarantees.md`.
//!
//! ```text
//! cargo run -p dlock-conformance --example guarantees -- RESULTS_DIR > docs/guarantees.md
//! ```
//!
//! `scripts/test` runs the whole suite with `DLOCK_RESULTS_DIR`, regenerates the page, and
//! fails if the committed one differs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use dlock_conformance::{CASES, PROMISES};

/// The columns, in this order when present (others follow, sorted).
const ORDER: &[&str] = &[
    "memory",
    "memory (latency 1ms)",
    "sqlite/unique-insert",
    "sqlite/unique-insert (own pool)",
    "sqlite/optimistic",
    "mysql/unique-insert",
    "mysql/optimistic",
    "mysql/for-update",
    "mysql/for-update (own pool)",
    "postgres/advisory",
    "postgres/unique-insert",
    "postgres/optimistic",
    "postgres/for-update",
    "postgres/for-update (own pool)",
    "redis",
    "redis-cluster",
    "redis-sentinel",
    "zookeeper",
    "etcd",
    "etcd-cluster",
];

/// What each backend promises under failure, and the tests that show it. Written by hand:
/// these are fault tests beyond the conformance suite.
const UNDER_FAILURE: &[(&str, &str, &str, &str, &str)] = &[
    (
        "memory",
        "n/a: the store lives in the process",
        "n/a",
        "`set_partitioned`: the cut-off client's holds are lost by their lease end \
         (`renewal_outage_longer_than_the_lease_reports_loss`)",
        "a stalled runtime's guard is lost at its lease end \
         (`is_held_is_false_at_the_lease_end_on_a_stalled_runtime`)",
    ),
    (
        "SQLite",
        "holds and tokens are in the file: they outlive the process that took them",
        "n/a: one host",
        "n/a: no network",
        "a paused (SIGSTOP) or killed holder's row expires with its lease \
         (`dlock torture` in scripts/test)",
    ),
    (
        "MySQL / MariaDB",
        "unique-insert and optimistic rows are InnoDB rows; for-update holds end with their \
         connection and are reported lost at the next renewal. No test of the suite restarts the server; `dlock torture --faults restart` does, in \
         `docs/reliability.md`",
        "not covered: an asynchronous replica can lose a hold",
        "a partitioned holder is lost by its lease end and others get in after it; for \
         for-update the server's `wait_timeout` is the lease \
         (`renewal_outage_longer_than_the_lease_reports_loss`)",
        "paused (SIGSTOP) and killed holders, all three strategies: no overlap, no stuck lock \
         (`dlock torture` in scripts/test)",
    ),
    (
        "PostgreSQL",
        "unique-insert and optimistic rows are table rows; for-update and advisory holds end \
         with their session and are reported lost within a second (the watcher's pings; \
         `terminated_postgres_advisory_holder_reports_loss`). No test of the suite restarts the server; `dlock torture --faults restart` does, in \
         `docs/reliability.md`",
        "not covered: an asynchronous standby can lose a hold",
        "a partitioned holder is lost by its lease end and others get in after it; the server \
         enforces the lease too: `idle_session_timeout` (advisory, and for-update, which is \
         held as an advisory lock there) (`renewal_outage_longer_than_the_lease_reports_loss`)",
        "paused (SIGSTOP) and killed holders, every strategy: freed within the lease \
         (`frozen_holder_process_loses_the_lock_within_its_lease`), fixed leases at their \
         end (`a_frozen_holder_loses_its_fixed_lease_at_its_end`); no overlap, no stuck lock \
         (`dlock torture` in scripts/test)",
    ),
    (
        "Redis",
        "without AOF a restart loses holds and resets tokens: holders are told as soon as \
         the server is back, waiters wait through it; with AOF both survive (tests/redis.rs)",
        "replication is asynchronous: a failover can lose a hold, unless `?wait_replicas=N` \
         makes acquire return only grants N replicas acknowledged \
         (`wait_replicas_returns_only_replicated_grants`); behind Sentinel \
         (`redis+sentinel://`) the clients follow the promoted master, and a master killed \
         during contention with `wait_replicas=1` gives no overlap with a holder that was \
         not told, and no token that goes back \
         (`a_sentinel_failover_during_contention_keeps_exclusion_and_token_order`); renewals \
         are waited for too",
        "a partitioned holder is lost by its lease end \
         (`renewal_outage_longer_than_the_lease_reports_loss`, single server)",
        "a stalled holder is lost at its lease end, its key expires with its PTTL \
         (`is_held_is_false_at_the_lease_end_on_a_stalled_runtime`, `dlock torture`)",
    ),
    (
        "ZooKeeper",
        "holds survive a server restart within the session timeout, suspended meanwhile \
         (tests/zookeeper/restart.rs)",
        "a killed leader keeps exclusion and raises tokens (tests/ensemble.rs)",
        "a partitioned holder is lost; others get in when its session expires \
         (`renewal_outage_longer_than_the_lease_reports_loss`)",
        "a paused (SIGSTOP) holder's session expires: others get in, no overlap \
         (`dlock torture` in scripts/test)",
    ),
];

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: guarantees RESULTS_DIR > docs/guarantees.md");
        return ExitCode::from(64);
    };
    match render(Path::new(&dir)) {
        Ok(page) => {
            print!("{page}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("guarantees: {e}");
            ExitCode::FAILURE
        }
    }
}

/// label → case → outcome line ("passed", "unsupported: ...", "skipped: ...", "n/a: ...",
/// "inconclusive: ...").
type Results = BTreeMap<String, BTreeMap<String, String>>;

/// label → case → what the case measured ("what: value" lines).
type Measured = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn read(dir: &Path) -> Result<(Results, Measured), String> {
    let mut results = Results::new();
    let mut measured = Measured::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for folder in entries {
        let folder = folder.map_err(|e| e.to_string())?.path();
        if !folder.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&folder).map_err(|e| e.to_string())? {
            let file = file.map_err(|e| e.to_string())?.path();
            let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
            let mut lines = text.lines();
            let (Some(label), Some(outcome)) = (lines.next(), lines.next()) else {
                return Err(format!("{}: not a result file", file.display()));
            };
            let case = file
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| format!("{}: bad file name", file.display()))?;
            results
                .entry(label.to_owned())
                .or_default()
                .insert(case.to_owned(), outcome.to_owned());
            let figures: Vec<String> = lines
                .filter_map(|l| l.strip_prefix("measured: "))
                .map(str::to_owned)
                .collect();
            if !figures.is_empty() {
                measured
                    .entry(label.to_owned())
                    .or_default()
                    .insert(case.to_owned(), figures);
            }
        }
    }
    if results.is_empty() {
        return Err(format!("no results under {}", dir.display()));
    }
    Ok((results, measured))
}

fn columns(results: &Results) -> Vec<String> {
    let mut cols: Vec<String> = ORDER
        .iter()
        .filter(|l| results.contains_key(**l))
        .map(|l| (*l).to_owned())
        .collect();
    let rest: BTreeSet<&String> = results
        .keys()
        .filter(|l| !ORDER.contains(&l.as_str()))
        .collect();
    cols.extend(rest.into_iter().cloned());
    cols
}

fn render(dir: &Path) -> Result<String, String> {
    let (results, measured) = read(dir)?;
    let cols = columns(&results);
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "# Guarantees, backend by backend\n");
    let _ = writeln!(
        w,
        "Generated from the conformance results of `scripts/test` by `cargo run -p \
         dlock-conformance --example guarantees`; do not edit by hand. `scripts/test` fails \
         when this page is stale.\n"
    );
    let _ = writeln!(
        w,
        "Each cell counts the cases of that promise that **passed** against the real server \
         (see `dlock_conformance::CASES` for which case checks which promise). A case that \
         does not apply is counted apart, with its reason below: *unsupported* (the backend \
         refuses the feature, and a case checks that it says so), *n/a* (a case that checks a \
         refusal, on a backend that offers the feature), *skipped* (the test rig cannot \
         inject the fault there), *inconclusive* (the case ran, but its run proves nothing; \
         never counted as passed).\n"
    );
    let _ = writeln!(
        w,
        "**Exclusion** means: one holder per name for as long as no holder has been told its \
         hold is lost. Every hold has a lease (or a session) that ends it if its holder goes \
         quiet, and excludes while its holder runs within it: a holder paused past it (a stop, a long collection, a suspended machine) may still act \
         after another was granted the name, and only the fencing token, checked by the \
         resource, makes that late write harmless (`docs/reliability.md` counts such \
         overlaps, each explained by a fault and reported to its holder).\n"
    );
    let _ = write!(w, "| promise |");
    for c in &cols {
        let _ = write!(w, " {c} |");
    }
    let _ = writeln!(w);
    let _ = write!(w, "| --- |");
    for _ in &cols {
        let _ = write!(w, " --- |");
    }
    let _ = writeln!(w);
    for (point, title) in PROMISES {
        let cases: Vec<&str> = CASES
            .iter()
            .filter(|(_, p)| p == point)
            .map(|(n, _)| *n)
            .collect();
        let _ = write!(w, "| {point}. {title} ({}) |", cases.len());
        for c in &cols {
            let _ = write!(w, " {} |", cell(&results[c], &cases));
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w, "\n## Cases that did not apply, and why\n");
    let mut why: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for c in &cols {
        for (case, outcome) in &results[c] {
            if outcome != "passed" {
                why.entry((case.clone(), outcome.clone()))
                    .or_default()
                    .push(c.clone());
            }
        }
    }
    if why.is_empty() {
        let _ = writeln!(w, "Every case ran and passed on every backend.");
    }
    for ((case, outcome), labels) in &why {
        let _ = writeln!(w, "- `{case}` on {}: {outcome}", labels.join(", "));
    }
    let missing: Vec<String> = cols
        .iter()
        .flat_map(|c| {
            CASES
                .iter()
                .filter(|(n, _)| !results[c].contains_key(*n))
                .map(move |(n, _)| format!("{c}: {n}"))
        })
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "cases without a result (the run was partial or failed): {}",
            missing.join(", ")
        ));
    }
    let _ = writeln!(w, "\n## Horizons and drift allowance\n");
    let _ = writeln!(
        w,
        "A guard vouches for its hold until its *horizon*, the latest moment at which the \
         store cannot yet have given the lock to anyone else, less a drift allowance for \
         clock drift and a late process (`LockOptions::drift`, by default 1 % of the lease \
         plus 5 ms: 305 ms for the default 30 s watchdog lease). Past it `is_held()` is false \
         and `lost()` has resolved, whatever the network does; `run()` also stops its work \
         while the hold is suspended. `a_silent_holder_stops_before_the_lock_passes_on` \
         checks it on every backend with its default settings (the figures of the run that \
         made this page are at its end).\n"
    );
    let _ = writeln!(w, "| backend | horizon |");
    let _ = writeln!(w, "| --- | --- |");
    for (backend, horizon) in HORIZONS {
        let _ = writeln!(w, "| {backend} | {horizon} |");
    }
    let _ = writeln!(w, "\n## Under failure\n");
    let _ = writeln!(
        w,
        "What each backend promises when the infrastructure fails, and the test that shows \
         it. Fencing tokens are the answer to every window below: a resource that rejects \
         stale tokens stays safe.\n"
    );
    let _ = writeln!(
        w,
        "| backend | server restart | failover | partition | pause |"
    );
    let _ = writeln!(w, "| --- | --- | --- | --- | --- |");
    for (backend, restart, failover, partition, pause) in UNDER_FAILURE {
        let _ = writeln!(
            w,
            "| {backend} | {restart} | {failover} | {partition} | {pause} |"
        );
    }
    let _ = writeln!(w, "\n{MEASURED}\n");
    let _ = writeln!(
        w,
        "What the cases measured in the run that made this page (they vary from run to run; \
         `scripts/test` compares the page without this section).\n"
    );
    for c in &cols {
        let Some(cases) = measured.get(c) else {
            continue;
        };
        for (case, figures) in cases {
            let _ = writeln!(w, "- {c}, `{case}`: {}", figures.join("; "));
        }
    }
    Ok(out)
}

/// The heading of the last section, which `scripts/test` leaves out of its comparison.
const MEASURED: &str = "## Measured in the run that made this page";

/// Each backend's horizon: where the bound a guard vouches for comes from. Written by hand,
/// with the code it describes.
const HORIZONS: &[(&str, &str)] = &[
    (
        "memory",
        "the lease end, counted from the grant (the store's own clock)",
    ),
    (
        "SQLite, MySQL / MariaDB, PostgreSQL: unique-insert, optimistic",
        "the lease end, counted from when the granting (or renewing) statement was sent; the \
         server expires the row by its own clock",
    ),
    (
        "MySQL / MariaDB, PostgreSQL: for-update, advisory",
        "the lease end as above, and the connection that holds the row or advisory lock: a \
         broken connection ends the hold at once on the server (the watcher reports it \
         between renewals); a silent one keeps it there, and nobody else is granted the lock",
    ),
    (
        "Redis",
        "the lease end, counted from when the granting (or renewing) script was sent; the \
         key's PTTL ends it on the server",
    ),
    (
        "ZooKeeper",
        "the session: the send time of the last request the server answered (the provider \
         probes every quarter of the session timeout while it has holds) plus the negotiated \
         session timeout, less a quarter of it (a follower passes a session's touch to the \
         leader up to half a tick late); the lease end too, if earlier",
    ),
    (
        "etcd",
        "the provider's lease: the send time of the last keep-alive etcd answered plus the TTL \
         it granted; the lease end too, if earlier",
    ),
];

/// "n ✓", with the cases that did not pass counted by kind.
fn cell(results: &BTreeMap<String, String>, cases: &[&str]) -> String {
    let mut passed = 0;
    let mut other: BTreeMap<&str, usize> = BTreeMap::new();
    for case in cases {
        match results.get(*case).map(String::as_str) {
            Some("passed") => passed += 1,
            Some(o) => *other.entry(o.split(':').next().unwrap_or(o)).or_default() += 1,
            None => *other.entry("no result").or_default() += 1,
        }
    }
    let mut text = format!("{passed} ✓");
    for (kind, n) in other {
        let _ = write!(text, ", {n} {kind}");
    }
    text
}
