//! How each case ended, for `docs/guarantees.md`: passed, unsupported or skipped, with why.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use dlock_core::backend::Mutex;

use crate::Factory;

/// How a case ended, short of failing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every assertion held.
    Passed,
    /// The backend does not offer what the case tests (its capabilities say so).
    Unsupported(String),
    /// The case could not run here: the factory lacks a hook it needs.
    Skipped(String),
    /// The case checks a refusal the backend has no reason to make (it offers the feature).
    NotApplicable(String),
    /// The case ran but its run proves nothing (the machine stalled through the window it
    /// watches, or the event it needs never came): neither passed nor failed.
    Inconclusive(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Passed => f.write_str("passed"),
            Self::Unsupported(why) => write!(f, "unsupported: {why}"),
            Self::Skipped(why) => write!(f, "skipped: {why}"),
            Self::NotApplicable(why) => write!(f, "n/a: {why}"),
            Self::Inconclusive(why) => write!(f, "inconclusive: {why}"),
        }
    }
}

struct Current {
    outcome: Mutex<Option<Outcome>>,
    /// The outcome is inconclusive for a passing reason (the machine stalled): run again.
    again: std::sync::atomic::AtomicBool,
    /// What the case measured, as `what: value` lines for the results file.
    measured: Mutex<Vec<String>>,
}

tokio::task_local! {
    static CURRENT: Arc<Current>;
}

/// Notes that the running case ends without testing anything (called by the cases).
pub(crate) fn note(outcome: Outcome) {
    let _ = CURRENT.try_with(|c| {
        *c.outcome.lock() = Some(outcome);
    });
}

/// Notes that this run proves nothing because the machine stalled through the window the
/// case watches: the case is run again (up to [`RUNS`] times) before it is recorded so.
pub(crate) fn inconclusive_by_chance(why: String) {
    note(Outcome::Inconclusive(why));
    let _ = CURRENT.try_with(|c| c.again.store(true, std::sync::atomic::Ordering::SeqCst));
}

/// How many times a case runs at most when its runs are inconclusive by chance.
pub(crate) const RUNS: usize = 3;

/// Records a figure the case measured (a margin, a delay), for `docs/guarantees.md`.
pub(crate) fn measure(what: &str, value: impl fmt::Display) {
    let _ = CURRENT.try_with(|c| {
        c.measured.lock().push(format!("measured: {what}: {value}"));
    });
}

/// Runs one case (the future `body` makes) against `factory` and records how it ended when
/// `DLOCK_RESULTS_DIR` is set (a case that fails panics, and records nothing). A run that is
/// inconclusive by chance (a stalled machine) is made again, up to three runs in all.
pub async fn run<F, B, Fut>(factory: &F, case: &str, body: B)
where
    F: Factory,
    B: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut current;
    let mut runs = 0;
    loop {
        current = Arc::new(Current {
            outcome: Mutex::new(None),
            again: std::sync::atomic::AtomicBool::new(false),
            measured: Mutex::new(Vec::new()),
        });
        CURRENT.scope(Arc::clone(&current), body()).await;
        runs += 1;
        if runs >= RUNS || !current.again.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        eprintln!("{case}: inconclusive by chance; running it again");
    }
    let outcome = current.outcome.lock().take().unwrap_or(Outcome::Passed);
    let Some(dir) = std::env::var_os("DLOCK_RESULTS_DIR") else {
        return;
    };
    let label = factory.label();
    let folder: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let dir = std::path::Path::new(&dir).join(folder);
    let mut text = format!("{label}\n{outcome}\n");
    for line in current.measured.lock().iter() {
        text.push_str(line);
        text.push('\n');
    }
    let written = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join(case), text));
    if let Err(e) = written {
        panic!(
            "cannot record the result of {case} in {}: {e}",
            dir.display()
        );
    }
}
