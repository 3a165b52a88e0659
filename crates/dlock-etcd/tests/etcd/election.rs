//! dlock's election beside `etcdctl elect` (Debian's etcd-client), both ways: they elect one
//! leader between them on the same keys, each reads the other's proposal, and `etcdctl elect
//! -l` sees every leader, dlock's proclaim included.

use std::time::Duration;

use dlock_conformance::{Names, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_etcd::EtcdProvider;

use crate::support::{Proc, SERIAL, await_queued, etcdctl_elect, etcdctl_observe};

const STEP: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_and_dlock_elect_one_leader_both_ways() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let p = EtcdProvider::connect(&url).await.unwrap();
    let name = Names::new().name("elect");
    let election_name = p.config().etcd_lock_name(&name).unwrap();
    let election = p.election(&name, LockOptions::default()).unwrap();
    let mut observer = etcdctl_observe(&url, &election_name);

    // etcdctl leads: dlock reads its proposal, and campaigns behind it.
    let mut ctl = etcdctl_elect(&url, &election_name, "etcdctl-1");
    let key = ctl.line(STEP, "etcdctl leads", |_| true).await;
    assert!(key.starts_with(&format!("{election_name}/")), "{key}");
    assert_eq!(ctl.line(STEP, "its proposal", |_| true).await, "etcdctl-1");
    observed(&mut observer, &key, "etcdctl-1").await;
    let theirs = election.leader().await.unwrap().expect("a leader");
    assert_eq!(
        theirs.proposal_str(),
        Some("etcdctl-1"),
        "dlock reads etcdctl's proposal"
    );
    let campaign = tokio::spawn({
        let election = std::sync::Arc::clone(&election);
        async move { election.campaign(b"dlock-1").await }
    });
    await_queued(&url, &election_name, 2, "dlock campaigns behind etcdctl").await;
    assert!(!campaign.is_finished(), "dlock led beside etcdctl");

    // etcdctl resigns (SIGINT): dlock leads, in a later term, and etcdctl's observer sees it.
    ctl.signal("INT");
    let mut ours = must(STEP, "dlock leads after etcdctl resigned", campaign)
        .await
        .unwrap()
        .unwrap();
    assert!(
        ours.term() > theirs.term,
        "the term grows across the handover"
    );
    let our_key = observer
        .line(STEP, "etcdctl elect -l sees dlock lead", |l| {
            l.starts_with(&format!("{election_name}/"))
        })
        .await;
    assert_eq!(
        observer.line(STEP, "dlock's proposal", |_| true).await,
        "dlock-1"
    );
    ours.proclaim(b"dlock-1, again").await.unwrap();
    observed(&mut observer, &our_key, "dlock-1, again").await;

    // etcdctl campaigns behind dlock, and leads when dlock resigns.
    let mut ctl = etcdctl_elect(&url, &election_name, "etcdctl-2");
    await_queued(&url, &election_name, 2, "etcdctl campaigns behind dlock").await;
    let term = ours.term();
    ours.resign().await.unwrap();
    let key = ctl
        .line(STEP, "etcdctl leads after dlock resigned", |_| true)
        .await;
    assert_eq!(ctl.line(STEP, "its proposal", |_| true).await, "etcdctl-2");
    observed(&mut observer, &key, "etcdctl-2").await;
    let theirs = election.leader().await.unwrap().expect("a leader");
    assert_eq!(theirs.proposal_str(), Some("etcdctl-2"));
    assert!(theirs.term > term, "the term grows across the handover");
    ctl.signal("INT");
    observer.signal("INT");
}

/// `etcdctl elect -l` prints `key` and then `value`.
async fn observed(observer: &mut Proc, key: &str, value: &str) {
    let what = format!("etcdctl elect -l sees {key}");
    observer.line(STEP, &what, |l| l == key).await;
    let said = observer.line(STEP, &what, |_| true).await;
    assert_eq!(said, value, "{what}: its value");
}

/// A lock-delay that, with the drift allowance, passes half the lease's time to live (10 s by
/// default) is refused, although it is under half the 30 s lock lease: keep-alives vouch for
/// the time to live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_past_half_the_time_to_live_is_refused() {
    let Some(url) = service_url("DLOCK_ETCD_URL") else {
        return;
    };
    let p = EtcdProvider::connect(&url).await.unwrap();
    let opts = LockOptions::default().with_lock_delay(Duration::from_secs(7));
    let e = p.lock("delayed", opts).unwrap_err();
    assert!(e.to_string().contains("session"), "{e}");
    let fits = LockOptions::default().with_lock_delay(Duration::from_secs(4));
    assert!(p.lock("delayed", fits).is_ok());
}
