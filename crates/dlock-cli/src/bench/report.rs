//! The results of a run: one [`Row`] per store and workload, printed as a table, written and
//! read back as JSON, and compared with a baseline's ratios to the floor.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::exit;

/// One measurement.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Row {
    /// The backend and strategy, e.g. `mysql/optimistic`.
    pub backend: String,
    /// The workload.
    pub workload: String,
    /// Cycles (or handoffs, grants, locks) done.
    pub cycles: u64,
    /// Wall time of the workload.
    pub seconds: f64,
    /// Cycles per second.
    pub cycles_per_sec: f64,
    /// Acquire latency (W2, W4, W5: waiting time) percentiles, microseconds.
    pub acquire_p50_us: u64,
    /// 99th percentile, from at least 1,000 samples (else none).
    #[serde(default)]
    pub acquire_p99_us: Option<u64>,
    /// 99.9th percentile, from at least 10,000 samples (else none).
    #[serde(default)]
    pub acquire_p999_us: Option<u64>,
    /// W3: from the holder's release call to the waiter's acquire returning, microseconds.
    pub handoff_p50_us: Option<u64>,
    /// W3: 99th percentile, from at least 1,000 handoffs (else none).
    pub handoff_p99_us: Option<u64>,
    /// W2: overlaps seen plus lost counter updates (must be 0).
    pub violations: u64,
    /// W1 and W4: the floor's cycles per second (the same server calls made with the client
    /// library only, from 1 and 8 clients).
    pub floor_cycles_per_sec: Option<f64>,
    /// W1 and W4: `cycles_per_sec / floor_cycles_per_sec`.
    pub ratio_to_floor: Option<f64>,
    /// W1: the client's CPU time per cycle of the floor (its cycles only, not its
    /// connecting), microseconds: set against `cpu_us_per_cycle`, what dlock's client adds.
    #[serde(default)]
    pub floor_cpu_us_per_cycle: Option<f64>,
    /// W1 of a SQL for-update lock: the cycles per second of its row lock alone made raw
    /// (`BEGIN`, `SELECT … FOR UPDATE`, `ROLLBACK`), without the fencing token dlock takes and
    /// commits: what a lock without a fence would cost.
    #[serde(default)]
    pub lock_floor_cycles_per_sec: Option<f64>,
    /// W1 of a SQL for-update lock: `cycles_per_sec / lock_floor_cycles_per_sec`.
    #[serde(default)]
    pub ratio_to_lock_floor: Option<f64>,
    /// W2, W2F: the share of cycles (percent) whose holder was not the previous cycle's
    /// holder (8 clients taking turns fairly: about 100; a lock that starves: near 0).
    #[serde(default)]
    pub owner_switch_pct: Option<f64>,
    /// W2, W2F, W4: the longest acquire, milliseconds.
    #[serde(default)]
    pub max_wait_ms: Option<f64>,
    /// W1-W4: the process's CPU time (user + system, `getrusage`) over the workload divided by
    /// its cycles, microseconds: what one cycle costs the client.
    #[serde(default)]
    pub cpu_us_per_cycle: Option<f64>,
    /// W5: waiters served out of the order they queued in.
    pub out_of_order: Option<u64>,
    /// W5: longest minus shortest wait, milliseconds.
    pub wait_spread_ms: Option<f64>,
    /// W6: resident memory growth while holding the locks, KiB.
    pub memory_kib: Option<i64>,
    /// W6: server connections the client opened for the 1,000 locks, where measurable.
    pub server_connections: Option<i64>,
    /// W8: the names held at once (`cycles` is the same; `cycles_per_sec` the renewals per
    /// second).
    #[serde(default)]
    pub holds: Option<u64>,
    /// W8: how long taking them all took, seconds.
    #[serde(default)]
    pub grant_secs: Option<f64>,
    /// W8: calls to the store that carried renewals, per second (a batch is one call).
    #[serde(default)]
    pub renewal_calls_per_sec: Option<f64>,
    /// W8: the client's resident memory growth per hold, bytes.
    #[serde(default)]
    pub client_bytes_per_hold: Option<f64>,
    /// W8: the server's memory growth per hold, bytes, where the store says (Redis).
    #[serde(default)]
    pub server_bytes_per_hold: Option<f64>,
    /// W8P: the worker processes, each with a provider of its own, that ran the cycles.
    #[serde(default)]
    pub processes: Option<u64>,
    /// W9: the cycles per second offered (due at a fixed rate, whatever the store answers);
    /// its latencies run from when each cycle was due.
    #[serde(default)]
    pub offered_per_sec: Option<f64>,
    /// W9: the cycles per second of the closed loop it offers a share of (W7's, in the same
    /// run).
    #[serde(default)]
    pub closed_loop_per_sec: Option<f64>,
    /// Why the workload was skipped, if it was.
    pub skipped: Option<String>,
    /// What failed after the row was measured, if anything (W8: giving the holds back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub afterwards: Option<String>,
}

