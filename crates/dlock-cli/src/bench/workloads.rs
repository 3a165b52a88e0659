//! The workloads W1-W6 (described in `docs/benchmarks.md`) against one store through dlock,
//! each filling one [`Row`]; W1 and W4 set against the store's floor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock::backend::Mutex;
use dlock::{DynLock, Lease, LockOptions};
use hdrhistogram::Histogram;

use super::floor::{self, Floor};
use super::measure::{
    cpu_per_cycle, cpu_time, fill_handoff, fill_latency, finish, histogram, namespace, out_of_time,
    rss_kib, us,
};
use super::targets::{Target, Via};
use super::{BenchOpts, Row, Workload};

mod turns;
use turns::{CLOSE_WITHIN, Turns};

/// W1 runs its cycles in this many blocks, each followed by as many cycles of its floor.
const W1_BLOCKS: u64 = 8;

/// One workload's run against one target: what every workload function starts from.
#[derive(Clone, Copy)]
struct Run<'a> {
    target: &'a Target,
    workload: Workload,
    /// The prefix of the run's lock names.
    ns: &'a str,
    opts: &'a BenchOpts,
}

/// Runs one workload against `target`: its row, or the error that ended it.
pub(super) async fn run_workload(
    target: &Target,
    workload: Workload,
    opts: &BenchOpts,
) -> dlock::Result<Row> {
    let mut row = Row::new(&target.label, format!("{workload:?}"));
    let ns = namespace();
    let run = Run {
        target,
        workload,
        ns: &ns,
        opts,
    };
    match workload {
        Workload::W1 => uncontended(&run, &mut row).await?,
        Workload::W1S => uncontended_permits(&run, &mut row).await?,
        Workload::W2 | Workload::W2F | Workload::W4 => contended(&run, &mut row).await?,
        Workload::W3 => handoff(&run, &mut row).await?,
        Workload::W5 => fairness(&run, &mut row).await?,
        Workload::W6 => scale(&run, &mut row).await?,
        Workload::W7 | Workload::W7H => many_tasks(&run, &mut row).await?,
        // A row per `--holds` count, made by `scale::scale`.
        Workload::W8 => row.skipped = Some("W8 has a row per --holds count".into()),
        // Rows made by `processes::rows` and `open_loop::rows`.
        Workload::W2P | Workload::W2PF | Workload::W3P | Workload::W8P | Workload::W9 => {
            row.skipped = Some(format!("{workload:?} has rows of its own"));
        }
    }
    Ok(row)
}

/// W1: one client acquires and releases one name, after a warm-up, in blocks that take turns
/// with blocks of the floor's cycles.
async fn uncontended(run: &Run<'_>, row: &mut Row) -> dlock::Result<()> {
    let Run {
        target, ns, opts, ..
    } = *run;
    let limit = opts.duration;
    let p = target.client().await?;
    let lock = p.lock(&format!("{ns}/w1"), LockOptions::default())?;
    for _ in 0..200.min(opts.cycles) {
        lock.acquire().await?.release().await?;
    }
    let mut h = histogram()?;
    // dlock and its floor take turns, a block of cycles at a time, so that a slow
    // spell of the server (a checkpoint, a disk's flushes, another process) falls on
    // both alike instead of on whichever ran then.
    let block = (opts.cycles / W1_BLOCKS).max(1);
    let (mut n, mut spent, mut cpu) = (0, Duration::ZERO, Some(Duration::ZERO));
    let mut floor = (target.via != Via::Broken).then_some(FloorSum::ZERO);
    // for-update: also the row lock alone, to show what its fence costs.
    let mut lock_floor = (target.via != Via::Broken).then_some(FloorSum::ZERO);
    while n < opts.cycles && limit.is_none_or(|l| spent < l) {
        let before = cpu_time();
        let started = Instant::now();
        let mut done = 0;
        let left = limit.map(|l| l.saturating_sub(spent));
        while done < block && n < opts.cycles && !out_of_time(started, left) {
            let t = Instant::now();
            lock.acquire().await?.release().await?;
            let _ = h.record(us(t.elapsed()));
            done += 1;
            n += 1;
        }
        spent = spent.saturating_add(started.elapsed());
        cpu = cpu
            .zip(cpu_time().zip(before))
            .and_then(|(sum, (now, before))| sum.checked_add(now.checked_sub(before)?));
        add_floor(&mut floor, target, done, ns, Floor::Cycle).await?;
        add_floor(&mut lock_floor, target, done, ns, Floor::LockOnly).await?;
    }
    finish(row, n, spent);
    row.cpu_us_per_cycle = cpu.and_then(|c| (n > 0).then(|| c.as_secs_f64() * 1e6 / n as f64));
    fill_latency(row, &h);
    if let Some((rate, cpu)) = floor.and_then(FloorSum::rates) {
        row.floor_cycles_per_sec = Some(rate);
        row.ratio_to_floor = Some(row.cycles_per_sec / rate);
        row.floor_cpu_us_per_cycle = cpu;
    }
    if let Some((rate, _)) = lock_floor.and_then(FloorSum::rates) {
        row.lock_floor_cycles_per_sec = Some(rate);
        row.ratio_to_lock_floor = Some(row.cycles_per_sec / rate);
    }
    Ok(())
}

