//! etcd beyond the conformance suite, against real servers from
//! `scripts/services up etcd etcd-cluster`:
//! - interop with etcd's own lock: `etcdctl lock` (Debian's etcd-client) and dlock exclude
//!   each other both ways, and a dlock waiter wakes when the `etcdctl` holder exits;
//! - a holder process frozen with SIGSTOP past its lease's time-to-live loses the lock, another
//!   process acquires within the time-to-live + 2 s, and the holder is told once it runs again,
//!   with the default watchdog lease or a fixed lease far longer than the time-to-live;
//! - the leader of the 3-member cluster killed (SIGKILL) under contention: never two unlost
//!   holders at once, tokens strictly growing, every contender goes on after the election;
//! - a holder whose network goes silent, with the default settings, is told before anyone
//!   else gets its lock, and a try through a silent network is an error, never "held";
//! - a full database (etcd's NOSPACE alarm) is an error that no retry hides.
//!
//! The frozen holder is this test binary run again (`worker_process`, which does nothing
//! unless `DLOCK_WORKER` is set), so it is a real process with its own client and lease.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use dlock_conformance::contention::Contention;
use dlock_conformance::tls::{free_port, make_certificates, openssl};
use dlock_conformance::{Names, Partition, ProxyPartition, eventually, must, service_url};
use dlock_core::backend::CALL_GRACE;
use dlock_core::{DriftAllowance, DynLock, Error, Lease, LockOptions, LockProvider, LossReason};
use dlock_etcd::etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client, GetOptions};
use dlock_etcd::{DEFAULT_LEASE_TTL, DEFAULT_PORT, EtcdConfig, EtcdProvider};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;

/// The tests here that kill or stop processes run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The lease time-to-live of the frozen holder.
const FROZEN_TTL: Duration = Duration::from_secs(2);

/// The first endpoint of an `etcd://` URL, for `etcdctl --endpoints`.
fn endpoints(url: &str) -> String {
    EtcdConfig::from_url(url).unwrap().endpoints.join(",")
}

/// A child process killed (and reaped) when the test ends, however it ends.
struct Proc {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    fn pid(&self) -> String {
        self.child.id().expect("the process runs").to_string()
    }

    /// The next line the process prints that `keep` accepts, within `limit`.
    async fn line(&mut self, limit: Duration, what: &str, keep: impl Fn(&str) -> bool) -> String {
        must(limit, what, async {
            loop {
                match self.lines.next_line().await.unwrap() {
                    Some(l) if keep(&l) => return l,
                    Some(_) => {}
                    None => panic!("{what}: the process ended first"),
                }
            }
        })
        .await
    }

    fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.pid()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} {}", self.pid());
    }
}

/// `etcdctl lock NAME` on the member of `url`: prints the key once it holds the lock and
/// keeps it until interrupted (its own session lease, 10 s by default).
fn etcdctl_lock(url: &str, lock_name: &str) -> Proc {
    Proc::spawn(
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints(url)))
            .args(["lock", lock_name]),
    )
}

/// The keys queued under lock name `lock_name`.
async fn queued(url: &str, lock_name: &str) -> i64 {
    let mut c = Client::connect(EtcdConfig::from_url(url).unwrap().endpoints, None)
        .await
        .unwrap();
    c.get(
        format!("{lock_name}/"),
        Some(GetOptions::new().with_prefix().with_count_only()),
    )
    .await
    .unwrap()
    .count()
}

