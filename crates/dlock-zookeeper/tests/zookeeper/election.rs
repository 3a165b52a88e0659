//! Curator's `LeaderLatch` beside dlock's election on one path, both ways: they elect one
//! leader between them, and each reads the other's proposal (a latch participant's id).

use std::sync::Arc;

use dlock_conformance::{Names, must};
use dlock_core::{LockOptions, LockProvider};

use crate::support::curator::{Peer, curator_classpath};
use crate::support::{LIMIT, admin, await_nodes, provider, url};

#[tokio::test(flavor = "multi_thread")]
async fn curator_leader_latch_and_dlock_elect_one_leader_both_ways() {
    let Some(url) = url() else { return };
    if curator_classpath().is_none() {
        return;
    }
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("interop/latch");
    let path = p.lock_path(&name).unwrap();
    let election = p.election(&name, LockOptions::default()).unwrap();

    // Curator leads: dlock reads its id as the proposal, and campaigns behind it.
    let mut java = Peer::start(&url, &["latch", &path, "60000", "id", "curator-1"]).await;
    java.expect("WAITING").await;
    java.expect("ACQUIRED").await;
    let theirs = election.leader().await.unwrap().expect("a leader");
    assert_eq!(
        theirs.proposal_str(),
        Some("curator-1"),
        "dlock reads the latch's id"
    );
    let campaign = tokio::spawn({
        let election = Arc::clone(&election);
        async move { election.campaign(b"dlock-1").await }
    });
    await_nodes(&admin, &path, 2, "dlock campaigns behind Curator").await;
    assert!(!campaign.is_finished(), "dlock led beside Curator's latch");
    java.release().await;
    let ours = must(LIMIT, "dlock leads after Curator's latch closed", campaign)
        .await
        .unwrap()
        .unwrap();
    assert!(
        ours.term() > theirs.term,
        "the term grows across the handover"
    );

    // dlock leads: Curator reads dlock's proposal as the leader's id, waits, and leads once
    // dlock resigns.
    let mut java = Peer::start(&url, &["latch", &path, "60000", "id", "curator-2"]).await;
    java.expect("WAITING").await;
    java.expect("SEES dlock-1").await;
    java.still_waiting("Curator's latch behind dlock's leadership")
        .await;
    let term = ours.term();
    ours.resign().await.unwrap();
    java.expect("ACQUIRED").await;
    let theirs = election.leader().await.unwrap().expect("a leader");
    assert_eq!(theirs.proposal_str(), Some("curator-2"));
    assert!(theirs.term > term, "the term grows across the handover");
    java.release().await;
}

/// A lock-delay that, with the drift allowance, passes half the session (10 s by default) is
/// refused, although it is under half the 30 s lease: renewals vouch for the session.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_delay_past_half_the_session_is_refused() {
    let Some(url) = url() else { return };
    let p = provider(&url).await;
    let opts = LockOptions::default().with_lock_delay(std::time::Duration::from_secs(7));
    let e = p.lock("delayed", opts).unwrap_err();
    assert!(e.to_string().contains("session"), "{e}");
    let fits = LockOptions::default().with_lock_delay(std::time::Duration::from_secs(4));
    assert!(p.lock("delayed", fits).is_ok());
}