/// W1S: the permits of its semaphore.
pub(super) const W1S_PERMITS: u32 = 4;

/// W1S: one client takes and gives back one permit of a semaphore of [`W1S_PERMITS`], after a
/// warm-up (set against Curator's `InterProcessSemaphoreV2` on ZooKeeper, not a floor).
async fn uncontended_permits(run: &Run<'_>, row: &mut Row) -> dlock::Result<()> {
    let Run {
        target, ns, opts, ..
    } = *run;
    let p = target.client().await?;
    if !p.capabilities().semaphore {
        row.skipped = Some("no semaphores".into());
        return Ok(());
    }
    let sem = p.semaphore(&format!("{ns}/w1s"), W1S_PERMITS, LockOptions::default())?;
    for _ in 0..200.min(opts.cycles) {
        sem.acquire().await?.release().await?;
    }
    let mut h = histogram()?;
    let cpu = cpu_time();
    let started = Instant::now();
    let mut n = 0;
    while n < opts.cycles && !out_of_time(started, opts.duration) {
        let t = Instant::now();
        sem.acquire().await?.release().await?;
        let _ = h.record(us(t.elapsed()));
        n += 1;
    }
    finish(row, n, started.elapsed());
    row.cpu_us_per_cycle = cpu_per_cycle(cpu, n);
    fill_latency(row, &h);
    Ok(())
}

/// Adds a block of `done` cycles of `target`'s floor of kind `kind` to `sum` (cycles,
/// seconds); a store without that floor sets `sum` to `None`.
async fn add_floor(
    sum: &mut Option<FloorSum>,
    target: &Target,
    done: u64,
    ns: &str,
    kind: Floor,
) -> dlock::Result<()> {
    if let Some(s) = sum.as_mut() {
        match floor::cycles_per_sec(&target.url, done.max(1), ns, kind).await? {
            Some(m) => {
                s.cycles += done.max(1);
                s.secs += done.max(1) as f64 / m.rate;
                s.cpu = s.cpu.zip(m.cpu).and_then(|(a, b)| a.checked_add(b));
            }
            None => *sum = None,
        }
    }
    Ok(())
}

/// A W1 floor's blocks so far: cycles, seconds, CPU time.
#[derive(Clone, Copy)]
struct FloorSum {
    cycles: u64,
    secs: f64,
    cpu: Option<Duration>,
}

impl FloorSum {
    const ZERO: Self = Self {
        cycles: 0,
        secs: 0.0,
        cpu: Some(Duration::ZERO),
    };

    /// Cycles per second and CPU microseconds per cycle; `None` if no time was measured.
    fn rates(self) -> Option<(f64, Option<f64>)> {
        (self.secs > 0.0 && self.cycles > 0).then(|| {
            (
                self.cycles as f64 / self.secs,
                self.cpu.map(|c| c.as_secs_f64() * 1e6 / self.cycles as f64),
            )
        })
    }
}