/// Takes lock `name` of `p` with the default options.
async fn hold(p: &EtcdProvider, name: &str) -> dlock_core::LockGuard {
    p.lock(name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap()
}

/// A provider whose connection to the first member of `url` goes through a proxy of its
/// own; `query` (`""` or `?…`) is added to its URL.
async fn proxied(url: &str, query: &str) -> (dlock_proxy::Proxy, EtcdProvider) {
    let config = EtcdConfig::from_url(url).unwrap();
    let proxy = dlock_proxy::Proxy::start(config.endpoints[0].clone())
        .await
        .unwrap();
    let p = EtcdProvider::connect(&format!("etcd://{}{query}", proxy.addr()))
        .await
        .unwrap();
    (proxy, p)
}

/// Waits (5 s at most) until `n` keys are queued under lock name `lock_name`.
async fn await_queued(url: &str, lock_name: &str, n: i64, what: &str) {
    eventually(Duration::from_secs(5), what, || async {
        match queued(url, lock_name).await {
            k if k == n => Ok(()),
            k => Err(k),
        }
    })
    .await;
}

/// etcd's own lock and dlock on one name: each excludes the other, and a dlock waiter is
/// woken by the `etcdctl` holder's exit (its key's delete), not by its lease running out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_dlock_exclude_each_other() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let p = EtcdProvider::connect(&url).await.unwrap();
    let name = Names::new().name("etcdctl");
    let lock_name = p.config().etcd_lock_name(&name).unwrap();
    let lock = p.lock(&name, LockOptions::default()).unwrap();

    // etcdctl first: dlock waits, and gets the lock when etcdctl lets go.
    let mut ctl = etcdctl_lock(&url, &lock_name);
    let key = ctl
        .line(
            Duration::from_secs(10),
            "etcdctl takes the free lock",
            |_| true,
        )
        .await;
    assert!(
        key.starts_with(&format!("{lock_name}/")),
        "etcdctl's key {key} is under the lock name {lock_name}"
    );
    assert!(
        lock.try_acquire(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none(),
        "dlock got the lock etcdctl holds"
    );
    let waiter = tokio::spawn({
        let lock = std::sync::Arc::clone(&lock);
        async move {
            let g = lock.acquire().await.unwrap();
            (Instant::now(), g)
        }
    });
    await_queued(&url, &lock_name, 2, "the dlock waiter queues").await;
    let exit = Instant::now();
    ctl.signal("INT");
    // etcdctl revokes its session's lease on SIGINT: far sooner than that lease's 10 s.
    let (got, g) = must(
        Duration::from_secs(5),
        "the dlock waiter gets the lock etcdctl let go",
        waiter,
    )
    .await
    .unwrap();
    eprintln!(
        "dlock waiter granted {:?} after etcdctl's SIGINT",
        got - exit
    );
    let status = must(Duration::from_secs(5), "etcdctl exits", ctl.child.wait())
        .await
        .unwrap();
    assert!(
        status.success() || status.code().is_none() || status.code() == Some(130),
        "etcdctl: {status}"
    );

    // dlock first: etcdctl waits, and gets the lock when dlock releases.
    let mut ctl = etcdctl_lock(&url, &lock_name);
    await_queued(&url, &lock_name, 2, "etcdctl queues").await;
    let early = tokio::time::timeout(Duration::from_millis(500), ctl.lines.next_line()).await;
    assert!(
        early.is_err(),
        "etcdctl said it holds the lock dlock holds: {early:?}"
    );
    let token = g.fencing_token().get();
    g.release().await.unwrap();
    let key = ctl
        .line(
            Duration::from_secs(5),
            "etcdctl gets the lock dlock released",
            |_| true,
        )
        .await;
    assert!(key.starts_with(&format!("{lock_name}/")), "{key}");
    assert!(
        lock.try_acquire(Duration::ZERO).await.unwrap().is_none(),
        "dlock got the lock etcdctl holds"
    );
    ctl.signal("INT");
    must(Duration::from_secs(5), "etcdctl exits", ctl.child.wait())
        .await
        .unwrap();
    let g = must(
        Duration::from_secs(5),
        "dlock takes the lock again",
        lock.acquire(),
    )
    .await
    .unwrap();
    assert!(
        g.fencing_token().get() > token,
        "tokens grow across etcdctl's hold"
    );
    g.release().await.unwrap();
}

/// Review #8: a release whose delete was applied but whose answer was lost (the connection
/// cut while the server's replies were held back) succeeds. Before, the retry's compare
/// found the key gone and the release said `LockLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_answer_was_lost_succeeds() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let (proxy, p) = proxied(&url, "").await;
    let name = Names::new().name("lost-answer");
    let lock_name = p.config().etcd_lock_name(&name).unwrap();
    let g = hold(&p, &name).await;
    assert_eq!(queued(&url, &lock_name).await, 1);

    proxy.set_fault(dlock_proxy::Fault::Downstream);
    let release = tokio::spawn(g.release());
    await_queued(&url, &lock_name, 0, "the server deleted the key").await;
    proxy.reset();
    proxy.set_fault(dlock_proxy::Fault::None);
    let released = must(Duration::from_secs(10), "the release", release)
        .await
        .unwrap();
    assert!(
        released.is_ok(),
        "the release whose answer was lost: {released:?}"
    );
}

