//! The floor of each backend: the server calls one lock cycle needs, made directly with the
//! client library (no dlock) in the same run, so throughput can be read as a ratio.
//!
//! | backend | floor cycle |
//! | --- | --- |
//! | Redis | the two EVALSHA of dlock's acquire and release scripts |
//! | ZooKeeper | create (ephemeral sequential) and getChildren sent together, then delete |
//! | W7 (Redis, ZooKeeper, etcd) | 64 tasks of the floor cycle on one shared client, a name each |
//! | W7 (PostgreSQL advisory, for-update) | 64 tasks of the advisory cycle on a pool of the provider's lock pool's size, a connection per cycle |
//! | MySQL, PostgreSQL, SQLite | dlock's statements of the strategy's uncontended cycle ([`dlock_sql::raw::Cycle`]), on one connection (for-update's fence on a second one, as dlock takes it from its pool) |
//! | MySQL, PostgreSQL for-update, besides | the row lock alone: BEGIN + SELECT … FOR UPDATE + ROLLBACK, no fence ([`Floor::LockOnly`]) |
//! | etcd | the put-if-absent transaction (with the lease, reading the key and the first key by create revision) + the delete transaction |
//! | memory | none (no server) |

// Without a server backend no floor starts.
#![cfg_attr(
    not(any(
        feature = "redis",
        feature = "zookeeper",
        feature = "mysql",
        feature = "sqlite",
        feature = "postgres",
        feature = "etcd"
    )),
    allow(dead_code)
)]

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "mysql", feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "zookeeper")]
mod zookeeper;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::measure::cpu_time;

/// What a floor makes raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Floor {
    /// The server calls of one uncontended dlock cycle: every store's floor.
    Cycle,
    /// SQL for-update only (`None` elsewhere): the row lock alone, `BEGIN`, `SELECT … FOR
    /// UPDATE`, `ROLLBACK`, without the fencing token dlock takes and commits on another
    /// connection: what a lock without a fence would cost.
    LockOnly,
}

/// Cycles per second of the floor for the store `url` names, or `None` if it has none.
pub(super) async fn cycles_per_sec(
    url: &str,
    cycles: u64,
    ns: &str,
    floor: Floor,
) -> dlock::Result<Option<Measured>> {
    let start = Start(None);
    let job = Job {
        url,
        cycles,
        ns,
        floor,
        start: &start,
    };
    let timed = timed(&job).await?;
    Ok(timed.and_then(|t| {
        Some(Measured {
            rate: t.rate(cycles)?,
            cpu: t.cpu,
        })
    }))
}

/// A floor's cycles per second, and the CPU time its cycles took.
pub(super) struct Measured {
    pub(super) rate: f64,
    pub(super) cpu: Option<Duration>,
}

/// What one floor client measures: the store, how many cycles, the prefix of the names it
/// locks, what it makes raw, and when its cycles begin.
struct Job<'a> {
    url: &'a str,
    cycles: u64,
    // ZooKeeper's floor locks in a directory of its own, not under the prefix.
    #[cfg_attr(
        not(any(
            feature = "redis",
            feature = "etcd",
            feature = "mysql",
            feature = "sqlite",
            feature = "postgres"
        )),
        allow(dead_code)
    )]
    ns: &'a str,
    floor: Floor,
    start: &'a Start,
}

/// When a floor's timed cycles began and ended, or `None` if the store has no floor. The
/// cycles begin once the job's start says so.
async fn timed(job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let url = job.url;
    let scheme = url.split("://").next().unwrap_or_default();
    // Only a MySQL for-update lock has a row lock to measure alone (decided before
    // connecting; for-update on PostgreSQL is an advisory lock).
    let for_update = matches!(scheme, "mysql" | "mariadb") && strategy_of(url) == "for-update";
    if job.floor == Floor::LockOnly && !for_update {
        return Ok(None);
    }
    match scheme {
        #[cfg(feature = "redis")]
        "redis" | "rediss" if !url.contains("cluster=true") => redis::timed(job).await,
        #[cfg(feature = "etcd")]
        "etcd" => etcd::timed(job).await,
        #[cfg(feature = "zookeeper")]
        "zk" => zookeeper::timed(job).await,
        #[cfg(any(feature = "mysql", feature = "sqlite"))]
        "mysql" | "mariadb" | "sqlite" => sql::mysql_or_sqlite(job, scheme).await,
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => sql::postgres(job).await,
        _ => Ok(None),
    }
}