impl Row {
    /// The row of `workload` on `backend`, with nothing measured yet.
    pub(super) fn new(backend: &str, workload: String) -> Self {
        Self {
            backend: backend.to_owned(),
            workload,
            ..Self::default()
        }
    }

    /// The row of `workload` on `backend`, skipped for the reason `why`.
    pub(super) fn skipped(backend: &str, workload: String, why: String) -> Self {
        Self {
            skipped: Some(why),
            ..Self::new(backend, workload)
        }
    }
}

/// A ratio to the floor that fell more than this fraction below the baseline's.
const REGRESSION: f64 = 0.20;

/// The ratios of `rows` that fell more than [`REGRESSION`] below those of the same backend
/// and workload in `baseline`, as lines to print.
pub(super) fn regressions(baseline: &[Row], rows: &[Row]) -> Vec<String> {
    let mut found = Vec::new();
    for r in rows {
        let Some(now) = r.ratio_to_floor else {
            continue;
        };
        let before = baseline
            .iter()
            .find(|b| b.backend == r.backend && b.workload == r.workload)
            .and_then(|b| b.ratio_to_floor);
        if let Some(before) = before
            && now < before * (1.0 - REGRESSION)
        {
            found.push(format!(
                "{} {}: {:.0}% of its floor, was {:.0}%",
                r.backend,
                r.workload,
                now * 100.0,
                before * 100.0
            ));
        }
    }
    found
}

/// With `--baseline`: prints the regressions against it; the exit code if the run must fail
/// (a regression: 1, an unreadable file: CONFIG).
pub(super) fn compare_with_baseline(baseline: Option<&Path>, rows: &[Row]) -> Option<u8> {
    let path = baseline?;
    let before = match load(path) {
        Ok(rows) => rows,
        Err(code) => return Some(code),
    };
    let found = regressions(&before, rows);
    if found.is_empty() {
        say!(
            "no ratio to the floor fell more than 20% below {}",
            path.display()
        );
        return None;
    }
    eprintln!("dlock bench: REGRESSIONS against {}:", path.display());
    for line in &found {
        eprintln!("  {line}");
    }
    Some(1)
}

/// Reads the rows of an earlier `--json` run; an unreadable file is said on stderr, and is the
/// exit status CONFIG.
pub(super) fn load(path: &Path) -> Result<Vec<Row>, u8> {
    read(path).map_err(|e| {
        eprintln!("dlock bench: {e}");
        exit::CONFIG
    })
}

/// Writes the rows as the JSON document `--json` asks for (with the command line and the
/// machine's CPU count); a file that cannot be written is said, and is the exit status
/// SOFTWARE.
pub(super) fn write_json(path: &Path, rows: &[Row]) -> Result<(), u8> {
    let doc = serde_json::json!({
        "version": 1,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": { "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) },
        "rows": rows,
    });
    let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    std::fs::write(path, text).map_err(|e| {
        eprintln!("dlock bench: cannot write {}: {e}", path.display());
        exit::SOFTWARE
    })
}