/// W2, W2F, W4: 8 clients, each with a share of twice W1's cycles; on one name (W2, W2F with
/// the fair lock) the critical section checks exclusion and counts owner switches, on a name
/// each (W4) it is set against the floor of 8 clients, in
/// [`MANY_BLOCKS`](turns::MANY_BLOCKS) blocks, each followed by a block of the floor's with as
/// many cycles a client, as W1's and W7's do.
async fn contended(run: &Run<'_>, row: &mut Row) -> dlock::Result<()> {
    let Run {
        target, ns, opts, ..
    } = *run;
    let one_name = run.workload != Workload::W4;
    let per = (opts.cycles * 2 / 8).max(1);
    let seen = Arc::new(OneName::default());
    let with_floor = !one_name && target.via != Via::Broken;
    let turns = Turns {
        target,
        opts,
        workers: 8,
        per,
    };
    let seen_by_blocks = &seen;
    let Some((all, floor)) = turns
        .take(
            with_floor,
            |cycles| contended_block(run, cycles, seen_by_blocks),
            |share| floor::concurrent_cycles_per_sec(&target.url, share, ns),
        )
        .await?
    else {
        row.skipped = Some("no fair locks".into());
        return Ok(());
    };
    all.fill(row);
    if one_name {
        let done = all.done;
        let lost = done.saturating_sub(seen.counter.load(Ordering::SeqCst));
        row.violations = seen.overlaps.load(Ordering::SeqCst) + lost;
        // The first grant is no switch (nobody held before it).
        let switched = seen.switches.load(Ordering::SeqCst).saturating_sub(1);
        row.owner_switch_pct = Some(100.0 * switched as f64 / done.saturating_sub(1).max(1) as f64);
    }
    if let Some((rate, _)) = floor.and_then(FloorSum::rates) {
        row.floor_cycles_per_sec = Some(rate);
        row.ratio_to_floor = Some(row.cycles_per_sec / rate);
    }
    Ok(())
}

/// What the critical sections of W2 and W2F (one name) see: the counter they read, yield
/// and write, the holders inside now and how often a second one was, the worker that held
/// last and how often the holder changed.
struct OneName {
    counter: AtomicU64,
    inside: AtomicU64,
    overlaps: AtomicU64,
    /// The worker that held last (8: nobody yet).
    last: AtomicU64,
    switches: AtomicU64,
}

impl Default for OneName {
    fn default() -> Self {
        Self {
            counter: AtomicU64::new(0),
            inside: AtomicU64::new(0),
            overlaps: AtomicU64::new(0),
            last: AtomicU64::new(8),
            switches: AtomicU64::new(0),
        }
    }
}

/// One block of [`contended`]: 8 clients of their own, each making `cycles`, started
/// together; closed before it returns (the floor's block that follows opens as many
/// connections, and a server's connections may not allow both at once). `None` when W2F's
/// store has no fair lock.
async fn contended_block(
    run: &Run<'_>,
    cycles: Cycles,
    seen: &Arc<OneName>,
) -> dlock::Result<Option<Block>> {
    let Run { target, ns, .. } = *run;
    let one_name = run.workload != Workload::W4;
    let fair = run.workload == Workload::W2F;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(target.client().await?);
    }
    if fair && !clients.iter().all(|c| c.capabilities().fair) {
        return Ok(None);
    }
    // Every handle is made before any worker starts: a worker waits for all the
    // others (below), so none may be missing.
    let mut workers = Vec::new();
    for (i, p) in clients.iter().enumerate() {
        let name = if one_name {
            format!("{ns}/w2")
        } else {
            format!("{ns}/w4/{i}")
        };
        let lock = p.lock(&name, LockOptions::default().with_fair(fair))?;
        workers.push((i, lock, histogram()?));
    }
    // Every worker starts its cycles once all are spawned: on a fast store the first
    // one would otherwise run many cycles alone (no contention, no owner switch)
    // before the last one is spawned.
    let together = Arc::new(Together::new(workers.len()));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, lock, h) in workers {
        let (seen, together) = (Arc::clone(seen), Arc::clone(&together));
        let me = i as u64;
        tasks.spawn(async move {
            // Borrowed by the critical section of every cycle.
            let seen = &*seen;
            // On one name, the critical section checks exclusion and counts the owner
            // switches; W4's names are each worker's own, so it does nothing its floor
            // does not.
            worker(&lock, &together, cycles, h, || async move {
                if one_name {
                    watched(&seen.inside, &seen.overlaps, async {
                        if seen.last.swap(me, Ordering::SeqCst) != me {
                            seen.switches.fetch_add(1, Ordering::SeqCst);
                        }
                        let counted = seen.counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        seen.counter.store(counted + 1, Ordering::SeqCst);
                    })
                    .await;
                }
            })
            .await
        });
    }
    let block = gather(tasks, &together).await?;
    // Closed together: each within CLOSE_WITHIN, so the block's end waits that long at most.
    let closes = clients.iter().map(|p| p.close(CLOSE_WITHIN));
    for closed in futures::future::join_all(closes).await {
        if !closed.is_clean() {
            eprintln!(
                "dlock bench: {} {:?}: a block's client closed unclean: {closed:?}",
                target.label, run.workload
            );
        }
    }
    Ok(Some(block))
}