/// Review #5: calls had no time limit, so a member that stops answering while its TCP
/// connection stays open (a partition, a frozen member) held a `release` (and every other
/// call) until the kernel gave up, minutes later. Now each call ends within the lease's
/// time-to-live: the release returns an error in time, and the lock is free once the
/// partition heals (or the lease runs out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_through_a_partition_end_within_the_lease() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let ttl = FROZEN_TTL;
    let (proxy, p) = proxied(&url, &format!("?ttl_s={}", ttl.as_secs())).await;
    let name = Names::new().name("partitioned");
    let g = hold(&p, &name).await;
    proxy.set_fault(dlock_proxy::Fault::Partition);
    let started = Instant::now();
    let released = must(
        ttl * 3 + Duration::from_secs(2),
        "a release through the partition",
        g.release(),
    )
    .await;
    eprintln!(
        "release through the partition: {released:?} after {:?}",
        started.elapsed()
    );
    assert!(released.is_err(), "released through a partition");
    proxy.set_fault(dlock_proxy::Fault::None);
    let other = EtcdProvider::connect(&url).await.unwrap();
    let g = must(
        ttl * 3,
        "the lock after the partition",
        other.lock(&name, LockOptions::default()).unwrap().acquire(),
    )
    .await
    .unwrap();
    g.release().await.unwrap();
}

/// The time limit on calls (the lease's time-to-live, see above) is not a limit on the
/// streams: a hold kept for three times the time-to-live stays held throughout (its
/// keep-alive stream is not cut), and a waiter watching its predecessor that long gets the
/// lock when it is released (its watch is not cut either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_outlive_the_call_time_limit() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}ttl_s={}", FROZEN_TTL.as_secs());
    let (a, b) = (
        EtcdProvider::connect(&url).await.unwrap(),
        EtcdProvider::connect(&url).await.unwrap(),
    );
    let name = Names::new().name("long-streams");
    let g = hold(&a, &name).await;
    let lb = b.lock(&name, LockOptions::default()).unwrap();
    let waiter = tokio::spawn(async move { lb.acquire().await });
    let until = dlock_core::backend::later(Instant::now(), FROZEN_TTL * 3);
    while Instant::now() < until {
        assert!(g.is_held(), "the hold was not vouched for: {:?}", g.state());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!waiter.is_finished(), "the waiter got the held lock");
    g.release().await.unwrap();
    let got = must(
        Duration::from_secs(5),
        "the waiter after the release",
        waiter,
    )
    .await
    .unwrap();
    got.unwrap().release().await.unwrap();
    assert_eq!(
        b.stats().watches,
        1,
        "one watch, never cut: {:?}",
        b.stats()
    );
}

// ------------------------------------------------------------------ a silent network

/// A provider whose connection to the first member of `url` goes through a
/// [`ProxyPartition`] of its own; `query` (`""` or `?…`) is added to its URL.
async fn behind_partition(url: &str, query: &str) -> (ProxyPartition, EtcdProvider) {
    let first = format!("etcd://{}", EtcdConfig::from_url(url).unwrap().endpoints[0]);
    let (cut, proxied) = ProxyPartition::start(&first, DEFAULT_PORT).await.unwrap();
    let p = EtcdProvider::connect(&format!("{}{query}", proxied.trim_end_matches('/')))
        .await
        .unwrap();
    (cut, p)
}

/// `later - earlier` with its sign, for messages.
fn signed(earlier: Instant, later: Instant) -> String {
    match later.checked_duration_since(earlier) {
        Some(d) => format!("+{d:?}"),
        None => format!("-{:?}", earlier - later),
    }
}

