//! Contenders that loop acquire / use / release on one lock while a test attacks the store
//! (kills a leader, loses a quorum), and the checks of what they saw: never two holders at
//! once (lost holds included, up to when their owner was told), tokens unique and growing in
//! the order the holders got in, and progress.
//!
//! ```no_run
//! # async fn demo(locks: Vec<dlock_core::DynLock>) {
//! use std::time::Duration;
//! use dlock_conformance::contention::Contention;
//!
//! let run = Contention::start(locks);
//! let t0 = tokio::time::Instant::now();
//! let no_details = || async { String::new() };
//! run.await_progress(t0, 3, Duration::from_secs(5), "every contender gets in", no_details)
//!     .await;
//! // ... attack the store here ...
//! let report = run.stop(Duration::from_secs(10)).await;
//! report.check();
//! # }
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};

use dlock_core::backend::Mutex;
use std::time::Duration;

use dlock_core::{DynLock, Error, HoldState};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::{eventually, must};

/// One acquisition, as its contender saw it.
#[derive(Debug, Clone)]
pub struct Record {
    /// The contender's index in the locks given to [`Contention::start`].
    pub who: usize,
    /// The hold's fencing token.
    pub token: u64,
    /// When `acquire` returned.
    pub start: Instant,
    /// When the contender stopped using the lock (before release; for a lost hold, when it
    /// was told).
    pub end: Instant,
    /// The guard was reported lost (`lost()` fired or the state was `Lost`).
    pub lost: bool,
    /// The guard was vouched for (`is_held()`) when the contender began to use it.
    pub used: bool,
}

#[derive(Default)]
struct Shared {
    /// Contenders using the lock right now (between a held acquisition and loss or release).
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    records: Mutex<Vec<Record>>,
    /// Failed acquire/release calls (expected while the store elects a leader).
    errors: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
}

/// Contenders running on one lock name, one task per lock handle.
#[derive(Debug)]
pub struct Contention {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    contenders: usize,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("inside", &self.inside)
            .field("max_inside", &self.max_inside)
            .finish_non_exhaustive()
    }
}

impl Contention {
    /// Starts one contender per handle (handles of one name, from one provider each).
    pub fn start(locks: Vec<DynLock>) -> Self {
        let shared = Arc::new(Shared::default());
        let (stop, stop_rx) = watch::channel(false);
        let contenders = locks.len();
        let tasks = locks
            .into_iter()
            .enumerate()
            .map(|(who, l)| tokio::spawn(contend(who, l, Arc::clone(&shared), stop_rx.clone())))
            .collect();
        Self {
            shared,
            stop,
            tasks,
            contenders,
        }
    }

    /// Acquisitions per contender that began after `since`.
    pub fn per_contender_since(&self, since: Instant) -> Vec<usize> {
        let mut per = vec![0usize; self.contenders];
        for r in lock(&self.shared.records)
            .iter()
            .filter(|r| r.start > since)
        {
            per[r.who] += 1;
        }
        per
    }

    /// The failed calls so far.
    pub fn errors(&self) -> Vec<String> {
        lock(&self.shared.errors).clone()
    }

    /// Waits until every contender acquired at least `each` times after `since`; fails the
    /// test after `limit` with the counts, the errors and what `diagnose` says.
    pub async fn await_progress<F, Fut>(
        &self,
        since: Instant,
        each: usize,
        limit: Duration,
        what: &str,
        diagnose: F,
    ) where
        F: Fn() -> Fut,
        Fut: Future<Output = String>,
    {
        eventually(limit, what, || async {
            let per = self.per_contender_since(since);
            if per.iter().all(|n| *n >= each) {
                Ok(())
            } else {
                Err(format!(
                    "{per:?}; {}; errors: {:?}",
                    diagnose().await,
                    self.errors()
                ))
            }
        })
        .await;
    }

    /// Stops the contenders (each within `limit`) and returns what they saw.
    pub async fn stop(self, limit: Duration) -> Report {
        let _ = self.stop.send(true);
        for t in must(
            limit,
            "contenders stop",
            futures::future::join_all(self.tasks),
        )
        .await
        {
            if let Err(e) = t {
                panic!("a contender failed: {e}");
            }
        }
        Report {
            records: lock(&self.shared.records).clone(),
            errors: lock(&self.shared.errors).clone(),
            max_inside: self.shared.max_inside.load(Ordering::SeqCst),
        }
    }
}