/// Waits for a workload's workers, started together at `together`: their cycles, latencies
/// (added up) and time, from the start to the last one's end. The first error (or panic) of
/// one ends the workload.
async fn gather(
    mut workers: tokio::task::JoinSet<dlock::Result<(Histogram<u64>, u64)>>,
    together: &Together,
) -> dlock::Result<Block> {
    let mut block = Block::empty()?;
    while let Some(worker) = workers.join_next().await {
        let (th, n) =
            worker.map_err(|e| dlock::Error::config(format!("a worker panicked: {e}")))??;
        let _ = block.h.add(&th);
        block.done += n;
    }
    let (began, ended) = (*together.began.lock(), *together.ended.lock());
    if let (Some((from, cpu_from)), Some((to, cpu_to))) = (began, ended) {
        block.elapsed = to.saturating_duration_since(from);
        block.cpu = cpu_to
            .zip(cpu_from)
            .and_then(|(to, from)| to.checked_sub(from));
    }
    Ok(block)
}

/// The cycles of a workload's workers (or of several runs of them): latencies, how many,
/// the time from their start to the last one's end, and the process's CPU time meanwhile.
struct Block {
    h: Histogram<u64>,
    done: u64,
    elapsed: Duration,
    cpu: Option<Duration>,
}

impl Block {
    fn empty() -> dlock::Result<Self> {
        Ok(Self {
            h: histogram()?,
            done: 0,
            elapsed: Duration::ZERO,
            cpu: Some(Duration::ZERO),
        })
    }

    fn add(&mut self, other: &Self) {
        let _ = self.h.add(&other.h);
        self.done += other.done;
        self.elapsed = self.elapsed.saturating_add(other.elapsed);
        self.cpu = self.cpu.zip(other.cpu).and_then(|(a, b)| a.checked_add(b));
    }

    /// Fills the row: cycles per second, CPU per cycle, latencies, the longest wait.
    fn fill(&self, row: &mut Row) {
        finish(row, self.done, self.elapsed);
        row.cpu_us_per_cycle = self
            .cpu
            .and_then(|c| (self.done > 0).then(|| c.as_secs_f64() * 1e6 / self.done as f64));
        fill_latency(row, &self.h);
        row.max_wait_ms = Some(self.h.max() as f64 / 1000.0);
    }
}

/// How many cycles a worker runs: `per` at most, fewer once `limit` from the start is up.
#[derive(Clone, Copy)]
struct Cycles {
    per: u64,
    limit: Option<Duration>,
}

/// Where the workers of a workload wait for each other: when (and at what CPU time of the
/// process) the last of them arrived, the start of the workload's clock, as its floor's
/// clock starts once its clients are ready; and when the last of them ended its cycles.
struct Together {
    barrier: tokio::sync::Barrier,
    began: Mutex<Option<Stamp>>,
    ended: Mutex<Option<Stamp>>,
}

