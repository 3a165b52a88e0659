//! The `rslock` target: W1, W4 and W7 through rslock (crates.io), the Redlock crate most Rust
//! services use, on the same Redis, beside the `redis` rows of the same run.
//!
//! rslock's lock is `SET NX PX` with a random value and a compare-and-delete script to
//! release: no fencing token, no renewal, no loss signal, no queue (a busy lock is retried
//! after a random pause). It shows what a bare Redis lock costs; dlock's rows add those
//! promises on top.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rslock::LockManager;

use super::measure::{fill_latency, finish, histogram, out_of_time, us};
use super::targets::RSLOCK as LABEL;
use super::{Row, Workload};

/// The lease rslock's locks are taken with: long enough for any cycle, as dlock's default.
const TTL: Duration = Duration::from_secs(30);

/// One row per requested workload of W1, W4 and W7 against the Redis of `url`; a row's
/// `skipped` starts with `error:` when the run failed.
pub(super) async fn rows(
    url: &str,
    ns: &str,
    workloads: &[Workload],
    cycles: u64,
    limit: Option<Duration>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for w in workloads {
        let mut row = Row::new(LABEL, format!("{w:?}"));
        // W1: one client; W4: 8 clients of their own, a name each, a share of twice W1's
        // cycles; W7: 64 tasks on one client, a name each, a share of twice W1's cycles.
        let (clients, tasks, per) = match w {
            Workload::W1 => (1, 1, cycles),
            Workload::W4 => (8, 8, cycles * 2 / 8),
            Workload::W7 => (1, 64, (cycles * 2 / 64).max(1)),
            _ => continue,
        };
        let run = Run {
            url,
            ns: format!("{ns}/rslock-{w:?}"),
            clients,
            tasks,
            per,
            limit,
        };
        if let Err(e) = run.measure(&mut row).await {
            row.skipped = Some(format!("error: {e}"));
        }
        rows.push(row);
    }
    rows
}

/// One workload: `tasks` tasks on `clients` lock managers (task `i` on manager `i % clients`),
/// each making `per` cycles on a name of its own under `ns`.
struct Run<'a> {
    url: &'a str,
    ns: String,
    clients: usize,
    tasks: u64,
    per: u64,
    limit: Option<Duration>,
}

impl Run<'_> {
    async fn measure(&self, row: &mut Row) -> Result<(), String> {
        let managers: Vec<Arc<LockManager>> = (0..self.clients)
            .map(|_| Arc::new(LockManager::new(vec![self.url])))
            .collect();
        let together = Arc::new(tokio::sync::Barrier::new(
            usize::try_from(self.tasks).unwrap_or(usize::MAX),
        ));
        let task = |task: u64| {
            let slot = usize::try_from(task).unwrap_or(0) % self.clients.max(1);
            let manager = Arc::clone(&managers[slot]);
            let (together, name) = (Arc::clone(&together), format!("{}/{task}", self.ns));
            let (per, limit) = (self.per, self.limit);
            async move {
                // Connects, and warms up as dlock's W1 does.
                for _ in 0..per.min(200) {
                    cycle(&manager, &name).await?;
                }
                let mut h: Histogram<u64> = histogram().map_err(|e| e.to_string())?;
                together.wait().await;
                let started = Instant::now();
                let mut n = 0;
                while n < per && !out_of_time(started, limit) {
                    let t = Instant::now();
                    cycle(&manager, &name).await?;
                    let _ = h.record(us(t.elapsed()));
                    n += 1;
                }
                Ok::<_, String>((started, Instant::now(), n, h))
            }
        };
        let mut done = Vec::new();
        if self.tasks == 1 {
            // One client runs in the bench's own task, as dlock's W1 and its floor do: where a
            // future is polled changes how soon it is woken after each reply.
            done.push(task(0).await);
        } else {
            let mut set: tokio::task::JoinSet<_> = (0..self.tasks).map(task).collect();
            while let Some(joined) = set.join_next().await {
                done.push(joined.map_err(|e| format!("a task panicked: {e}"))?);
            }
        }
        let mut all: Histogram<u64> = histogram().map_err(|e| e.to_string())?;
        let (mut span, mut cycles) = (None::<(Instant, Instant)>, 0);
        for done in done {
            let (began, ended, n, h) = done?;
            all.add(&h).map_err(|e| e.to_string())?;
            cycles += n;
            span = Some(span.map_or((began, ended), |(b, e)| (b.min(began), e.max(ended))));
        }
        if let Some((began, ended)) = span {
            finish(row, cycles, ended.saturating_duration_since(began));
        }
        fill_latency(row, &all);
        Ok(())
    }
}

/// One cycle: the lock (uncontended: each name is one task's), then its release.
async fn cycle(manager: &LockManager, name: &str) -> Result<(), String> {
    let lock = manager
        .lock(name, TTL)
        .await
        .map_err(|e| format!("lock: {e}"))?;
    manager.unlock(&lock).await;
    Ok(())
}