/// Loops acquire / hold a few ms / release until `stop` turns true.
async fn contend(who: usize, l: DynLock, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut round = 0u64;
    loop {
        if *stop.borrow() {
            return;
        }
        let acquired = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            r = l.acquire() => r,
        };
        let g = match acquired {
            Ok(g) => g,
            Err(e) => {
                lock(&shared.errors).push(format!("contender {who}: acquire: {e}"));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        round += 1;
        let start = Instant::now();
        let used = g.is_held();
        let mut lost = false;
        if used {
            let before = shared.inside.fetch_add(1, Ordering::SeqCst);
            shared.max_inside.fetch_max(before + 1, Ordering::SeqCst);
            // Use the resource for 1-4 ms, stopping at once if the hold is lost.
            let hold = Duration::from_millis(1 + (round + who as u64) % 4);
            lost = tokio::select! {
                _ = g.lost() => true,
                _ = tokio::time::sleep(hold) => false,
            };
            shared.inside.fetch_sub(1, Ordering::SeqCst);
        }
        let end = Instant::now();
        lost |= g.state() == HoldState::Lost;
        lock(&shared.records).push(Record {
            who,
            token: g.fencing_token().get(),
            start,
            end,
            lost,
            used,
        });
        match must(Duration::from_secs(10), "release", g.release()).await {
            Ok(()) | Err(Error::LockLost { .. }) => {}
            Err(e) => lock(&shared.errors).push(format!("contender {who}: release: {e}")),
        }
    }
}

/// What the contenders saw, once stopped.
#[derive(Debug, Clone)]
pub struct Report {
    /// Every acquisition, in the order they were recorded.
    pub records: Vec<Record>,
    /// Failed acquire and release calls.
    pub errors: Vec<String>,
    /// The most contenders ever inside at once (by the in-process counter).
    pub max_inside: usize,
}

impl Report {
    /// The records in the order their holders got in.
    pub fn in_order(&self) -> Vec<&Record> {
        let mut in_order: Vec<&Record> = self.records.iter().collect();
        in_order.sort_by_key(|r| r.start);
        in_order
    }

    /// Acquisitions that began after `t`.
    pub fn after(&self, t: Instant) -> usize {
        self.records.iter().filter(|r| r.start > t).count()
    }

    /// Prints a summary and the first failed calls to stderr.
    pub fn print(&self, what: &str) {
        eprintln!(
            "{what}: {} acquisitions, {} lost, {} failed calls, {} used while not vouched for",
            self.records.len(),
            self.records.iter().filter(|r| r.lost).count(),
            self.errors.len(),
            self.records.iter().filter(|r| !r.used).count()
        );
        for e in self.errors.iter().take(10) {
            eprintln!("  {e}");
        }
    }

    /// Panics unless: every acquisition got a token of its own; tokens grew in the order the
    /// holders got in (lost holds too: a token is the grant's, however the hold ended); and
    /// no two holders used the lock at once, lost holds included up to when their owner was
    /// told (the contract: exclusion for as long as no holder has been told its lock is
    /// lost), by the recorded intervals and by the in-process counter.
    pub fn check(&self) {
        let mut by_token: BTreeMap<u64, &Record> = BTreeMap::new();
        for r in &self.records {
            if let Some(other) = by_token.insert(r.token, r) {
                panic!("token {} handed out twice: {other:?} and {r:?}", r.token);
            }
        }
        let in_order = self.in_order();
        for w in in_order.windows(2) {
            assert!(
                w[1].token > w[0].token,
                "fencing tokens went backwards: {:?} then {:?}",
                w[0],
                w[1]
            );
        }
        let mut end_so_far: Option<&Record> = None;
        for r in in_order.iter().filter(|r| r.used) {
            if let Some(prev) = end_so_far {
                assert!(
                    r.start >= prev.end,
                    "two holders at once: {prev:?} still used the lock when {r:?} got it"
                );
            }
            if end_so_far.is_none_or(|p| r.end > p.end) {
                end_so_far = Some(r);
            }
        }
        assert!(
            self.max_inside <= 1,
            "two contenders were inside at once ({})",
            self.max_inside
        );
    }
}