/// A moment, and the process's CPU time then.
type Stamp = (Instant, Option<Duration>);

impl Together {
    fn new(workers: usize) -> Self {
        Self {
            barrier: tokio::sync::Barrier::new(workers),
            began: Mutex::new(None),
            ended: Mutex::new(None),
        }
    }

    /// Arrives, waits for every worker, and returns the start: the last arrival, final
    /// once the barrier opens (every worker has stamped its own by then).
    async fn wait(&self) -> Instant {
        Self::stamp_latest(&self.began);
        self.barrier.wait().await;
        self.began.lock().map_or_else(Instant::now, |(at, _)| at)
    }

    /// A worker ended its cycles.
    fn end(&self) {
        Self::stamp_latest(&self.ended);
    }

    fn stamp_latest(slot: &Mutex<Option<Stamp>>) {
        let now = (Instant::now(), cpu_time());
        let mut slot = slot.lock();
        if slot.is_none_or(|(at, _)| at <= now.0) {
            *slot = Some(now);
        }
    }
}

/// One worker of a workload: it makes one cycle of `lock` untimed (the first use of a name
/// may create what later cycles reuse: a parent node, a key's row, a cached id, as the
/// floor's set-up does before its clock starts), then, once every worker has made its own
/// and waits at `together`, it runs its `cycles`, each acquire timed into `h` and its
/// critical section `section`; its latencies and cycles done.
async fn worker<S: Future<Output = ()>>(
    lock: &DynLock,
    together: &Together,
    cycles: Cycles,
    mut h: Histogram<u64>,
    section: impl Fn() -> S,
) -> dlock::Result<(Histogram<u64>, u64)> {
    lock.acquire().await?.release().await?;
    let started = together.wait().await;
    let mut done = 0u64;
    while done < cycles.per && !out_of_time(started, cycles.limit) {
        let t = Instant::now();
        let g = lock.acquire().await?;
        let _ = h.record(us(t.elapsed()));
        section().await;
        g.release().await?;
        done += 1;
    }
    together.end();
    Ok((h, done))
}

