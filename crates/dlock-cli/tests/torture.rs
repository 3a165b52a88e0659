//! `dlock torture` end to end: an honest store passes, and the checker catches a lock without
//! exclusion, a lock whose tokens repeat, and a lock that never reports a loss; bad input gets
//! a clear error and exit code; nothing is left running.

use std::process::{Command, Output, Stdio};

use dlock_conformance::Names;

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// A scratch SQLite file (and the per-worker files of the no-exclusion sabotage), removed at
/// the end.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Self {
        let unique = Names::new().prefix().replace('/', "-");
        Self(std::env::temp_dir().join(format!("dlock-torture{unique}db")))
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let base = self.0.display().to_string();
        for w in ["".to_string()]
            .into_iter()
            .chain((0..8).map(|i| format!(".w{i}")))
        {
            for s in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{base}{w}{s}"));
            }
        }
    }
}

fn torture(args: &[&str]) -> Output {
    Command::new(DLOCK)
        .arg("torture")
        .args(args)
        .env_remove("DLOCK_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Processes whose command line holds `needle` (to find leftover workers of one run).
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains("torture-worker") && text.contains(needle) {
                found.push(text);
            }
        }
    }
    found
}

/// A run's short SQLite attack with the given sabotage (if any): its output.
fn attack(scratch: &Scratch, seed: &str, sabotage: Option<&str>) -> Output {
    let url = scratch.url();
    let mut args = vec![
        "--url",
        &url,
        "--processes",
        "4",
        "--duration",
        "10s",
        "--lease",
        "1s",
        "--names",
        "2",
        "--faults",
        "pause",
        "--seed",
        seed,
    ];
    if let Some(s) = sabotage {
        args.extend(["--sabotage", s]);
    }
    torture(&args)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn an_honest_store_passes_and_nothing_is_left_running() {
    let scratch = Scratch::new();
    let out = attack(&scratch, "424242", None);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("no violation"), "{all}");
    assert!(all.contains("replay: dlock torture"), "{all}");
    assert!(
        processes_with("--seed 424242").is_empty(),
        "workers left running: {:?}",
        processes_with("--seed 424242")
    );
}

#[test]
fn a_lock_without_exclusion_is_caught() {
    let scratch = Scratch::new();
    let out = attack(&scratch, "101", Some("no-exclusion"));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("unexplained overlap"), "{all}");
}

#[test]
fn a_lock_whose_tokens_repeat_is_caught() {
    let scratch = Scratch::new();
    let out = attack(&scratch, "202", Some("repeat-tokens"));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("issued twice") || all.contains("went backwards"),
        "{all}"
    );
}

#[test]
fn a_lock_that_never_reports_loss_is_caught() {
    let scratch = Scratch::new();
    let out = attack(&scratch, "303", Some("no-loss"));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("never told"), "{all}");
}

#[test]
fn bad_input_gets_a_clear_error_and_exit_code() {
    let scratch = Scratch::new();
    let url = scratch.url();
    let cases: [(&[&str], i32, &str); 6] = [
        (&["--url", &url, "--faults", "meteor"], 2, "meteor"),
        (&["--url", &url, "--seed", "soon"], 2, "soon"),
        (&["--url", &url, "--processes", "1"], 2, "processes"),
        (
            &["--url", "redis://:hunter2@127.0.0.1:1", "--duration", "2s"],
            69,
            "127.0.0.1:1",
        ),
        (
            &["--url", "memory://", "--duration", "2s"],
            78,
            "one process",
        ),
        (&["--url", "nonsense"], 78, "nonsense"),
    ];
    for (args, code, says) in cases {
        let out = torture(args);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {all}");
        assert!(all.contains(says), "{args:?}: {all}");
        assert!(
            !all.contains("panicked") && !all.contains("hunter2"),
            "{all}"
        );
    }
}