/// The W4 floor: 8 clients of the client library at once, each with its own connection and
/// name, each making `cycles` floor cycles; all the cycles over the time from the first
/// client's start to the last one's end, or `None` if the store has no floor.
///
/// The clients connect first and start their cycles together, so none runs alone for a
/// while (a sum of per-client rates would count such a stretch at its solo speed), and the
/// rate is measured as dlock's W4 is: total cycles over wall-clock time.
pub(super) async fn concurrent_cycles_per_sec(
    url: &str,
    cycles: u64,
    ns: &str,
) -> dlock::Result<Option<f64>> {
    const CLIENTS: usize = 8;
    let together = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..CLIENTS {
        let (url, ns) = (url.to_owned(), format!("{ns}/floor{i}"));
        let start = Start(Some(Arc::clone(&together)));
        clients.spawn(async move {
            let job = Job {
                url: &url,
                cycles,
                ns: &ns,
                floor: Floor::Cycle,
                start: &start,
            };
            timed(&job).await
        });
    }
    let mut span: Option<Timed> = None;
    // The first error ends the floor at once: a client that failed before the start would
    // otherwise keep the others waiting for it (dropping the set stops them).
    while let Some(done) = clients.join_next().await {
        let done =
            done.map_err(|e| dlock::Error::config(format!("a floor client panicked: {e}")))??;
        let Some(t) = done else {
            return Ok(None);
        };
        span = Some(match span {
            None => t,
            Some(s) => Timed {
                started: s.started.min(t.started),
                ended: s.ended.max(t.ended),
                cpu: None,
            },
        });
    }
    let all = cycles.saturating_mul(CLIENTS as u64);
    Ok(span.and_then(|s| s.rate(all)))
}

/// The W7 floor: `tasks` tasks of the client library on one shared client (as dlock's
/// provider shares one among its tasks), each on a name of its own making `cycles` floor
/// cycles, started together; all the cycles over the time from the first task's start to the
/// last one's end, or `None` where the store has no such floor. PostgreSQL's pinned
/// strategies share a pool of connections instead, as their provider's lock pool
/// ([`sql::postgres_shared`]); MySQL's and the row strategies have none yet.
pub(super) async fn shared_cycles_per_sec(
    url: &str,
    tasks: u64,
    cycles: u64,
    ns: &str,
) -> dlock::Result<Option<f64>> {
    let _ = (tasks, cycles, ns);
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme {
        #[cfg(feature = "redis")]
        "redis" | "rediss" if !url.contains("cluster=true") => {
            redis::shared(url, tasks, cycles, ns).await
        }
        #[cfg(feature = "zookeeper")]
        "zk" => zookeeper::shared(url, tasks, cycles).await,
        #[cfg(feature = "etcd")]
        "etcd" => etcd::shared(url, tasks, cycles, ns).await,
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => sql::postgres_shared(url, tasks, cycles, ns).await,
        _ => Ok(None),
    }
}

