//! Fenced writes, from the resource's ledger: accepted tokens rise per name, and its counter
//! equals its accepted writes (no lost fenced update). The resource refuses a stale token
//! itself, so this checks the harness, not the store (the store's tokens are `tokens`' to
//! judge). Also counts the unfenced counter's lost updates (what fencing saved).

use std::collections::HashMap;

use super::Report;
use super::model::Run;

/// Checks the ledger of the shared resource.
pub(super) fn check(run: &Run<'_>, report: &mut Report) {
    let ledger = run.ledger;
    report.fenced_accepted = ledger.accepted.len() as u64;
    report.fenced_refused = ledger.refused;
    let mut last: HashMap<&str, u64> = HashMap::new();
    let mut count: HashMap<&str, u64> = HashMap::new();
    for a in &ledger.accepted {
        let prev = last.insert(&a.name, a.token);
        if prev.is_some_and(|p| a.token <= p) {
            report.fenced_violations += 1;
            report.violations.push(format!(
                "the resource accepted token {} on {} after {:?}",
                a.token, a.name, prev
            ));
        }
        *count.entry(&a.name).or_default() += 1;
    }
    for (name, n) in count {
        let value = ledger.fenced.get(name).copied().unwrap_or(0);
        if value != n {
            report.fenced_violations += 1;
            report.violations.push(format!(
                "lost fenced update on {name}: {n} writes accepted, counter at {value}"
            ));
        }
    }
    report.unfenced_lost_updates = ledger
        .unfenced
        .values()
        .map(|(value, writes)| writes.saturating_sub(*value))
        .sum();
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::fixtures::{TERMS, assert_violation};
    use super::super::{Terms, check};
    use crate::torture::history::Accepted;
    use crate::torture::resource::Ledger;

    #[test]
    fn lost_fenced_updates_are_violations() {
        let mut ledger = Ledger::default();
        for token in [1, 2] {
            ledger.accepted.push(Accepted {
                t: token,
                name: "n".into(),
                token,
                value: 1,
            });
        }
        ledger.fenced.insert("n".into(), 1);
        let terms = Terms {
            lease: Duration::ZERO,
            span: Duration::ZERO,
            slack: Duration::ZERO,
            ..TERMS
        };
        let r = check(&[], &[], &ledger, (0, 0), terms);
        assert_violation(&r, "lost fenced update");
    }
}