/// Runs `section`, a critical section of a name whose holders inside now `inside` counts;
/// adds one to `overlaps` if another holder was inside already when it began.
async fn watched(inside: &AtomicU64, overlaps: &AtomicU64, section: impl Future<Output = ()>) {
    if inside.fetch_add(1, Ordering::SeqCst) > 0 {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    section.await;
    inside.fetch_sub(1, Ordering::SeqCst);
}

/// W7, W7H: how many tasks share one provider.
const W7_TASKS: u64 = 64;

/// W7, W7H: 64 tasks on one provider, each with a share of twice W1's cycles; on a name each
/// (W7, and W9's closed loop), set against the floor of as many tasks on one connection where
/// the store has one (W7 only), or on 8 names, 8 tasks to a name (W7H), whose critical
/// sections check exclusion. Where there is a floor, the cycles run in
/// [`MANY_BLOCKS`](turns::MANY_BLOCKS) blocks, each followed by a block of the floor's with
/// as many cycles a task, as W1's do.
async fn many_tasks(run: &Run<'_>, row: &mut Row) -> dlock::Result<()> {
    let Run {
        target, ns, opts, ..
    } = *run;
    let per = (opts.cycles * 2 / W7_TASKS).max(1);
    // Per hot name: holders inside now, and how often a second one was.
    let inside: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
    let overlaps = Arc::new(AtomicU64::new(0));
    let with_floor = run.workload == Workload::W7 && target.via != Via::Broken;
    let turns = Turns {
        target,
        opts,
        workers: W7_TASKS,
        per,
    };
    let (inside_of_blocks, overlaps_of_blocks) = (&inside, &overlaps);
    let Some((all, floor)) = turns
        .take(
            with_floor,
            |cycles| async move {
                many_tasks_block(run, cycles, inside_of_blocks, overlaps_of_blocks)
                    .await
                    .map(Some)
            },
            |share| floor::shared_cycles_per_sec(&target.url, W7_TASKS, share, ns),
        )
        .await?
    else {
        // Never: every block of W7's answers.
        return Ok(());
    };
    all.fill(row);
    row.violations = overlaps.load(Ordering::SeqCst);
    if let Some((rate, _)) = floor.and_then(FloorSum::rates) {
        row.floor_cycles_per_sec = Some(rate);
        row.ratio_to_floor = Some(row.cycles_per_sec / rate);
    }
    Ok(())
}

/// One block of [`many_tasks`]: 64 tasks on a provider of its own, each making `cycles`,
/// started together; the provider is closed before it returns (the floor's block that
/// follows opens as many connections as its pool, and a server's connections may not allow
/// both at once: PostgreSQL's 100).
async fn many_tasks_block(
    run: &Run<'_>,
    cycles: Cycles,
    inside: &Arc<Vec<AtomicU64>>,
    overlaps: &Arc<AtomicU64>,
) -> dlock::Result<Block> {
    let Run { target, ns, .. } = *run;
    let hot = run.workload == Workload::W7H;
    let p = target.client().await?;
    let mut locks = Vec::new();
    for i in 0..W7_TASKS {
        let name = if hot {
            format!("{ns}/w7h/{}", i % 8)
        } else {
            format!("{ns}/w7/{i}")
        };
        locks.push((i % 8, p.lock(&name, LockOptions::default())?));
    }
    let together = Arc::new(Together::new(locks.len()));
    let mut tasks = tokio::task::JoinSet::new();
    for (slot, lock) in &locks {
        let (inside, overlaps, together, lock, slot) = (
            Arc::clone(inside),
            Arc::clone(overlaps),
            Arc::clone(&together),
            Arc::clone(lock),
            *slot,
        );
        let h = histogram()?;
        tasks.spawn(async move {
            // Borrowed by the critical section of every cycle.
            let (here, overlaps) = (&inside[usize::try_from(slot).unwrap_or(0)], &*overlaps);
            worker(&lock, &together, cycles, h, || async move {
                if hot {
                    watched(here, overlaps, tokio::task::yield_now()).await;
                }
            })
            .await
        });
    }
    let done = gather(tasks, &together).await?;
    drop(locks);
    let closed = p.close(CLOSE_WITHIN).await;
    if !closed.is_clean() {
        eprintln!(
            "dlock bench: {} {:?}: a block's provider closed unclean: {closed:?}",
            target.label, run.workload
        );
    }
    Ok(done)
}

/// The cycles per second of W7's closed loop on `target` (64 tasks of one provider, a name
/// each), without its floor: the most that W9's open loop offers a share of.
pub(super) async fn shared_provider_max(target: &Target, opts: &BenchOpts) -> dlock::Result<f64> {
    let ns = namespace();
    let run = Run {
        target,
        workload: Workload::W9,
        ns: &ns,
        opts,
    };
    let mut row = Row::new(&target.label, "W9 closed".into());
    many_tasks(&run, &mut row).await?;
    Ok(row.cycles_per_sec)
}

/// W3: two clients pass the lock back and forth; a handoff is the time from the holder's
/// release call to the waiter's acquire returning.
async fn handoff(run: &Run<'_>, row: &mut Row) -> dlock::Result<()> {
    let Run {
        target, ns, opts, ..
    } = *run;
    let handoffs = (opts.cycles / 4).max(2);
    let name = format!("{ns}/w3");
    let a = target.client().await?.lock(&name, LockOptions::default())?;
    let b = target.client().await?.lock(&name, LockOptions::default())?;
    let mut h = histogram()?;
    let mut held = a.acquire().await?;
    let mut holder_is_a = true;
    let started = Instant::now();
    let mut n = 0;
    while n < handoffs && !out_of_time(started, opts.duration) {
        let waiter = if holder_is_a {
            Arc::clone(&b)
        } else {
            Arc::clone(&a)
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<Instant>();
        let task = tokio::spawn(async move {
            let g = waiter.acquire().await;
            (g, Instant::now(), rx.await.ok())
        });
        // Let the waiter reach the store before the release.
        tokio::time::sleep(Duration::from_millis(2)).await;
        // From the release's call: the waiter's grant can come before the release's answer
        // does, never before its call.
        let releasing = Instant::now();
        held.release().await?;
        let _ = tx.send(releasing);
        let (g, acquired, _) = task
            .await
            .map_err(|e| dlock::Error::config(format!("waiter panicked: {e}")))?;
        held = g?;
        let _ = h.record(us(acquired.saturating_duration_since(releasing)));
        holder_is_a = !holder_is_a;
        n += 1;
    }
    held.release().await?;
    finish(row, n, started.elapsed());
    fill_handoff(row, &h);
    Ok(())
}

/// W5: 8 waiters queue in a known order on a fair lock; how many are served out of order.
async fn fairness(run: &Run<'_>, row: &mut Row) -> dlock::Result<()> {
    let Run { target, ns, .. } = *run;
    let p = target.client().await?;
    if !p.capabilities().fair {
        row.skipped = Some("no fair locks".into());
        return Ok(());
    }
    let name = format!("{ns}/w5");
    let opts = LockOptions::new().with_fair(true);
    let holder = p.lock(&name, opts)?.acquire().await?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let started = Instant::now();
    for i in 0..8u64 {
        let lock = target.client().await?.lock(&name, opts)?;
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let asked = Instant::now();
            let g = lock.acquire().await?;
            let waited = asked.elapsed();
            order.lock().push(i);
            g.release().await?;
            Ok::<_, dlock::Error>(waited)
        }));
        // Queue them one after the other.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    holder.release().await?;
    let mut h = histogram()?;
    let mut waits = Vec::new();
    for t in tasks {
        let w = t
            .await
            .map_err(|e| dlock::Error::config(format!("waiter panicked: {e}")))??;
        let _ = h.record(us(w));
        waits.push(w);
    }
    let order = order.lock().clone();
    finish(row, order.len() as u64, started.elapsed());
    fill_latency(row, &h);
    row.out_of_order = Some(
        order
            .iter()
            .enumerate()
            .filter(|(i, v)| *i as u64 != **v)
            .count() as u64,
    );
    if let (Some(min), Some(max)) = (waits.iter().min(), waits.iter().max()) {
        row.wait_spread_ms = Some((*max - *min).as_secs_f64() * 1000.0);
    }
    Ok(())
}

