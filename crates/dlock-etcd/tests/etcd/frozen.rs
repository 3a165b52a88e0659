//! A holder process frozen with SIGSTOP (a GC pause, a VM migration) past its lease's
//! time-to-live loses the lock, another process acquires within the time-to-live + 2 s, and
//! the holder is told once it runs again.
//!
//! The frozen holder is this test binary run again (`worker_process`, which does nothing
//! unless `DLOCK_WORKER` is set), so it is a real process with its own client and lease.

use std::time::Duration;

use dlock_conformance::{Names, must, service_url};
use dlock_core::{Lease, LockOptions, LockProvider, LossReason};
use dlock_etcd::EtcdProvider;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::time::Instant;

use crate::support::{Proc, SERIAL, SHORT_TTL, with_ttl};

/// The worker side, run in a child process: takes the lock (with the default 30 s watchdog
/// lease, or a fixed lease of `DLOCK_WORKER_FIXED_S` seconds), says HELD, then says LOST
/// (with the reason) when its hold is reported lost. A line on its stdin makes a plain
/// thread answer `VOUCHED true|false` (`is_held()`) at once: the first thing the process does
/// when it runs again after a freeze, before its runtime has heard from the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    let Ok(mode) = std::env::var("DLOCK_WORKER") else {
        return;
    };
    assert_eq!(mode, "hold", "unknown worker mode");
    let url = std::env::var("DLOCK_WORKER_URL").unwrap();
    let name = std::env::var("DLOCK_WORKER_NAME").unwrap();
    let options = match std::env::var("DLOCK_WORKER_FIXED_S") {
        Ok(secs) => {
            LockOptions::new().with_lease(Lease::Fixed(Duration::from_secs(secs.parse().unwrap())))
        }
        Err(_) => LockOptions::default(),
    };
    let p = EtcdProvider::connect(&url).await.unwrap();
    let g = p.lock(&name, options).unwrap().acquire().await.unwrap();
    println!("HELD {}", g.fencing_token());
    let g = std::sync::Arc::new(g);
    let probe = std::sync::Arc::clone(&g);
    std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).unwrap_or(0) > 0 {
            println!("VOUCHED {}", probe.is_held());
            line.clear();
        }
    });
    g.lost().await;
    println!("LOST {:?}", g.loss_reason());
    // Wait for the test to end this process.
    std::future::pending::<()>().await;
}

/// A holder process frozen (SIGSTOP: a GC pause, a VM migration) past its lease's 2 s
/// time-to-live: the server ends its lease, another process acquires within the
/// time-to-live + 2 s, and the holder, resumed, is told its hold is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_holder_process_loses_the_lock_within_its_ttl() {
    frozen_holder(None).await;
}

/// As above for a hold with a fixed lease of 60 s, far longer than the 2 s etcd lease that
/// keeps its key: the resumed holder does not vouch for it either (the lease's horizon
/// bounds every hold, not only watchdog ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_holder_of_a_long_fixed_lease_loses_the_lock_within_its_ttl() {
    frozen_holder(Some(Duration::from_secs(60))).await;
}

/// A worker process holds a lock (a fixed lease of `fixed`, or the default watchdog lease)
/// with a 2 s etcd lease and is frozen: see the tests above.
async fn frozen_holder(fixed: Option<Duration>) {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let name = Names::new().name("sigstop");
    let worker_url = with_ttl(&url, SHORT_TTL);
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "frozen::worker_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DLOCK_WORKER", "hold")
        .env("DLOCK_WORKER_URL", &worker_url)
        .env("DLOCK_WORKER_NAME", &name);
    if let Some(fixed) = fixed {
        command.env("DLOCK_WORKER_FIXED_S", fixed.as_secs().to_string());
    }
    let mut worker = Proc::spawn(&mut command);
    let held = worker
        .line(Duration::from_secs(20), "the worker holds the lock", |l| {
            l.contains("HELD ")
        })
        .await;
    // The test harness prints its own text before the worker's on the same line.
    let worker_token: u64 = held.rsplit("HELD ").next().unwrap().trim().parse().unwrap();

    let p = EtcdProvider::connect(&url).await.unwrap();
    let lock = p.lock(&name, LockOptions::default()).unwrap();
    assert!(
        lock.try_acquire(Duration::ZERO).await.unwrap().is_none(),
        "held by the worker"
    );
    worker.signal("STOP");
    let frozen = Instant::now();
    let bound = SHORT_TTL + Duration::from_secs(2);
    let g = must(
        bound + Duration::from_secs(1),
        "the try after the freeze",
        lock.try_acquire(bound),
    )
    .await
    .unwrap()
    .unwrap_or_else(|| panic!("still held {bound:?} after its holder froze"));
    eprintln!("free {:?} after SIGSTOP", frozen.elapsed());
    assert!(g.fencing_token().get() > worker_token);

    // Resumed, the holder does not vouch for its hold, even before it hears from the server
    // (its lock's lease is longer than the etcd lease that kept its key), ...
    let stdin = worker.child.stdin.as_mut().unwrap();
    stdin.write_all(b"check\n").await.unwrap();
    stdin.flush().await.unwrap();
    worker.signal("CONT");
    // ... and learns its lease is gone (the two lines come in either order).
    let (mut vouched, mut lost) = (None, None);
    while vouched.is_none() || lost.is_none() {
        let l = worker
            .line(
                Duration::from_secs(10),
                "the resumed holder answers and is told of its loss",
                |l| l.contains("VOUCHED ") || l.contains("LOST "),
            )
            .await;
        if l.contains("VOUCHED ") {
            vouched = Some(l);
        } else {
            lost = Some(l);
        }
    }
    let (vouched, lost) = (vouched.unwrap(), lost.unwrap());
    assert!(
        vouched.ends_with("VOUCHED false"),
        "the frozen holder vouched for a lock another process holds: {vouched}"
    );
    // Whichever notices first: its horizon passed while it was stopped (`SessionTimedOut`),
    // or the server says the etcd lease is gone (`SessionExpired`).
    assert!(
        [LossReason::SessionTimedOut, LossReason::SessionExpired]
            .iter()
            .any(|r| lost.contains(&format!("{:?}", Some(r)))),
        "{lost}"
    );
    g.release().await.unwrap();
}
