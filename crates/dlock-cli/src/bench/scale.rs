//! W8: one provider keeps many names held (`--holds`, 1,000 to 100,000) for `--hold-for`,
//! renewed by its watchdog: how many renewals and how many calls to the store those take per
//! second, what a hold costs the client's and (where the store says) the server's memory, and
//! the connections it opened.
//!
//! The renewals and the calls are read from dlock's own metrics (`dlock_renewal_total`,
//! `dlock_renewal_calls_total`) through a recorder this process installs for the workload: a
//! backend that gathers its renewals counts one call per batch; one that renews each hold
//! alone (the memory store, a Redis Cluster, the connection-bound SQL strategies) makes one
//! call per renewal.

use std::sync::OnceLock;
use std::time::Duration;

use dlock::{DynLockProvider, Lease, LockGuard, LockOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::Instant;

use super::floor;
use super::measure::{namespace, rss_kib};
use super::targets::Target;
use super::{BenchOpts, Row};

/// Tasks that take (and give back) the holds, each a share of the names.
const TAKERS: u64 = 64;

/// The longest one hold may take to be granted: a store that cannot keep so many (a pool of
/// pinned connections) is a finding, not a hang.
const GRANT_LIMIT: Duration = Duration::from_secs(10);

/// The snapshotter of the recorder W8 installs once per process; `None` if another recorder
/// was installed first (the metrics then cannot be read).
fn snapshotter() -> Option<&'static Snapshotter> {
    static ONE: OnceLock<Option<Snapshotter>> = OnceLock::new();
    ONE.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().ok().map(|()| snapshotter)
    })
    .as_ref()
}

/// The renewals and the renewal calls counted since the last look (the recorder's counters
/// start again from zero at each look).
fn renewals_since_last(s: &Snapshotter) -> (u64, u64) {
    let (mut renewed, mut calls) = (0, 0);
    for (key, _, _, value) in s.snapshot().into_vec() {
        let key = key.key();
        let DebugValue::Counter(n) = value else {
            continue;
        };
        match key.name() {
            "dlock_renewal_total" if key.labels().any(|l| l.value() == "renewed") => renewed += n,
            "dlock_renewal_calls_total" => calls += n,
            _ => {}
        }
    }
    (renewed, calls)
}

/// W8 with `holds` names on `target`: its row.
pub(super) async fn scale(target: &Target, holds: u64, opts: &BenchOpts) -> dlock::Result<Row> {
    let mut row = Row::new(&target.label, format!("W8/{holds}"));
    let Some(metrics) = snapshotter() else {
        row.skipped = Some("another metrics recorder is installed".into());
        return Ok(row);
    };
    let ns = namespace();
    let (conns_before, server_before) = (
        floor::server_connections(&target.url).await,
        floor::server_memory(&target.url).await,
    );
    let rss_before = rss_kib();
    let p = target.client().await?;
    let started = Instant::now();
    let guards = match take(&p, &ns, holds).await {
        Ok(guards) => guards,
        Err(why) => {
            row.skipped = Some(why);
            return Ok(row);
        }
    };
    let took = started.elapsed();
    let (rss_after, conns_after, server_after) = (
        rss_kib(),
        floor::server_connections(&target.url).await,
        floor::server_memory(&target.url).await,
    );
    // From here on every hold renews at most a third of its lease after the last renewal
    // (where the backend batches, on the process's beats): over `hold_for`, each about
    // `hold_for / (lease / 3)` times; the first renewals of the last holds taken fall in it.
    renewals_since_last(metrics);
    let window = Instant::now();
    tokio::time::sleep(opts.hold_for).await;
    let (renewed, calls) = renewals_since_last(metrics);
    let secs = window.elapsed().as_secs_f64();
    let n = guards.len() as u64;
    // What was measured stands if giving the holds back fails (the provider may lose them all
    // at once, its session gone): the failure is the row's note, not its end.
    if let Err(e) = give_back(guards).await {
        row.afterwards = Some(format!("giving the holds back failed: {e}"));
    }
    row.cycles = n;
    row.seconds = secs;
    row.cycles_per_sec = renewed as f64 / secs;
    row.holds = Some(n);
    row.grant_secs = Some(took.as_secs_f64());
    row.renewal_calls_per_sec = Some(if calls == 0 { renewed } else { calls } as f64 / secs);
    // The growth of the resident set: a lower bound, since the holds may reuse memory an
    // earlier row freed; none when the allocator gave back more than the holds took.
    row.client_bytes_per_hold = rss_before
        .zip(rss_after)
        .filter(|(a, b)| b >= a)
        .map(|(a, b)| (b - a) as f64 * 1024.0 / n.max(1) as f64);
    row.server_bytes_per_hold = server_before
        .zip(server_after)
        .map(|(a, b)| (b - a) as f64 / n.max(1) as f64);
    row.server_connections = conns_before.zip(conns_after).map(|(a, b)| b - a);
    Ok(row)
}

/// Takes `holds` names of `ns` on `p` (watchdog leases of the default 30 s) with
/// [`TAKERS`] tasks; why it could not, as a row's note.
async fn take(p: &DynLockProvider, ns: &str, holds: u64) -> Result<Vec<LockGuard>, String> {
    let lease = LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(30)));
    let mut takers = Vec::new();
    for t in 0..TAKERS {
        let p = std::sync::Arc::clone(p);
        let ns = ns.to_owned();
        takers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in (t..holds).step_by(usize::try_from(TAKERS).unwrap_or(64)) {
                let lock = p.lock(&format!("{ns}/w8/{i}"), lease)?;
                match lock.try_acquire(GRANT_LIMIT).await? {
                    Some(g) => mine.push(g),
                    None => {
                        return Err(dlock::Error::config(format!(
                            "held {} names, then waited {GRANT_LIMIT:?} in vain for one more",
                            mine.len()
                        )));
                    }
                }
            }
            Ok::<_, dlock::Error>(mine)
        }));
    }
    let mut guards = Vec::new();
    let mut failed = None;
    for t in takers {
        match t.await {
            Ok(Ok(mine)) => guards.extend(mine),
            Ok(Err(e)) => failed = Some(e.to_string()),
            Err(e) => failed = Some(format!("a taker panicked: {e}")),
        }
    }
    match failed {
        None => Ok(guards),
        Some(why) => {
            let n = guards.len();
            let _ = give_back(guards).await;
            Err(format!("took {n} of {holds} holds, then: {why}"))
        }
    }
}

/// Releases `guards` with [`TAKERS`] tasks, every one of them (a failed release does not
/// leave the rest to be dropped, nor a task still releasing when this returns); the first
/// failure, if one failed.
async fn give_back(guards: Vec<LockGuard>) -> dlock::Result<()> {
    let per = guards
        .len()
        .div_ceil(usize::try_from(TAKERS).unwrap_or(64))
        .max(1);
    let mut shares = Vec::new();
    let mut rest = guards;
    while !rest.is_empty() {
        let share: Vec<LockGuard> = rest.drain(..per.min(rest.len())).collect();
        shares.push(tokio::spawn(async move {
            let mut first = None;
            for g in share {
                if let Err(e) = g.release().await {
                    first.get_or_insert(e);
                }
            }
            first.map_or(Ok(()), Err)
        }));
    }
    let mut first = None;
    for s in shares {
        let released = s
            .await
            .map_err(|e| dlock::Error::config(format!("a releaser panicked: {e}")))
            .and_then(|r| r);
        if let Err(e) = released {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}
