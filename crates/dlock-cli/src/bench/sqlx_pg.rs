//! The `sqlx PgAdvisoryLock` target: W1 and W3 through sqlx's own PostgreSQL advisory lock on
//! the same server, beside the `postgres/advisory` rows of the same run.
//!
//! sqlx's lock is a bare `pg_advisory_lock` on a connection the caller holds: no lease, no
//! fencing token, no loss signal, no re-entry by the handle. It shows what an advisory lock
//! costs at the least; dlock's rows add those promises on top.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sqlx::postgres::{PgAdvisoryLock, PgPoolOptions};

use super::measure::{fill_handoff, fill_latency, finish, histogram, out_of_time, us};
use super::targets::SQLX_PG as LABEL;
use super::{Row, Workload};

/// One row per requested workload of W1 and W3 against the PostgreSQL of `url`; a row's
/// `skipped` starts with `error:` when the run failed.
pub(super) async fn rows(
    url: &str,
    ns: &str,
    workloads: &[Workload],
    cycles: u64,
    limit: Option<Duration>,
) -> Vec<Row> {
    let run = Run {
        url,
        ns,
        cycles,
        limit,
    };
    let mut rows = Vec::new();
    for w in workloads {
        let mut row = Row::new(LABEL, format!("{w:?}"));
        let ran = match w {
            Workload::W1 => uncontended(&run, &mut row).await,
            Workload::W3 => handoff(&run, &mut row).await,
            _ => continue,
        };
        if let Err(e) = ran {
            row.skipped = Some(format!("error: {e}"));
        }
        rows.push(row);
    }
    rows
}

/// What every workload of the target runs against: the server, the prefix of its names, the
/// cycles (W1's count) and `--duration`.
struct Run<'a> {
    url: &'a str,
    ns: &'a str,
    cycles: u64,
    limit: Option<Duration>,
}

async fn pool(url: &str, size: u32) -> Result<sqlx::PgPool, String> {
    let base = url.split('?').next().unwrap_or(url);
    PgPoolOptions::new()
        .max_connections(size)
        .connect(base)
        .await
        .map_err(|e| format!("connect: {e}"))
}

fn failed(what: &'static str) -> impl Fn(sqlx::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// W1: acquire + release on one connection, 200 warm-up cycles first.
async fn uncontended(run: &Run<'_>, row: &mut Row) -> Result<(), String> {
    let (url, ns, cycles, limit) = (run.url, run.ns, run.cycles, run.limit);
    let pool = pool(url, 1).await?;
    let mut conn = pool.acquire().await.map_err(failed("connect"))?;
    let lock = PgAdvisoryLock::new(format!("{ns}/sqlx-w1"));
    for _ in 0..200.min(cycles) {
        let g = lock.acquire(&mut conn).await.map_err(failed("lock"))?;
        g.release_now().await.map_err(failed("unlock"))?;
    }
    let mut h: Histogram<u64> = histogram().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut n = 0;
    while n < cycles && !out_of_time(started, limit) {
        let t = Instant::now();
        let g = lock.acquire(&mut conn).await.map_err(failed("lock"))?;
        g.release_now().await.map_err(failed("unlock"))?;
        let _ = h.record(us(t.elapsed()));
        n += 1;
    }
    finish(row, n, started.elapsed());
    fill_latency(row, &h);
    drop(conn);
    pool.close().await;
    Ok(())
}

/// W3: two connections hand the lock back and forth; the time from the holder's release
/// call to the waiter's acquire returning.
async fn handoff(run: &Run<'_>, row: &mut Row) -> Result<(), String> {
    let (url, ns, cycles, limit) = (run.url, run.ns, run.cycles, run.limit);
    let handoffs = (cycles / 4).max(2);
    // Two sessions hand the lock back and forth; a third watches the waiter queue.
    let pool = pool(url, 3).await?;
    let lock = Arc::new(PgAdvisoryLock::new(format!("{ns}/sqlx-w3")));
    let mut holder = pool.acquire().await.map_err(failed("connect"))?;
    let mut waiter = pool.acquire().await.map_err(failed("connect"))?;
    let mut observer = pool.acquire().await.map_err(failed("connect"))?;
    let mut holder_pid = backend_pid(&mut holder).await?;
    let mut waiter_pid = backend_pid(&mut waiter).await?;
    lock.acquire(&mut holder)
        .await
        .map_err(failed("lock"))?
        .leak();
    let mut h: Histogram<u64> = histogram().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut n = 0;
    while n < handoffs && !out_of_time(started, limit) {
        let task = {
            let lock = Arc::clone(&lock);
            tokio::spawn(async move {
                let got = lock.acquire(&mut waiter).await.map(|g| {
                    g.leak();
                });
                (got, Instant::now(), waiter)
            })
        };
        // The release comes once the waiter waits on the server.
        until_waiting(&mut observer, waiter_pid).await?;
        // From the release's call: the waiter's grant can come before the release's answer
        // does, never before its call.
        let releasing = Instant::now();
        let (conn, released) = lock.force_release(holder).await.map_err(failed("unlock"))?;
        if !released {
            return Err("the holder did not hold the lock".into());
        }
        let (got, acquired, conn_of_waiter) =
            task.await.map_err(|e| format!("waiter panicked: {e}"))?;
        got.map_err(failed("lock"))?;
        let _ = h.record(us(acquired.saturating_duration_since(releasing)));
        // The waiter holds now: the roles swap.
        holder = conn_of_waiter;
        waiter = conn;
        std::mem::swap(&mut holder_pid, &mut waiter_pid);
        n += 1;
    }
    lock.force_release(holder).await.map_err(failed("unlock"))?;
    finish(row, n, started.elapsed());
    fill_handoff(row, &h);
    drop((waiter, observer));
    pool.close().await;
    Ok(())
}

/// Polls `pg_stat_activity` until backend `pid` waits for a lock; an error after 10 s.
async fn until_waiting(
    observer: &mut sqlx::pool::PoolConnection<sqlx::Postgres>,
    pid: i32,
) -> Result<(), String> {
    let waiting = async {
        loop {
            let waits: bool = sqlx::query_scalar(
                "SELECT COALESCE(bool_or(wait_event_type = 'Lock'), false) \
                 FROM pg_stat_activity WHERE pid = $1",
            )
            .bind(pid)
            .fetch_one(&mut **observer)
            .await
            .map_err(failed("watch the waiter"))?;
            if waits {
                return Ok(());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap_or_else(|_| Err("the waiter never waited on the server".into()))
}

async fn backend_pid(conn: &mut sqlx::pool::PoolConnection<sqlx::Postgres>) -> Result<i32, String> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut **conn)
        .await
        .map_err(failed("pid"))
}
