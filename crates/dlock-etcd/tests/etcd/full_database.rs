//! A store that refuses writes: a member whose database is full (etcd's NOSPACE alarm).

use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{Error, LockOptions, LockProvider};
use dlock_etcd::EtcdProvider;
use dlock_etcd::etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client};

use crate::support::member::PrivateMember;

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
