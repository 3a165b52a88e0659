//! The workloads across processes: W2P (W2's 8 clients, each a process of its own), W3P (W3's
//! pair of processes) and W8P (1, 4, 16 and 64 worker processes, each cycling on a name of
//! its own). In one process, a release wakes a waiter of the same process without a round trip
//! to the store; across processes every wake-up goes through it, as between the machines of a
//! fleet.
//!
//! Each worker is this program's hidden `bench-worker` ([`worker`](super::worker)), with a
//! provider of its own. All connect first and say they are ready; then all are told to go at
//! once, and the workload's time runs from the go to the last report.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::measure::{fill_handoff, fill_latency, finish, histogram, namespace, uuid_like};
use super::targets::Target;
use super::worker::{BOARD_BYTES, Board, Report, Role, Slot, WORKER_URL};
use super::{BenchOpts, Row, Workload};

/// W2P's worker processes, as W2's clients.
const CONTENDERS: u64 = 8;

/// W8P's counts of worker processes, a row each.
pub(super) const SCALE: [u64; 4] = [1, 4, 16, 64];

/// How long the workers may take to connect and say they are ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The rows of `workload` (W2P, W3P or W8P) on `target`.
pub(super) async fn rows(
    target: &Target,
    workload: Workload,
    opts: &BenchOpts,
) -> dlock::Result<Vec<Row>> {
    let label = format!("{workload:?}");
    if target.url.starts_with("memory:") {
        // A memory store lives in its process: across processes there is nothing shared.
        return Ok(vec![Row::skipped(
            &target.label,
            label,
            "the memory store is one process's".into(),
        )]);
    }
    let ns = namespace();
    match workload {
        Workload::W2P | Workload::W2PF => {
            let fair = workload == Workload::W2PF;
            let mut row = Row::new(&target.label, label);
            if fair && !target.client().await?.capabilities().fair {
                row.skipped = Some("no fair locks".into());
                return Ok(vec![row]);
            }
            let per = (opts.cycles * 2 / CONTENDERS).max(1);
            let crew = Crew {
                target,
                role: Role::Contend,
                name: &|_| format!("{ns}/w2p"),
                cycles: per,
                fair,
            };
            let run = crew.run(CONTENDERS).await?;
            run.fill(&mut row, Fill::Acquire);
            let board = &run.board;
            let lost = run.cycles.saturating_sub(board.get(Slot::Counter)?);
            row.violations = board.get(Slot::Overlaps)?.saturating_add(lost);
            let switched = board.get(Slot::Switches)?.saturating_sub(1);
            row.owner_switch_pct =
                Some(100.0 * switched as f64 / run.cycles.saturating_sub(1).max(1) as f64);
            Ok(vec![row])
        }
        Workload::W3P => {
            let mut row = Row::new(&target.label, label);
            let crew = Crew {
                target,
                role: Role::Handoff,
                name: &|_| format!("{ns}/w3p"),
                cycles: (opts.cycles / 4).max(2),
                fair: false,
            };
            crew.run(2).await?.fill(&mut row, Fill::Handoff);
            Ok(vec![row])
        }
        _ => {
            let total = (opts.cycles * 2).max(SCALE[SCALE.len() - 1]);
            let mut rows = Vec::new();
            for procs in SCALE {
                let mut row = Row::new(&target.label, format!("{label}/{procs}"));
                let crew = Crew {
                    target,
                    role: Role::Own,
                    name: &|i| format!("{ns}/w8p/{i}"),
                    cycles: total / procs,
                    fair: false,
                };
                match crew.run(procs).await {
                    Ok(run) => run.fill(&mut row, Fill::Acquire),
                    // The store's limit (connections, most often) is this row's finding;
                    // the smaller counts' rows stand.
                    Err(e) => row.skipped = Some(format!("error: {e}")),
                }
                row.processes = Some(procs);
                rows.push(row);
            }
            Ok(rows)
        }
    }
}

/// The workers of one workload.
struct Crew<'a> {
    target: &'a Target,
    role: Role,
    /// The lock name of worker `i`.
    name: &'a (dyn Fn(u64) -> String + Sync),
    /// Cycles of each worker (W3P: handoffs of the pair).
    cycles: u64,
    fair: bool,
}

/// What a crew's run measured.
struct CrewRun {
    /// Cycles done by all workers.
    cycles: u64,
    /// From the go to the last report.
    elapsed: Duration,
    /// All workers' latencies.
    latencies: hdrhistogram::Histogram<u64>,
    /// All workers' CPU time, if each said.
    cpu: Option<Duration>,
    /// The board, kept until its counters are read.
    board: BoardFile,
}

/// Which of a row's latencies a run's fill.
#[derive(Clone, Copy)]
enum Fill {
    Acquire,
    Handoff,
}

impl CrewRun {
    /// The row's cycles, rate, CPU per cycle and latencies.
    fn fill(&self, row: &mut Row, what: Fill) {
        finish(row, self.cycles, self.elapsed);
        row.cpu_us_per_cycle = self
            .cpu
            .and_then(|c| (self.cycles > 0).then(|| c.as_secs_f64() * 1e6 / self.cycles as f64));
        match what {
            Fill::Acquire => {
                fill_latency(row, &self.latencies);
                row.max_wait_ms = Some(self.latencies.max() as f64 / 1000.0);
            }
            Fill::Handoff => fill_handoff(row, &self.latencies),
        }
    }
}

