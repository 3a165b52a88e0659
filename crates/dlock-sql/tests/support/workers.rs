//! Worker processes: this test binary run again, doing one job on its own pools.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// A worker process, killed if the test ends (or fails) while it still runs.
pub(crate) struct Worker(std::process::Child);

impl std::ops::Deref for Worker {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Worker {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn spawn_worker(mode: &str, url: &str, name: &str, cycles: u32) -> Worker {
    Worker(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "separate_processes::worker_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DLOCK_WORKER", mode)
            .env("DLOCK_WORKER_URL", url)
            .env("DLOCK_WORKER_NAME", name)
            .env("DLOCK_WORKER_CYCLES", cycles.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

/// Waits until the worker says it holds the lock (the test harness prints its own lines
/// first), and fails the test if it ends without saying so.
pub(crate) fn await_held(child: &mut Worker, label: &str) {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let held = tokio::task::block_in_place(|| {
        let mut line = String::new();
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            if line.trim_end().ends_with("HELD") {
                return true;
            }
            line.clear();
        }
        false
    });
    assert!(held, "{label}: the worker never held the lock");
}