/// W6: one client holds 1,000 locks at once, then releases them.
async fn scale(run: &Run<'_>, row: &mut Row) -> dlock::Result<()> {
    let Run {
        target, ns, opts, ..
    } = *run;
    let count = opts.cycles.clamp(2, 1000);
    let before_conn = floor::server_connections(&target.url).await;
    let rss_before = rss_kib();
    let p = target.client().await?;
    let lease = LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(30)));
    let started = Instant::now();
    let mut h = histogram()?;
    let mut guards = Vec::with_capacity(usize::try_from(count).unwrap_or(1000));
    for i in 0..count {
        let t = Instant::now();
        // Bounded: a backend whose holds pin a resource (for-update: a connection each) may
        // not manage 1,000 at once; that is a finding, not a hang.
        match p
            .lock(&format!("{ns}/w6/{i}"), lease)?
            .try_acquire(Duration::from_secs(5))
            .await
        {
            Ok(Some(g)) => guards.push(g),
            Ok(None) => {
                row.skipped = Some(format!(
                    "held {i} locks at once, then waited 5 s in vain for one more (each hold pins a resource: size the pool)"
                ));
                break;
            }
            // The store's own word for its limit (for-update: the pool is exhausted) ends
            // the workload with what it managed, as the bounded wait does.
            Err(e) if !e.is_retryable() && i > 0 => {
                row.skipped = Some(format!("held {i} locks at once, then: {e}"));
                break;
            }
            Err(e) => return Err(e),
        }
        let _ = h.record(us(t.elapsed()));
    }
    let count = guards.len() as u64;
    let during_conn = floor::server_connections(&target.url).await;
    row.memory_kib = match (rss_before, rss_kib()) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    row.server_connections = match (before_conn, during_conn) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    for g in guards {
        g.release().await?;
    }
    finish(row, count, started.elapsed());
    fill_latency(row, &h);
    Ok(())
}