/// A holder with the default settings (the provider's 10 s etcd lease, the lock's 30 s
/// watchdog lease) whose network goes silent: nothing it sends arrives, nothing comes back,
/// and its connection stays open. Its guard's `lost()` resolves, as `SessionTimedOut` (no
/// answer moved its horizon), strictly before another client's `acquire()` returns, by at
/// least the drift allowance of the horizon (1 % of the 10 s it spans, plus 5 ms) less what
/// a loaded machine may add to a timer: the guard stops at its horizon (the send of the last
/// keep-alive the server answered, plus the time-to-live the server answered with) less that
/// allowance, and the server ends the etcd lease no sooner than that keep-alive's arrival
/// plus the time-to-live (and then within its revoke loop's 500 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_holder_is_told_before_anyone_else_gets_the_lock() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    // Timed to the millisecond: no process-killing test beside it.
    let _serial = SERIAL.lock().await;
    let (cut, holder) = behind_partition(&url, "").await;
    assert_eq!(holder.config().lease_ttl, DEFAULT_LEASE_TTL);
    let other = EtcdProvider::connect(&url).await.unwrap();
    let name = Names::new().name("silent-holder");
    let lock_name = other.config().etcd_lock_name(&name).unwrap();
    let g = hold(&holder, &name).await;
    let lost = g.lost();
    let lost = tokio::spawn(async move {
        lost.await;
        Instant::now()
    });
    let lock = other.lock(&name, LockOptions::default()).unwrap();
    let waiter = tokio::spawn(async move {
        let got = lock.acquire().await;
        (Instant::now(), got)
    });
    await_queued(&url, &lock_name, 2, "the other client waits").await;

    cut.set_partitioned(true);
    let silent = Instant::now();
    let bound = DEFAULT_LEASE_TTL + Duration::from_secs(5);
    let lost_at = must(bound, "the silent holder is told", lost)
        .await
        .unwrap();
    let (granted_at, got) = must(bound, "the other client gets the lock", waiter)
        .await
        .unwrap();
    let taken = got.unwrap();
    eprintln!(
        "network silent at 0: holder told at {}, other client granted at {}; margin {}",
        signed(silent, lost_at),
        signed(silent, granted_at),
        signed(lost_at, granted_at),
    );
    assert!(
        lost_at < granted_at,
        "the lock passed on {} before its silent holder was told",
        signed(granted_at, lost_at)
    );
    let allowance = DriftAllowance::DEFAULT.of(DEFAULT_LEASE_TTL);
    let least = allowance.saturating_sub(Duration::from_millis(50));
    assert!(
        granted_at - lost_at >= least,
        "the silent holder was told only {} before the lock passed on (allowance {allowance:?})",
        signed(lost_at, granted_at)
    );
    assert_eq!(g.loss_reason(), Some(LossReason::SessionTimedOut));
    assert!(!g.is_held());
    cut.set_partitioned(false);
    taken.release().await.unwrap();
}

/// A client whose network went silent cannot tell whether a lock is held: `try_acquire`
/// returns a retryable error, never `Ok(None)` ("held by someone"; here nobody holds the
/// lock), both while its etcd lease may still live (its put is never answered) and once the
/// lease has ended (no new one can be granted). An `acquire()` made while the network is
/// silent gets the lock once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_through_a_silent_network_is_an_error_not_held() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let ttl = FROZEN_TTL;
    let (cut, p) = behind_partition(&url, &format!("?ttl_s={}", ttl.as_secs())).await;
    let lock = p
        .lock(&Names::new().name("silent-try"), LockOptions::default())
        .unwrap();
    let wait = Duration::from_millis(500);
    let bound = wait + CALL_GRACE + Duration::from_secs(3);
    let no_answer = |got: Result<Option<dlock_core::LockGuard>, Error>, when: &str| match got {
        Err(e) => {
            eprintln!("{when}: {e}");
            assert!(e.is_retryable(), "{when}: {e:?}");
        }
        Ok(None) => panic!("{when}: Ok(None), \"held\", from a store that did not answer"),
        Ok(Some(_)) => panic!("{when}: acquired through a silent network"),
    };
    cut.set_partitioned(true);
    let got = must(
        bound,
        "a try while the lease may live",
        lock.try_acquire(wait),
    )
    .await;
    no_answer(got, "while the lease may live");
    eventually(ttl * 3, "the provider's lease ends", || async {
        match p.lease_id() {
            None => Ok(()),
            Some(l) => Err(l),
        }
    })
    .await;
    let got = must(bound, "a try once the lease ended", lock.try_acquire(wait)).await;
    no_answer(got, "once the lease ended");

    let waiter = tokio::spawn({
        let lock = std::sync::Arc::clone(&lock);
        async move { lock.acquire().await }
    });
    cut.set_partitioned(false);
    let g = must(
        ttl * 3 + Duration::from_secs(5),
        "an acquire once the network is back",
        waiter,
    )
    .await
    .unwrap()
    .unwrap();
    g.release().await.unwrap();
}

// ------------------------------------------------------------------ the frozen holder

/// The worker side, run in a child process: takes the lock (with the default 30 s watchdog
/// lease, or a fixed lease of `DLOCK_WORKER_FIXED_S` seconds), says HELD, then says LOST (with the reason) when its hold is reported lost. A line
/// on its stdin makes a plain thread answer `VOUCHED true|false` (`is_held()`) at once: the
/// first thing the process does when it runs again after a freeze, before its runtime has
/// heard from the server.
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
    let sep = if url.contains('?') { '&' } else { '?' };
    let worker_url = format!("{url}{sep}ttl_s={}", FROZEN_TTL.as_secs());
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "worker_process",
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
    let bound = FROZEN_TTL + Duration::from_secs(2);
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