impl Crew<'_> {
    /// Starts `n` workers, waits until all are ready, tells them to go, and gathers their
    /// reports. A worker that fails ends the run with its error; the others are killed.
    async fn run(&self, n: u64) -> dlock::Result<CrewRun> {
        let board = BoardFile::new()?;
        let exe = std::env::current_exe()
            .map_err(|e| dlock::Error::config(format!("this program's path: {e}")))?;
        let mut workers = Vec::new();
        for id in 0..n {
            workers.push(self.start(&exe, id, board.path())?);
        }
        let ready = async {
            for w in &mut workers {
                w.ready().await.map_err(|e| worker_failed(w.id, e))?;
            }
            Ok::<_, dlock::Error>(())
        };
        tokio::time::timeout(READY_WITHIN, ready)
            .await
            .map_err(|_| {
                dlock::Error::config(format!(
                    "the workers were not ready within {READY_WITHIN:?}"
                ))
            })??;
        let started = Instant::now();
        for w in &mut workers {
            w.go().await?;
        }
        // All reports at once: the first worker that fails (or ends without a report) ends
        // the run, and the others, which may wait for it (W3P's pair), are killed as the
        // crew is dropped.
        let reports = futures::future::try_join_all(workers.iter_mut().map(|w| async {
            let r = w.report().await?;
            match r.error {
                Some(e) => Err(worker_failed(w.id, e)),
                None => Ok(r),
            }
        }))
        .await?;
        let mut latencies = histogram()?;
        let (mut cycles, mut cpu) = (0, Some(Duration::ZERO));
        for r in reports {
            cycles += r.cycles;
            cpu = cpu
                .zip(r.cpu_us)
                .and_then(|(sum, us)| sum.checked_add(Duration::from_secs_f64(us.max(0.0) / 1e6)));
            for (value, count) in r.latencies {
                let _ = latencies.record_n(value, count);
            }
        }
        let elapsed = started.elapsed();
        for mut w in workers {
            let _ = w.child.wait().await;
        }
        Ok(CrewRun {
            cycles,
            elapsed,
            latencies,
            cpu,
            board,
        })
    }

    /// Starts worker `id`.
    fn start(&self, exe: &Path, id: u64, board: &Path) -> dlock::Result<Worker> {
        let mut cmd = Command::new(exe);
        cmd.arg("bench-worker")
            .arg("--id")
            .arg(id.to_string())
            // The URL may carry a password: in the environment, not on the command line.
            .env(WORKER_URL, &self.target.url)
            .arg("--name")
            .arg((self.name)(id))
            .arg("--role")
            .arg(match self.role {
                Role::Contend => "contend",
                Role::Handoff => "handoff",
                Role::Own => "own",
            })
            .arg("--cycles")
            .arg(self.cycles.to_string())
            .arg("--board")
            .arg(board)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if self.fair {
            cmd.arg("--fair");
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| dlock::Error::config(format!("cannot start a worker: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(dlock::Error::config("a worker without its pipes"));
        };
        Ok(Worker {
            id,
            child,
            stdin,
            lines: BufReader::new(stdout),
        })
    }
}

/// The error of worker `id`, from what it said.
fn worker_failed(id: u64, what: String) -> dlock::Error {
    dlock::Error::backend(
        "dlock bench-worker",
        format!("worker {id}: {what}"),
        false,
        std::io::Error::other(what),
    )
}

/// A worker process and its pipes.
struct Worker {
    id: u64,
    child: Child,
    stdin: ChildStdin,
    lines: BufReader<ChildStdout>,
}

impl Worker {
    /// The worker's next line; an error if it ended without one.
    async fn line(&mut self) -> dlock::Result<String> {
        let mut line = String::new();
        match self.lines.read_line(&mut line).await {
            Ok(n) if n > 0 => Ok(line),
            Ok(_) => Err(dlock::Error::config("a worker ended without a word")),
            Err(e) => Err(dlock::Error::config(format!("a worker's output: {e}"))),
        }
    }

    /// Waits for the worker's `ready`; what it said instead.
    async fn ready(&mut self) -> Result<(), String> {
        let line = self.line().await.map_err(|e| e.to_string())?;
        if line.contains("\"ready\"") {
            return Ok(());
        }
        match serde_json::from_str::<Report>(&line) {
            Ok(Report { error: Some(e), .. }) => Err(e),
            _ => Err(format!("said {line:?}")),
        }
    }

    /// Tells the worker to begin.
    async fn go(&mut self) -> dlock::Result<()> {
        self.stdin
            .write_all(b"go\n")
            .await
            .map_err(|e| dlock::Error::config(format!("a worker's input: {e}")))
    }

    /// The worker's report.
    async fn report(&mut self) -> dlock::Result<Report> {
        let line = self.line().await?;
        serde_json::from_str(&line)
            .map_err(|e| dlock::Error::config(format!("a worker's report {line:?}: {e}")))
    }
}

/// A board in a file of its own, removed when dropped.
struct BoardFile {
    path: PathBuf,
    board: Board,
}

impl BoardFile {
    /// A new board, every counter 0.
    fn new() -> dlock::Result<Self> {
        let path = std::env::temp_dir().join(format!(
            "dlock-bench-board-{}-{}",
            std::process::id(),
            uuid_like()
        ));
        let io = |e: std::io::Error| dlock::Error::config(format!("the workers' board: {e}"));
        std::fs::write(&path, [0u8; BOARD_BYTES]).map_err(io)?;
        let board = Board::open(&path).map_err(io)?;
        Ok(Self { path, board })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// The counter in `slot`.
    fn get(&self, slot: Slot) -> dlock::Result<u64> {
        self.board
            .get(slot)
            .map_err(|e| dlock::Error::config(format!("the workers' board: {e}")))
    }
}

impl Drop for BoardFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