fn read(path: &Path) -> Result<Vec<Row>, String> {
    #[derive(Deserialize)]
    struct Doc {
        rows: Vec<Row>,
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str::<Doc>(&text)
        .map(|d| d.rows)
        .map_err(|e| format!("{} is not a dlock bench JSON file: {e}", path.display()))
}

/// Prints the rows as a table, one line each, with what a column cannot hold as notes.
pub(super) fn print_table(rows: &[Row]) {
    say!(
        "{:<24} {:<8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8}  notes",
        "backend",
        "wl",
        "cycles",
        "cycles/s",
        "acq p50",
        "acq p99",
        "acq p999",
        "hand p50",
        "hand p99",
        "viol",
        "x floor",
    );
    for r in rows {
        let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| format!("{v}us"));
        let mut notes = Vec::new();
        if let Some(s) = &r.skipped {
            notes.push(format!("skipped: {s}"));
        }
        if let Some(a) = &r.afterwards {
            notes.push(format!("afterwards: {a}"));
        }
        if let Some(o) = r.out_of_order {
            notes.push(format!(
                "out of order {o}/8, spread {:.1} ms",
                r.wait_spread_ms.unwrap_or(0.0)
            ));
        }
        if let (Some(n), Some(c)) = (r.holds, r.renewal_calls_per_sec) {
            notes.push(format!(
                "{n} holds: {:.0} renewals/s in {c:.1} calls/s",
                r.cycles_per_sec
            ));
        }
        if let (Some(o), Some(c)) = (r.offered_per_sec, r.closed_loop_per_sec) {
            notes.push(format!(
                "offered {o:.0}/s ({:.0}% of the closed loop's {c:.0}/s), latency from due",
                o / c * 100.0
            ));
        }
        if let Some(t) = r.grant_secs {
            notes.push(format!("taken in {t:.1} s"));
        }
        if let Some(b) = r.client_bytes_per_hold {
            notes.push(format!("client {b:.0} B/hold"));
        }
        if let Some(b) = r.server_bytes_per_hold {
            notes.push(format!("server {b:.0} B/hold"));
        }
        if let Some(m) = r.memory_kib {
            notes.push(format!("mem +{m} KiB"));
        }
        if let Some(c) = r.server_connections {
            notes.push(format!("server conns +{c}"));
        }
        if let Some(f) = r.floor_cycles_per_sec {
            notes.push(match r.floor_cpu_us_per_cycle {
                Some(c) => format!("floor {f:.0}/s ({c:.0} us cpu/cycle)"),
                None => format!("floor {f:.0}/s"),
            });
        }
        if let (Some(f), Some(x)) = (r.lock_floor_cycles_per_sec, r.ratio_to_lock_floor) {
            notes.push(format!("{:.0}% of the lock alone ({f:.0}/s)", x * 100.0));
        }
        if let Some(s) = r.owner_switch_pct {
            notes.push(format!("owner switches {s:.0}%"));
        }
        if let Some(m) = r.max_wait_ms {
            notes.push(format!("max wait {m:.1} ms"));
        }
        if let Some(c) = r.cpu_us_per_cycle {
            notes.push(format!("cpu {c:.0} us/cycle"));
        }
        say!(
            "{:<24} {:<8} {:>7} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8}  {}",
            r.backend,
            r.workload,
            r.cycles,
            r.cycles_per_sec,
            format!("{}us", r.acquire_p50_us),
            opt(r.acquire_p99_us),
            opt(r.acquire_p999_us),
            opt(r.handoff_p50_us),
            opt(r.handoff_p99_us),
            r.violations,
            r.ratio_to_floor
                .map_or("-".to_owned(), |x| format!("{:.0}%", x * 100.0)),
            notes.join("; ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{Row, regressions};

    /// A ratio that fell more than 20 % is a regression; one that fell less, rose, or has
    /// nothing to compare with is not.
    #[test]
    fn regressions_are_ratios_that_fell_more_than_a_fifth() {
        let row = |backend: &str, workload: &str, ratio: Option<f64>| Row {
            backend: backend.into(),
            workload: workload.into(),
            ratio_to_floor: ratio,
            ..Row::default()
        };
        let before = [
            row("redis", "W1", Some(0.90)),
            row("redis", "W4", Some(0.90)),
            row("zk", "W1", Some(0.90)),
        ];
        let now = [
            row("redis", "W1", Some(0.70)),
            row("redis", "W4", Some(0.75)),
            row("zk", "W1", Some(1.20)),
            row("etcd", "W1", Some(0.10)),
            row("zk", "W4", None),
        ];
        assert_eq!(
            regressions(&before, &now),
            ["redis W1: 70% of its floor, was 90%"]
        );
    }
}
