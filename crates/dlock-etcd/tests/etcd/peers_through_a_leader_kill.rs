//! etcd's own tools beside dlock on the 3-member cluster of `scripts/services` while its
//! leader is killed (SIGKILL): `etcdctl lock`, and `etcdctl elect` (a campaign is a lock of
//! the same layout: the key of the lowest create revision under the name leads), hold the
//! name through the election with dlock queued behind them; both sessions are kept alive
//! after it; the name passes to dlock when the tool lets go and back to the tool when dlock
//! releases; and `etcdctl elect -l` sees each leader, dlock included.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must};
use dlock_core::{LockOptions, LockProvider};
use dlock_etcd::EtcdProvider;
use dlock_etcd::etcd_client::Client;

use crate::support::cluster::ToKill;
use crate::support::{Proc, await_queued, etcdctl_elect, etcdctl_lock, etcdctl_observe};

/// How long a step may take on the cluster.
const STEP: Duration = Duration::from_secs(10);

/// How long a session may take to send its first keep-alive after the election: a third of
/// `etcdctl`'s 60 s session, and the client's own retries after the member it used died.
const KEEP_ALIVE: Duration = Duration::from_secs(40);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_dlock_through_a_leader_kill() {
    through_a_leader_kill(Tool::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_and_dlock_through_a_leader_kill() {
    through_a_leader_kill(Tool::Elect).await;
}

/// The etcd tool beside dlock.
#[derive(Clone, Copy, Debug)]
enum Tool {
    /// `etcdctl lock NAME`.
    Lock,
    /// `etcdctl elect NAME PROPOSAL`.
    Elect,
}

impl Tool {
    /// Starts the tool on `name` (proposing `proposal` in an election).
    fn start(self, url: &str, name: &str, proposal: &str) -> Proc {
        match self {
            Self::Lock => etcdctl_lock(url, name),
            Self::Elect => etcdctl_elect(url, name, proposal),
        }
    }

    /// The value of the tool's key: its proposal in an election, nothing for a lock.
    fn value(self, proposal: &str) -> &str {
        match self {
            Self::Lock => "",
            Self::Elect => proposal,
        }
    }

    /// Waits until `ctl` says it holds `name` (leads, proposing `proposal`): its key.
    async fn holds(self, ctl: &mut Proc, name: &str, proposal: &str, what: &str) -> String {
        let key = ctl.line(STEP, what, |_| true).await;
        assert!(key.starts_with(&format!("{name}/")), "{what}: {key}");
        if let Self::Elect = self {
            let said = ctl.line(STEP, what, |_| true).await;
            assert_eq!(said, proposal, "{what}: the proposal");
        }
        key
    }
}

async fn through_a_leader_kill(tool: Tool) {
    let Some(cluster) = ToKill::find().await else {
        return;
    };
    let url = cluster.url.clone();
    let p = EtcdProvider::connect(&url).await.unwrap();
    let name = Names::new().name("peers-kill");
    let lock_name = p.config().etcd_lock_name(&name).unwrap();
    let lock = p.lock(&name, LockOptions::default()).unwrap();
    let mut observer = etcdctl_observe(&url, &lock_name);
    let mut admin = Client::connect(cluster.endpoints.clone(), None)
        .await
        .unwrap();

    // The tool holds; dlock queues behind it.
    let mut ctl = tool.start(&url, &lock_name, "first");
    let first = tool
        .holds(&mut ctl, &lock_name, "first", "etcdctl takes the free name")
        .await;
    observed(&mut observer, &first, tool.value("first")).await;
    let waiter = tokio::spawn({
        let lock = std::sync::Arc::clone(&lock);
        async move { lock.acquire().await }
    });
    await_queued(&url, &lock_name, 2, "dlock queues behind etcdctl").await;
    let queued = keys(&mut admin, &lock_name).await;

    // The leader dies: both keep their keys, and both sessions are kept alive after the
    // election; dlock still waits.
    let killed = cluster.kill_the_leader().await;
    // (The test's own client asks the members that live: etcd-client does not pass a call
    // on to another endpoint when the one it picked refuses.)
    let mut admin = Client::connect(killed.survivors.clone(), None)
        .await
        .unwrap();
    let live = format!("etcd://{}", killed.survivors.join(","));
    for key in &queued {
        kept_alive(&mut admin, key).await;
    }
    assert_eq!(keys(&mut admin, &lock_name).await, queued, "the queue");
    assert!(!waiter.is_finished(), "dlock got in while etcdctl holds");

    // The tool lets go: dlock gets the name, and the observer sees dlock lead.
    ctl.signal("INT");
    let g = must(STEP, "dlock after etcdctl let go", waiter)
        .await
        .unwrap()
        .unwrap();
    let ours = keys(&mut admin, &lock_name).await;
    assert_eq!(ours.len(), 1, "dlock's key alone: {ours:?}");
    observed(&mut observer, &ours[0], "").await;
    exits(&mut ctl).await;

    // dlock holds; the tool queues behind it and gets the name at dlock's release.
    let mut ctl = tool.start(&url, &lock_name, "second");
    await_queued(&live, &lock_name, 2, "etcdctl queues behind dlock").await;
    let token = g.fencing_token();
    g.release().await.unwrap();
    let second = tool
        .holds(
            &mut ctl,
            &lock_name,
            "second",
            "etcdctl after dlock's release",
        )
        .await;
    observed(&mut observer, &second, tool.value("second")).await;
    // (A wait of its own, not a zero one: with a member down, etcd-client may send a call to
    // it, and a try with no wait has no time to send it again.)
    assert!(
        lock.try_acquire(Duration::from_secs(1))
            .await
            .unwrap()
            .is_none(),
        "dlock got in while etcdctl holds"
    );
    ctl.signal("INT");
    exits(&mut ctl).await;
    let g = must(STEP, "dlock again", lock.acquire()).await.unwrap();
    assert!(
        g.fencing_token() > token,
        "tokens grow across etcdctl's hold"
    );
    g.release().await.unwrap();
    observer.signal("INT");
    drop(killed);
}

/// The keys queued under `name`, oldest first.
async fn keys(admin: &mut Client, name: &str) -> Vec<String> {
    use dlock_etcd::etcd_client::{GetOptions, SortOrder, SortTarget};
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let got = admin.get(format!("{name}/"), Some(options)).await.unwrap();
    got.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Waits until the lease of `key` is renewed by its holder: its time to live (whole seconds)
/// goes up after it was seen 2 s or more below the time to live granted. (A new leader
/// extends every lease once when it takes over; a rise after such a low is a keep-alive.)
async fn kept_alive(admin: &mut Client, key: &str) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};
    let got = admin.get(key, None).await.unwrap();
    let lease = got.kvs().first().map(|kv| kv.lease()).expect("the key");
    let (left, granted) = ttl(admin, lease).await;
    let lowest = Arc::new(AtomicI64::new(left));
    let what = format!("a keep-alive of {key}'s lease after the election");
    eventually(KEEP_ALIVE, &what, || {
        let (mut admin, lowest) = (admin.clone(), Arc::clone(&lowest));
        async move {
            let (now, _) = ttl(&mut admin, lease).await;
            let low = lowest.fetch_min(now, Ordering::SeqCst);
            if low <= granted - 2 && now > low {
                Ok(())
            } else {
                Err(now)
            }
        }
    })
    .await;
}

/// What is left of `lease`'s time to live, and the time to live it was granted, in seconds.
async fn ttl(admin: &mut Client, lease: i64) -> (i64, i64) {
    let r = admin.lease_time_to_live(lease, None).await.unwrap();
    (r.ttl(), r.granted_ttl())
}

/// Waits until the observer prints the leader `key` and its `value`.
async fn observed(observer: &mut Proc, key: &str, value: &str) {
    let what = format!("etcdctl elect -l sees {key}");
    observer.line(STEP, &what, |l| l == key).await;
    let said = observer.line(STEP, &what, |_| true).await;
    assert_eq!(said, value, "{what}: its value");
}

/// Waits until the interrupted `ctl` exits.
async fn exits(ctl: &mut Proc) {
    let status = must(STEP, "etcdctl exits", ctl.child.wait()).await.unwrap();
    assert!(
        status.success() || status.code().is_none() || status.code() == Some(130),
        "etcdctl: {status}"
    );
}
