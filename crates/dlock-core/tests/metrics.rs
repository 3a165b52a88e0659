//! The `metrics` feature: the documented metrics appear, with their labels, in a recorder.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::backend::{HandleInfo, Lock, RawLock, Request};
use dlock_core::{DistributedLock, Lease, LockGuard, LockName, LockOptions, Result, async_trait};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

mod support;

/// Grants at once unless `busy`, then waits until the deadline.
#[derive(Debug, Default)]
struct State {
    busy: AtomicBool,
}

#[derive(Debug, Clone)]
struct Store(Arc<State>);

#[async_trait]
impl RawLock for Store {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        if self.0.busy.load(Ordering::SeqCst) {
            req.deadline.sleep().await;
            return Ok(None);
        }
        Ok(Some(support::granted(req, 1)))
    }
}

/// metric name + sorted labels → value.
fn snapshot(snapshotter: &metrics_util::debugging::Snapshotter) -> HashMap<String, DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

/// Snapshots every 10 ms until the watchdog's renewals reach two (within 10 s): counters and
/// gauges (both reset by each snapshot) added up across the snapshots, histograms as last
/// seen.
async fn until_renewed_twice(
    snapshotter: &metrics_util::debugging::Snapshotter,
) -> HashMap<String, DebugValue> {
    let renewed = "dlock_renewal_total{backend=test,outcome=renewed}";
    let deadline = dlock_core::backend::Deadline::after(Duration::from_secs(10));
    let mut seen: HashMap<String, DebugValue> = HashMap::new();
    loop {
        for (key, value) in snapshot(snapshotter) {
            match (seen.get_mut(&key), value) {
                (Some(DebugValue::Counter(sum)), DebugValue::Counter(n)) => *sum += n,
                (Some(DebugValue::Gauge(sum)), DebugValue::Gauge(n)) => {
                    *sum = (sum.into_inner() + n.into_inner()).into();
                }
                (_, value) => drop(seen.insert(key, value)),
            }
        }
        if matches!(seen.get(renewed), Some(DebugValue::Counter(n)) if *n >= 2) {
            return seen;
        }
        assert!(
            !deadline.has_passed(),
            "no two renewals within 10 s; seen {:?}",
            seen.keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn counter(m: &HashMap<String, DebugValue>, key: &str) -> u64 {
    match m.get(key) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{key}: {other:?}; have {:?}", m.keys().collect::<Vec<_>>()),
    }
}

#[tokio::test]
async fn the_documented_metrics_appear_with_their_labels() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let store = Store(Arc::default());
    let lock = |lease| {
        let info = HandleInfo::new(
            "test",
            "test://",
            LockName::new("secret-name").unwrap(),
            LockOptions::new().with_lease(lease),
        );
        Lock::new(info, store.clone())
    };
    let watchdog = lock(Lease::watchdog(Duration::from_millis(90)));
    let g = watchdog.acquire().await.unwrap();
    // Two renewals (at 30 and 60 ms), awaited with a deadline. The debugging recorder resets
    // counters and gauges at each snapshot: the snapshots taken meanwhile are added up.
    let m = until_renewed_twice(&snapshotter).await;
    assert_eq!(
        m.get("dlock_holds{backend=test,kind=mutex}"),
        Some(&DebugValue::Gauge(1.0.into()))
    );
    assert!(counter(&m, "dlock_renewal_total{backend=test,outcome=renewed}") >= 2);
    assert_eq!(
        counter(
            &m,
            "dlock_acquire_total{backend=test,kind=mutex,outcome=acquired}"
        ),
        1
    );
    g.release().await.unwrap();

    store.0.busy.store(true, Ordering::SeqCst);
    assert!(
        watchdog
            .try_acquire(Duration::from_millis(10))
            .await
            .unwrap()
            .is_none()
    );
    store.0.busy.store(false, Ordering::SeqCst);
    let fixed = lock(Lease::Fixed(Duration::from_millis(30)));
    let g = fixed.acquire().await.unwrap();
    g.lost().await;
    drop(g);
    // Let the finished keepers run to their end (this runtime has one thread).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }

    let m = snapshot(&snapshotter);
    assert_eq!(
        counter(
            &m,
            "dlock_acquire_total{backend=test,kind=mutex,outcome=acquired}"
        ),
        1
    );
    assert_eq!(
        counter(
            &m,
            "dlock_acquire_total{backend=test,kind=mutex,outcome=timeout}"
        ),
        1
    );
    assert_eq!(
        counter(
            &m,
            "dlock_release_total{backend=test,kind=mutex,outcome=released}"
        ),
        1
    );
    assert_eq!(
        counter(
            &m,
            "dlock_lost_total{backend=test,kind=mutex,reason=fixed_lease_ended}"
        ),
        1
    );
    assert!(matches!(
        m.get("dlock_acquire_duration_seconds{backend=test,kind=mutex,outcome=timeout}"),
        Some(DebugValue::Histogram(v)) if !v.is_empty()
    ));
    // Since the first snapshot: the watchdog hold ended, the fixed one came and went.
    assert_eq!(
        m.get("dlock_holds{backend=test,kind=mutex}"),
        Some(&DebugValue::Gauge((-1.0).into()))
    );
    assert!(
        m.keys().all(|k| !k.contains("secret-name")),
        "a lock name in a label: {:?}",
        m.keys()
    );
}