/// `tasks` tasks, each making one warm-up cycle (`cycle(task, 0)`), then, all together,
/// `cycles` more (`cycle(task, 1..=cycles)`): all the timed cycles over the time from the
/// first task's start to the last one's end. The first error ends them all.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "zookeeper",
        feature = "etcd",
        feature = "postgres"
    )),
    allow(dead_code)
)]
async fn tasks_together<F, Fut>(tasks: u64, cycles: u64, cycle: F) -> dlock::Result<Option<f64>>
where
    F: Fn(u64, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = dlock::Result<()>> + Send,
{
    let together = Arc::new(tokio::sync::Barrier::new(
        usize::try_from(tasks).unwrap_or(usize::MAX),
    ));
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (cycle, together) = (cycle.clone(), Arc::clone(&together));
        set.spawn(async move {
            cycle(task, 0).await?;
            together.wait().await;
            let began = Instant::now();
            for n in 1..=cycles {
                cycle(task, n).await?;
            }
            Ok::<_, dlock::Error>((began, Instant::now()))
        });
    }
    let mut span: Option<(Instant, Instant)> = None;
    while let Some(done) = set.join_next().await {
        let (began, ended) =
            done.map_err(|e| dlock::Error::config(format!("a floor task panicked: {e}")))??;
        span = Some(span.map_or((began, ended), |(b, e)| (b.min(began), e.max(ended))));
    }
    Ok(span.and_then(|(began, ended)| {
        let secs = ended.saturating_duration_since(began).as_secs_f64();
        let all = tasks.saturating_mul(cycles);
        (all > 0 && secs > 0.0).then(|| all as f64 / secs)
    }))
}

/// When a floor's timed cycles begin: at once, or once every client of a W4 floor is
/// connected and ready (the barrier they share).
struct Start(Option<Arc<tokio::sync::Barrier>>);

impl Start {
    /// Waits for the start; when the cycles begin.
    async fn go(&self) -> Began {
        if let Some(together) = &self.0 {
            together.wait().await;
        }
        Began {
            at: Instant::now(),
            cpu: cpu_time(),
        }
    }
}

/// When a floor's timed cycles began, and the process's CPU time then.
#[derive(Clone, Copy)]
struct Began {
    at: Instant,
    cpu: Option<Duration>,
}

/// When a floor's timed cycles began and ended, and the process's CPU time over them (of
/// every client of a W4 floor, not only this one's).
#[derive(Clone, Copy)]
struct Timed {
    started: Instant,
    ended: Instant,
    cpu: Option<Duration>,
}

impl Timed {
    /// `cycles` over the time from start to end; `None` if no cycle ran or no time passed
    /// (a floor of 0 would make the ratio to it infinite).
    fn rate(self, cycles: u64) -> Option<f64> {
        let secs = self
            .ended
            .saturating_duration_since(self.started)
            .as_secs_f64();
        (cycles > 0 && secs > 0.0).then(|| cycles as f64 / secs)
    }
}

/// The cycles that began at `began` ended now.
fn timed_since(began: Began) -> Option<Timed> {
    Some(Timed {
        started: began.at,
        ended: Instant::now(),
        cpu: cpu_time()
            .zip(began.cpu)
            .and_then(|(now, then)| now.checked_sub(then)),
    })
}

/// A floor's failure: what it was doing on which backend, and the client library's error.
fn err(backend: &'static str, what: &str, e: impl std::fmt::Display) -> dlock::Error {
    dlock::Error::backend_failed(backend, format!("floor: {what}: {e}"), false)
}

/// The strategy a SQL store's URL names (`unique-insert` when it names none).
fn strategy_of(url: &str) -> &str {
    url.split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("strategy=")))
        .unwrap_or("unique-insert")
}

/// The server's memory in use, bytes, where the store says (Redis's `used_memory`).
pub(super) async fn server_memory(url: &str) -> Option<i64> {
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme {
        #[cfg(feature = "redis")]
        "redis" | "rediss" if !url.contains("cluster=true") => redis::used_memory(url).await,
        _ => None,
    }
}

/// Connections the server counts right now (Redis clients, MySQL threads, PostgreSQL
/// sessions of the URL's user), for W6 and W7; `None` where it is not read (ZooKeeper: one
/// session per provider by design, which its tests check).
pub(super) async fn server_connections(url: &str) -> Option<i64> {
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme {
        #[cfg(feature = "redis")]
        "redis" | "rediss" if !url.contains("cluster=true") => redis::connections(url).await,
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => sql::mysql_connections(url).await,
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => sql::postgres_connections(url).await,
        _ => None,
    }
}
