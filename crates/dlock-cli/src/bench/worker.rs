//! One worker process of `dlock bench`'s workloads across processes (W2P, W3P, W8P, started by
//! [`processes`](super::processes)): it connects with a provider of its own, says it is ready,
//! runs its cycles when told to go, and reports what it measured, each a JSON line on stdout.
//!
//! The workers of one workload share a [`Board`], a small file of counters they read and
//! write while they hold the lock: the critical section of W2P (a counter read, a yield, the
//! counter written back; the last holder, for the owner switches), and W3P's handoff stamps.
//! Holders that exclude each other need nothing more; holders that do not lose counter
//! updates, which is what the board is there to show.

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use dlock::{DynLock, LockGuard, LockOptions};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt as _;

use super::measure::{cpu_time, histogram, us};
use super::targets::Target;
use crate::exit;
use crate::host::now_ns;

/// The variable that gives a worker its store's URL.
pub(super) const WORKER_URL: &str = "DLOCK_BENCH_WORKER_URL";

/// What a worker process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Role {
    /// W2P: cycles on the one shared name, the critical section on the board.
    Contend,
    /// W3P: takes turns with one other worker on the one name, timing each handoff.
    Handoff,
    /// W8P: cycles on a name of its own, each cycle timed.
    Own,
}

/// Options of the hidden `dlock bench-worker` (started by `dlock bench`).
#[derive(Debug, Args)]
pub struct BenchWorkerOpts {
    /// This worker's number (0 holds first in W3P).
    #[arg(long)]
    id: u64,
    /// The store (from the environment: a password in it does not show in `ps`).
    #[arg(long, env = WORKER_URL, hide_env_values = true)]
    url: String,
    /// The lock's name.
    #[arg(long)]
    name: String,
    /// What to do.
    #[arg(long, value_enum)]
    role: Role,
    /// Cycles to run (W3P: handoffs of the pair).
    #[arg(long)]
    cycles: u64,
    /// The workload's board, shared by its workers.
    #[arg(long)]
    board: PathBuf,
    /// W2P: the fair lock.
    #[arg(long)]
    fair: bool,
}

/// A worker's report, the last line it writes.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Report {
    /// Cycles done (W3P: handoffs this worker timed, as the waiter).
    pub(super) cycles: u64,
    /// Its CPU time from the go to its last cycle, microseconds.
    pub(super) cpu_us: Option<f64>,
    /// Its latencies (W2P: acquire; W3P: handoff; W8P: cycle), microseconds, as (value,
    /// count) pairs of its histogram.
    pub(super) latencies: Vec<(u64, u64)>,
    /// Why it stopped early, if it did.
    pub(super) error: Option<String>,
}

/// The counters of a [`Board`], each a little-endian `u64` at eight times its number.
#[derive(Debug, Clone, Copy)]
pub(super) enum Slot {
    /// W2P: the holders inside the critical section now.
    Inside = 0,
    /// W2P: one more per critical section (a holder that overlapped another may lose one).
    Counter = 1,
    /// W2P: the last holder's id plus one (0: nobody yet).
    Last = 2,
    /// W2P: how often the holder was not the last one.
    Switches = 3,
    /// W2P: critical sections begun while another holder was inside.
    Overlaps = 4,
    /// W3P: the handoff (counted from 1) whose waiter is about to ask.
    Waiting = 5,
    /// W3P: when the holder called release, on the host's monotonic clock.
    Released = 6,
    /// W3P: the handoff (counted from 1) whose waiter got the lock.
    Granted = 7,
}

/// How long a W3P worker waits for its partner's move on the board before it gives up.
const PARTNER_WITHIN: Duration = Duration::from_secs(60);

/// The board's size, bytes: every [`Slot`].
pub(super) const BOARD_BYTES: usize = 8 * 8;

/// The file the workers of one workload share.
pub(super) struct Board(File);

impl Board {
    /// Opens the board at `path` for reading and writing.
    pub(super) fn open(path: &std::path::Path) -> std::io::Result<Self> {
        Ok(Self(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?,
        ))
    }

