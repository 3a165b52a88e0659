//! What an attack on one store reports: the checker's report with the run's settings, printed
//! for a reader, as JSON, and the command line that replays it; the history as JSON lines.

use std::time::Duration;

use serde::Serialize;

use super::check::Report;
use super::history::{Accepted, FaultRecord, Stamped};
use super::{Primitive, TortureOpts};

/// The report of one store.
#[derive(Debug, Serialize)]
pub(super) struct StoreReport {
    url: String,
    seed: u64,
    processes: u32,
    duration_s: f64,
    /// `defaults` (the library's default options and the store's default session) or
    /// `short` (`--lease`).
    mode: &'static str,
    /// The workers' watchdog lease.
    lease_ms: u64,
    /// How long the store keeps a silent holder's hold: the lease, or the session.
    span_ms: u64,
    /// The rate of the first worker's clock, when it drifts.
    clock_rate: Option<f64>,
    primitives: Vec<String>,
    faults_planned: usize,
    command: String,
    #[serde(flatten)]
    report: Report,
}

impl StoreReport {
    /// The report of the store `shown` (its URL without passwords) of `span`, attacked with
    /// `seed` by the workers of `primitives` along a plan of `faults_planned` faults.
    pub(super) fn new(
        opts: &TortureOpts,
        shown: String,
        (seed, span): (u64, Duration),
        primitives: &[Primitive],
        faults_planned: usize,
        report: Report,
    ) -> Self {
        let primitives: Vec<String> = primitives
            .iter()
            .map(|p| format!("{p:?}").to_lowercase())
            .collect();
        let command = replay(opts, &shown, seed, &primitives);
        Self {
            url: shown,
            seed,
            processes: opts.processes,
            duration_s: opts.duration.as_secs_f64(),
            mode: if opts.defaults { "defaults" } else { "short" },
            lease_ms: millis(opts.lease),
            span_ms: millis(span),
            clock_rate: opts.clock_rate,
            primitives,
            faults_planned,
            command,
            report,
        }
    }

    /// Whether the checker found a violation.
    pub(super) fn violated(&self) -> bool {
        !self.report.violations.is_empty()
    }

    /// Prints the report for a reader.
    pub(super) fn print(&self) {
        let rep = &self.report;
        say!(
            "{}: {} processes, {:.0} s, {} lease {} ms, span {} ms{}, seed {}: {} holds; faults \
             {:?}",
            dlock::redact(&self.url),
            self.processes,
            self.duration_s,
            self.mode,
            self.lease_ms,
            self.span_ms,
            self.clock_rate
                .map_or_else(String::new, |r| format!(", first worker's clock at {r}")),
            self.seed,
            rep.holds,
            rep.faults
        );
        say!(
            "  fenced writes: {} accepted, {} refused as stale, {} fencing violations; {} grants \
             stamped late after a pause",
            rep.fenced_accepted,
            rep.fenced_refused,
            rep.fenced_violations,
            rep.late_grants_explained
        );
        say!(
            "  overlaps: {} explained by a fault, {} unexplained, {} told late; {} unfenced \
             updates lost",
            rep.overlaps_explained,
            rep.overlaps_unexplained,
            rep.told_late,
            rep.unfenced_lost_updates
        );
        let reasons: Vec<String> = rep
            .losses_by_reason
            .iter()
            .map(|(reason, n)| format!("{reason}: {n}"))
            .collect();
        say!(
            "  losses reported: {}{}{}; worst report delay after an overlap began: {}; worst \
             recovery after a fault: {}",
            rep.losses_reported,
            if reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", reasons.join(", "))
            },
            if rep.lost_before_use == 0 {
                String::new()
            } else {
                format!(
                    ", and {} holds lost before their critical section began (not used)",
                    rep.lost_before_use
                )
            },
            match rep.worst_report_delay_ms {
                None => "-".to_string(),
                Some(d) => {
                    let by: Vec<String> = rep
                        .worst_report_delay_by_fault_ms
                        .iter()
                        .map(|(kind, d)| format!("{kind}: {d} ms"))
                        .collect();
                    format!("{d} ms ({})", by.join(", "))
                }
            },
            rep.worst_recovery_ms
                .map_or("-".to_string(), |d| format!("{d} ms"))
        );
        if rep.fair_pairs_checked > 0 {
            say!(
                "  fairness: {} pairs of fair waiters checked, {} overtakes explained by a fault",
                rep.fair_pairs_checked,
                rep.fair_overtakes_explained
            );
        }
        say!("  replay: {}", self.command);
        if rep.violations.is_empty() {
            say!("  no violation");
        } else {
            say!("  {} VIOLATIONS:", rep.violations.len());
            for v in &rep.violations {
                say!("  - {v}");
            }
        }
    }
}

/// The command line that replays the attack on `shown` with `seed`.
fn replay(opts: &TortureOpts, shown: &str, seed: u64, primitives: &[String]) -> String {
    let faults: Vec<String> = opts.faults.iter().map(ToString::to_string).collect();
    let lease = if opts.defaults {
        "--defaults".to_owned()
    } else {
        format!("--lease {}", humantime::format_duration(opts.lease))
    };
    format!(
        "dlock torture --url '{shown}' --processes {} --duration {} --faults {} \
         --primitives {} --names {} {lease} --hold {} --seed {seed}{}{}",
        opts.processes,
        humantime::format_duration(opts.duration),
        faults.join(","),
        primitives.join(","),
        opts.names,
        humantime::format_duration(opts.hold),
        opts.clock_rate
            .map_or_else(String::new, |r| format!(" --clock-rate {r}")),
        opts.restart_cmd
            .as_ref()
            .map_or_else(String::new, |cmd| format!(
                " --restart-cmd '{}'",
                cmd.replace('\'', r"'\''")
            )),
    )
}

/// Writes the whole history as JSON lines: every worker event (in the order read; a drifting
/// worker's come together, when its output ended), then every fault, then every write the
/// resource accepted.
pub(super) fn write_history(
    out: &mut impl std::io::Write,
    history: &[Stamped],
    faults: &[FaultRecord],
    accepted: &[Accepted],
) {
    fn lines(out: &mut impl std::io::Write, items: &[impl Serialize]) {
        for item in items {
            if let Ok(line) = serde_json::to_string(item) {
                let _ = writeln!(out, "{line}");
            }
        }
    }
    lines(out, history);
    lines(out, faults);
    lines(out, accepted);
    let _ = out.flush();
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