// ------------------------------------------------------------------ the leader killed

/// The pid `scripts/services` recorded for the cluster member with client port `port`, if
/// that process still runs that member (its command line names the member's data dir).
fn member_pid(port: &str) -> Option<u32> {
    let state_dir = std::env::var_os("DLOCK_SERVICES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("dlock-services"));
    let pid: u32 = std::fs::read_to_string(state_dir.join(format!("etcd/{port}/etcd.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains(&format!("etcd/{port}/data"))
        .then_some(pid)
}

/// Which of `endpoints` leads, asking each member itself.
async fn leader_among(endpoints: &[String]) -> Result<String, String> {
    let mut seen = Vec::new();
    for e in endpoints {
        let status = async {
            let mut c = Client::connect([e.as_str()], None).await.ok()?;
            tokio::time::timeout(Duration::from_secs(2), c.status())
                .await
                .ok()?
                .ok()
        }
        .await;
        match status {
            Some(s) if s.header().map(|h| h.member_id()) == Some(s.leader()) => {
                return Ok(e.clone());
            }
            Some(_) => seen.push(format!("{e}: follower")),
            None => seen.push(format!("{e}: no answer")),
        }
    }
    Err(seen.join(", "))
}

/// Brings the cluster back whole (`scripts/services up etcd-cluster` restarts a member that
/// is down) when dropped, so a failing test leaves it whole too.
struct Restore;

impl Restore {
    fn run() -> Result<(), String> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = std::process::Command::new(root.join("scripts/services"))
            .args(["up", "etcd-cluster"])
            .current_dir(&root)
            .env("DLOCK_SERVICES_TIMEOUT", "30")
            .output()
            .map_err(|e| format!("cannot run scripts/services: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "scripts/services up etcd-cluster failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Err(e) = Self::run() {
            eprintln!("{e}");
        }
    }
}

const CONTENDERS: usize = 4;
/// Acquisitions every contender must make before the kill, and after the election.
const PROGRESS: usize = 3;

/// The leader of the 3-member cluster killed while 4 contenders fight over one name: no two
/// unlost holders at once, tokens strictly increasing, every contender gets in again after
/// the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_during_contention() {
    let Some(url) = service_url("DLOCK_ETCD_CLUSTER_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    must(
        Duration::from_secs(120),
        "the failover scenario",
        failover(url),
    )
    .await;
}

async fn failover(url: String) {
    let endpoints = EtcdConfig::from_url(&url).unwrap().endpoints;
    assert!(endpoints.len() >= 3, "{url} names fewer than 3 members");
    let leader = eventually(Duration::from_secs(10), "the cluster has a leader", || {
        leader_among(&endpoints)
    })
    .await;
    let leader_port = leader.rsplit(':').next().unwrap().to_owned();
    let Some(pid) = member_pid(&leader_port) else {
        let require = std::env::var("DLOCK_TEST_REQUIRE").unwrap_or_default();
        let why = format!(
            "the leader {leader} was not started by scripts/services (no etcd/{leader_port}/etcd.pid), \
             so it cannot be killed"
        );
        assert!(
            require.is_empty(),
            "{why}, but DLOCK_TEST_REQUIRE={require} forbids skipping"
        );
        eprintln!("skipped: {why}");
        return;
    };

    let name = Names::new().name("failover");
    let mut providers = Vec::new();
    let mut locks: Vec<DynLock> = Vec::new();
    for _ in 0..CONTENDERS {
        let p = must(
            Duration::from_secs(10),
            "connect",
            EtcdProvider::connect(&url),
        )
        .await
        .unwrap();
        locks.push(p.lock(&name, LockOptions::default()).unwrap());
        providers.push(p);
    }
    let diagnose = || async {
        providers
            .iter()
            .map(|p| format!("{:?} lease {:?}", p.stats(), p.lease_id()))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let run = Contention::start(locks);
    let t0 = Instant::now();
    run.await_progress(
        t0,
        PROGRESS,
        Duration::from_secs(10),
        "every contender gets in",
        diagnose,
    )
    .await;

    let restore = Restore;
    let killed_at = Instant::now();
    let ok = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -KILL {pid}");
    let others: Vec<String> = endpoints
        .iter()
        .filter(|e| **e != leader)
        .cloned()
        .collect();
    let new_leader = eventually(
        Duration::from_secs(20),
        "the survivors elect a leader",
        || leader_among(&others),
    )
    .await;
    let elected_at = Instant::now();
    eprintln!(
        "killed the leader {leader} (pid {pid}); {new_leader} leads after {:?}",
        elected_at - killed_at
    );
    run.await_progress(
        elected_at,
        PROGRESS,
        Duration::from_secs(30),
        "every contender acquires after the election",
        diagnose,
    )
    .await;
    let report = run.stop(Duration::from_secs(20)).await;
    drop(restore);
    report.print("etcd leader killed");
    report.check();
    assert!(
        report.records.iter().any(|r| r.start < killed_at),
        "acquisitions before the kill"
    );
    assert!(report.after(elected_at) >= CONTENDERS * PROGRESS);
}

// ------------------------------------------------------------------ TLS

/// `etcds://`: a private etcd member of this test's own that serves TLS only and asks every
/// client for a certificate its CA signed. With the CA and the client certificate, locks
/// work; without the client certificate, without the CA (the public roots do not know it),
/// or over plain `etcd://`, connecting fails with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_with_a_private_ca_and_a_client_certificate() {
    // The member is this test's own, but it runs Debian's etcd like the shared ones.
    if service_url("DLOCK_ETCD_URL").is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("dlock-etcd-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    make_certificates(&dir);
    let (port, peer) = (
        free_port().expect("a free loopback port"),
        free_port().expect("a free loopback port"),
    );
    let file = |f: &str| dir.join(f).display().to_string();
    let mut member = Command::new("etcd");
    member
        .args(["--name", "tls", "--data-dir", &file("data")])
        .arg(format!("--listen-client-urls=https://127.0.0.1:{port}"))
        .arg(format!("--advertise-client-urls=https://127.0.0.1:{port}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
        ))
        .arg(format!("--initial-cluster=tls=http://127.0.0.1:{peer}"))
        .args([
            "--cert-file",
            &file("server.pem"),
            "--key-file",
            &file("server.key"),
        ])
        .args(["--client-cert-auth", "--trusted-ca-file", &file("ca.pem")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap())
        .kill_on_drop(true);
    let _member = member.spawn().expect("etcd runs");

    let url = format!(
        "etcds://127.0.0.1:{port}?ca_file={}&cert_file={}&key_file={}&connect_timeout_ms=2000",
        file("ca.pem"),
        file("client.pem"),
        file("client.key")
    );
    let p = eventually(
        Duration::from_secs(30),
        "a TLS connection to the member",
        || {
            let url = url.clone();
            async move { EtcdProvider::connect(&url).await.map_err(|e| e.to_string()) }
        },
    )
    .await;
    assert!(p.config().tls.is_some());
    let lock = p
        .lock(&Names::new().name("tls"), LockOptions::default())
        .unwrap();
    let g = lock.acquire().await.unwrap();
    assert!(g.fencing_token().get() > 0);
    assert!(
        lock.try_acquire(Duration::ZERO).await.unwrap().is_none() || g.is_held(),
        "held"
    );
    g.release().await.unwrap();

    for (what, bad) in [
        (
            "without the client certificate",
            format!(
                "etcds://127.0.0.1:{port}?ca_file={}&connect_timeout_ms=2000",
                file("ca.pem")
            ),
        ),
        (
            "without the CA",
            format!(
                "etcds://127.0.0.1:{port}?cert_file={}&key_file={}&connect_timeout_ms=2000",
                file("client.pem"),
                file("client.key")
            ),
        ),
        (
            "over plain etcd://",
            format!("etcd://127.0.0.1:{port}?connect_timeout_ms=2000"),
        ),
    ] {
        let r = must(Duration::from_secs(20), what, EtcdProvider::connect(&bad)).await;
        match r {
            Ok(_) => panic!("{what}: connected"),
            Err(e) => eprintln!("{what}: {e}"),
        }
    }
    let missing = format!("etcds://127.0.0.1:{port}?ca_file={}", file("nope.pem"));
    let e = EtcdProvider::connect(&missing).await.unwrap_err();
    assert!(matches!(e, dlock_core::Error::Config { .. }), "{e}");
    assert!(e.to_string().contains("nope.pem"), "{e}");
    drop(_member);
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------ authentication

/// A private etcd member of a test's own on loopback ports nobody uses, killed when dropped.
struct PrivateMember {
    dir: PathBuf,
    port: u16,
    peer: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl PrivateMember {
    /// A fresh data directory under the temporary directory; `args` may name files in it
    /// as `{dir}`, and `prepare` writes them before the member starts.
    fn start(tag: &str, args: &[&str], prepare: impl FnOnce(&std::path::Path)) -> Self {
        let dir = std::env::temp_dir().join(format!("dlock-etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        prepare(&dir);
        let args = args
            .iter()
            .map(|a| a.replace("{dir}", &dir.display().to_string()))
            .collect();
        let mut m = Self {
            dir,
            port: free_port().expect("a free loopback port"),
            peer: free_port().expect("a free loopback port"),
            args,
            child: None,
        };
        m.run();
        m
    }

    /// Starts the member on its data.
    fn run(&mut self) {
        let (port, peer) = (self.port, self.peer);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .args(["--name", "private"])
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{port}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{port}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=private=http://127.0.0.1:{peer}"))
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("etcd runs");
        self.child = Some(child);
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Waits until the member answers a status call.
    async fn await_serving(&self) {
        eventually(Duration::from_secs(30), "the private member serves", || {
            let e = self.endpoint();
            async move {
                Client::connect([e], None)
                    .await
                    .map_err(|e| e.to_string())?
                    .status()
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
        .await;
    }

    async fn etcdctl(&self, args: &[&str]) {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(args)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateMember {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Review #3: with authentication on, a client's token ends (a JWT after its time-to-live,
/// here 2 s; a simple token when its member restarts), and every call failed from then on as
/// `Unauthenticated`, not retryable: the provider was dead for good. Now it logs in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_logs_in_again_when_its_token_ends() {
    if service_url("DLOCK_ETCD_URL").is_none() {
        return;
    }
    let member = PrivateMember::start(
        "auth",
        &["--auth-token=jwt,pub-key={dir}/jwt.pub,priv-key={dir}/jwt.key,sign-method=ES256,ttl=2s"],
        |dir| {
            openssl(
                dir,
                &[
                    "ecparam",
                    "-name",
                    "prime256v1",
                    "-genkey",
                    "-noout",
                    "-out",
                    "jwt.key",
                ],
            );
            openssl(dir, &["ec", "-in", "jwt.key", "-pubout", "-out", "jwt.pub"]);
        },
    );
    member.await_serving().await;
    member.etcdctl(&["user", "add", "root:dlock-root-pw"]).await;
    member.etcdctl(&["auth", "enable"]).await;

    let url = format!("etcd://root:dlock-root-pw@{}", member.endpoint());
    let p = EtcdProvider::connect(&url).await.unwrap();
    let lock = p
        .lock(&Names::new().name("auth"), LockOptions::default())
        .unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    // A client that logged in with the provider, and never again: once its calls are
    // refused, the token the provider got at the same time has ended too.
    let options = dlock_etcd::etcd_client::ConnectOptions::new().with_user("root", "dlock-root-pw");
    let mut witness = Client::connect([member.endpoint()], Some(options))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the tokens end", || {
        let mut w = witness.clone();
        async move {
            match w.get("x", None).await {
                Err(e) => Ok(e.to_string()),
                Ok(_) => Err("still accepted"),
            }
        }
    })
    .await;
    let _ = witness.get("x", None).await;
    let g = must(
        Duration::from_secs(10),
        "an acquire after the token ended",
        lock.try_acquire(Duration::from_secs(5)),
    )
    .await
    .unwrap_or_else(|e| panic!("after the token ended: {e}"))
    .expect("the lock is free");
    g.release().await.unwrap();
}

/// Review #4: a release whose delete failed for good (here: the user's write permission
/// revoked under its hold) dropped the key's reservation, and the key stayed on the server
/// under the provider's lease, kept alive for the provider's whole life: the lock was
/// blocked for everyone else. Now the provider goes on deleting it in the background, and
/// once the permission is back the lock is free without the provider being dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_delete_failed_is_deleted_later() {
    if service_url("DLOCK_ETCD_URL").is_none() {
        return;
    }
    let member = PrivateMember::start("perm", &[], |_| {});
    member.await_serving().await;
    for args in [
        &["user", "add", "root:dlock-root-pw"][..],
        &["role", "add", "locker"],
        &[
            "role",
            "grant-permission",
            "locker",
            "--prefix=true",
            "readwrite",
            "dlock/",
        ],
        &["user", "add", "alice:dlock-alice-pw"],
        &["user", "grant-role", "alice", "locker"],
        &["auth", "enable"],
    ] {
        member.etcdctl(args).await;
    }
    let root = |args: &[&str]| {
        let mut v = vec!["--user", "root:dlock-root-pw"];
        v.extend_from_slice(args);
        v.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let alice = EtcdProvider::connect(&format!(
        "etcd://alice:dlock-alice-pw@{}",
        member.endpoint()
    ))
    .await
    .unwrap();
    let other = EtcdProvider::connect(&format!("etcd://root:dlock-root-pw@{}", member.endpoint()))
        .await
        .unwrap();
    let name = Names::new().name("perm");
    let g = hold(&alice, &name).await;
    let revoke = root(&[
        "role",
        "revoke-permission",
        "locker",
        "--prefix=true",
        "dlock/",
    ]);
    member
        .etcdctl(&revoke.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let released = g.release().await;
    assert!(released.is_err(), "released without the permission");
    let lock = other.lock(&name, LockOptions::default()).unwrap();
    assert!(
        lock.try_acquire(Duration::from_millis(200))
            .await
            .unwrap()
            .is_none(),
        "the key is still there while it cannot be deleted"
    );
    let grant = root(&[
        "role",
        "grant-permission",
        "locker",
        "--prefix=true",
        "readwrite",
        "dlock/",
    ]);
    member
        .etcdctl(&grant.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    // Well within the provider's life and lease (10 s, kept alive all along).
    let g = must(
        Duration::from_secs(8),
        "the lock once the key could be deleted",
        lock.acquire(),
    )
    .await
    .unwrap();
    g.release().await.unwrap();
    drop(alice);
}

// ------------------------------------------------------------------ a store that refuses writes

/// The member's NOSPACE alarm (`database space exceeded`), raised through the alarm API as
/// etcd raises it at its quota (`true`) or disarmed (`false`).
async fn set_nospace(admin: &mut Client, raised: bool) {
    let member = admin.status().await.unwrap().header().unwrap().member_id();
    let mut options = AlarmOptions::new();
    options.with_member(member);
    let action = if raised {
        AlarmAction::Activate
    } else {
        AlarmAction::Deactivate
    };
    admin
        .alarm(action, AlarmType::Nospace, Some(options))
        .await
        .unwrap();
}

/// A member whose database is full (the NOSPACE alarm) refuses every write and every lease
/// grant until an operator frees space and disarms the alarm: no retry helps. `acquire()`
/// returns at once with an error that is not retryable and names the cause, whether the
/// provider's lease lives (its put is refused) or must be replaced (the grant is refused);
/// so does connecting. Keep-alives go on meanwhile, and once the alarm is disarmed the lock
/// is taken as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_is_an_error_no_retry_hides() {
    if service_url("DLOCK_ETCD_URL").is_none() {
        return;
    }
    let member = PrivateMember::start("nospace", &[], |_| {});
    member.await_serving().await;
    let url = format!("etcd://{}", member.endpoint());
    let p = EtcdProvider::connect(&url).await.unwrap();
    let lock = p
        .lock(&Names::new().name("nospace"), LockOptions::default())
        .unwrap();
    let mut admin = Client::connect([member.endpoint()], None).await.unwrap();
    let refused = |got: Result<(), Error>, what: &str| {
        let e = got.expect_err(what);
        eprintln!("{what}: {e}");
        assert!(!e.is_retryable(), "{what}: retryable: {e:?}");
        assert!(
            e.to_string().contains("database space exceeded"),
            "{what}: {e}"
        );
    };
    set_nospace(&mut admin, true).await;

    let got = must(
        Duration::from_secs(5),
        "an acquire on a full database",
        lock.acquire(),
    )
    .await;
    refused(got.map(drop), "the put");
    let got = must(
        Duration::from_secs(5),
        "a try on a full database",
        lock.try_acquire(Duration::from_secs(1)),
    )
    .await;
    refused(got.map(drop), "the put of a try");

    let lease = p.lease_id().unwrap();
    admin.lease_revoke(lease).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the provider sees its lease gone",
        || async {
            match p.lease_id() {
                Some(l) if l == lease => Err(l),
                _ => Ok(()),
            }
        },
    )
    .await;
    let got = must(
        Duration::from_secs(5),
        "an acquire waiting for a new lease",
        lock.acquire(),
    )
    .await;
    refused(got.map(drop), "the grant");
    let got = must(
        Duration::from_secs(5),
        "connecting to a full database",
        EtcdProvider::connect(&url),
    )
    .await;
    refused(got.map(drop), "connecting");

    set_nospace(&mut admin, false).await;
    let g = must(
        Duration::from_secs(10),
        "an acquire once the alarm is disarmed",
        lock.acquire(),
    )
    .await
    .unwrap();
    g.release().await.unwrap();
}