    /// The counter in `slot`.
    pub(super) fn get(&self, slot: Slot) -> std::io::Result<u64> {
        let mut bytes = [0u8; 8];
        self.0.read_exact_at(&mut bytes, slot as u64 * 8)?;
        Ok(u64::from_le_bytes(bytes))
    }

    /// Sets the counter in `slot` to `value`.
    pub(super) fn set(&self, slot: Slot, value: u64) -> std::io::Result<()> {
        self.0.write_all_at(&value.to_le_bytes(), slot as u64 * 8)
    }

    /// Waits until the counter in `slot` reads `value` (the other worker of a W3P pair says
    /// so), polling every 200 µs, at most [`PARTNER_WITHIN`]: a partner gone is an error.
    async fn wait_for(&self, slot: Slot, value: u64) -> dlock::Result<()> {
        let polled = dlock::backend::Deadline::after(PARTNER_WITHIN).run(async {
            while self.get(slot)? != value {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            Ok::<_, std::io::Error>(())
        });
        match polled.await {
            Some(read) => read.map_err(board_error),
            None => Err(dlock::Error::config(format!(
                "the other worker did not move {slot:?} to {value} within {PARTNER_WITHIN:?}"
            ))),
        }
    }

    /// Adds one to the counter in `slot`: not atomic across processes, so only while holding
    /// the lock (an overlap then shows as a lost count).
    fn bump(&self, slot: Slot) -> std::io::Result<u64> {
        let value = self.get(slot)?.saturating_add(1);
        self.set(slot, value)?;
        Ok(value)
    }
}

/// A board error as the benchmark reports it.
fn board_error(e: std::io::Error) -> dlock::Error {
    dlock::Error::config(format!("the workers' board: {e}"))
}

/// Runs the hidden `dlock bench-worker`: connects, says `ready`, waits for a line on stdin
/// (the go), runs its cycles and writes its [`Report`]; the exit status.
pub(crate) async fn worker(opts: BenchWorkerOpts) -> u8 {
    if let Err(e) = crate::host::die_with_parent() {
        report(&failed(e));
        return exit::SOFTWARE;
    }
    match run(&opts).await {
        Ok(r) => {
            report(&r);
            if r.error.is_some() { exit::SOFTWARE } else { 0 }
        }
        Err(e) => {
            report(&failed(e.to_string()));
            exit::UNAVAILABLE
        }
    }
}

/// The report of a worker that could not run.
fn failed(why: String) -> Report {
    Report {
        cycles: 0,
        cpu_us: None,
        latencies: Vec::new(),
        error: Some(why),
    }
}

/// Writes one JSON line on stdout.
fn say_json(value: &impl Serialize) {
    if let Ok(line) = serde_json::to_string(value) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Writes the report.
fn report(r: &Report) {
    say_json(r);
}

/// Connects, readies the lock (W3P's worker 0 takes it), says `ready` and waits for the go;
/// then runs the role's cycles.
async fn run(opts: &BenchWorkerOpts) -> dlock::Result<Report> {
    let board = Board::open(&opts.board).map_err(board_error)?;
    let target = Target::store(opts.url.clone());
    let provider = target.client().await?;
    let lock = provider.lock(&opts.name, LockOptions::default().with_fair(opts.fair))?;
    let first = if opts.role == Role::Handoff && opts.id == 0 {
        Some(lock.acquire().await?)
    } else {
        None
    };
    say_json(&serde_json::json!({ "ready": true }));
    let mut go = String::new();
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    if !matches!(stdin.read_line(&mut go).await, Ok(n) if n > 0) {
        return Err(dlock::Error::config(
            "the benchmark went away before the go",
        ));
    }
    let cpu = cpu_time();
    let mut h = histogram()?;
    let outcome = match opts.role {
        Role::Contend => contend(&lock, &board, opts, &mut h).await,
        Role::Own => own(&lock, opts.cycles, &mut h).await,
        Role::Handoff => handoff(&lock, &board, opts, first, &mut h).await,
    };
    let spent = cpu_time()
        .zip(cpu)
        .and_then(|(now, before)| now.checked_sub(before));
    let (cycles, error) = match outcome {
        Ok(n) => (n, None),
        Err((n, e)) => (n, Some(e.to_string())),
    };
    Ok(Report {
        cycles,
        cpu_us: spent.map(|d| d.as_secs_f64() * 1e6),
        latencies: h
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect(),
        error,
    })
}

/// What a role's cycles end with: the cycles done, or those done before an error.
type Cycles = Result<u64, (u64, dlock::Error)>;

/// W2P: `--cycles` cycles on the shared name, each acquire timed; the critical section moves
/// the board's counters as W2's moves its atomics.
async fn contend(
    lock: &DynLock,
    board: &Board,
    opts: &BenchWorkerOpts,
    h: &mut Histogram<u64>,
) -> Cycles {
    let me = opts.id.saturating_add(1);
    let mut done = 0;
    while done < opts.cycles {
        let t = Instant::now();
        let g = lock.acquire().await.map_err(|e| (done, e))?;
        let _ = h.record(us(t.elapsed()));
        let section = async {
            if board.get(Slot::Inside)? > 0 {
                board.bump(Slot::Overlaps)?;
            }
            board.bump(Slot::Inside)?;
            if board.get(Slot::Last)? != me {
                board.bump(Slot::Switches)?;
                board.set(Slot::Last, me)?;
            }
            let seen = board.get(Slot::Counter)?;
            tokio::task::yield_now().await;
            board.set(Slot::Counter, seen.saturating_add(1))?;
            let inside = board.get(Slot::Inside)?;
            board.set(Slot::Inside, inside.saturating_sub(1))
        };
        section.await.map_err(|e| (done, board_error(e)))?;
        g.release().await.map_err(|e| (done, e))?;
        done += 1;
    }
    Ok(done)
}

/// W8P: `cycles` cycles on a name of its own, each timed whole (acquire and release).
async fn own(lock: &DynLock, cycles: u64, h: &mut Histogram<u64>) -> Cycles {
    let mut done = 0;
    while done < cycles {
        let t = Instant::now();
        let g = lock.acquire().await.map_err(|e| (done, e))?;
        g.release().await.map_err(|e| (done, e))?;
        let _ = h.record(us(t.elapsed()));
        done += 1;
    }
    Ok(done)
}

/// How long a W3P holder lets its waiter reach the store after the waiter said it is about
/// to ask (W3's wait in one process).
const REACH_THE_STORE: Duration = Duration::from_millis(2);

/// W3P: two workers pass the lock back and forth `--cycles` times; handoff `k` (from 0) goes
/// from worker `k % 2` to the other. The waiter says on the board that it is about to ask; the
/// holder waits for that, lets it reach the store, stamps its release call and releases; the
/// waiter times its grant from that stamp (the host's monotonic clock, which both read) and
/// says it has it. The holder asks again only then: an unfair lock would otherwise let it take
/// the name back before a waiter of another process heard of the release.
async fn handoff(
    lock: &DynLock,
    board: &Board,
    opts: &BenchWorkerOpts,
    mut held: Option<LockGuard>,
    h: &mut Histogram<u64>,
) -> Cycles {
    let mut timed = 0;
    for k in 0..opts.cycles {
        let step = async {
            if k % 2 == opts.id % 2 {
                let Some(g) = held.take() else {
                    return Err(dlock::Error::config("a holder without its hold"));
                };
                board.wait_for(Slot::Waiting, k + 1).await?;
                tokio::time::sleep(REACH_THE_STORE).await;
                board.set(Slot::Released, now_ns()).map_err(board_error)?;
                g.release().await?;
                board.wait_for(Slot::Granted, k + 1).await?;
            } else {
                board.set(Slot::Waiting, k + 1).map_err(board_error)?;
                let g = lock.acquire().await?;
                let granted = now_ns();
                let released = board.get(Slot::Released).map_err(board_error)?;
                let _ = h.record(us(Duration::from_nanos(granted.saturating_sub(released))));
                board.set(Slot::Granted, k + 1).map_err(board_error)?;
                held = Some(g);
                timed += 1;
            }
            Ok(())
        };
        step.await.map_err(|e| (timed, e))?;
    }
    if let Some(g) = held {
        g.release().await.map_err(|e| (timed, e))?;
    }
    Ok(timed)
}
