//! Leader election: one leader at a time, who everyone can read and watch; terms (the
//! leaderships' fencing tokens) that grow with every new leader; a resign that hands over; a
//! cancelled campaign that leaves nothing; a deposed leader's proclaim refused. A leader cut
//! off by a silent network ([`SilentLeader`]) is checked in the silent-holder case, whose
//! wait for the default lease it shares.

use std::time::Duration;

use dlock_core::{DynElection, DynLockProvider, Error, Leader, Leadership, LockOptions};
use tokio::time::Instant;

use super::{Need, ZERO, clients_if, dropped_behind_the_back};
use crate::Factory;
use crate::record::measure;
use crate::support::{Names, eventually, must};

const ELECTIONS: Need = Need(|c| c.election, "no leader elections");

/// How long a step of an election case may take on a store that answers.
const STEP: Duration = Duration::from_secs(20);

fn election(p: &DynLockProvider, name: &str) -> DynElection {
    p.election(name, LockOptions::default())
        .unwrap_or_else(|e| panic!("election {name:?}: {e}"))
}

async fn lead(e: &DynElection, proposal: &str) -> Leadership {
    must(STEP, "the campaign", e.campaign(proposal.as_bytes()))
        .await
        .unwrap_or_else(|e| panic!("campaign {proposal:?}: {e}"))
}

async fn leader(e: &DynElection) -> Option<Leader> {
    e.leader()
        .await
        .unwrap_or_else(|e| panic!("who leads: {e}"))
}

/// One campaigner leads, and every client reads who: its term and proposal. Another
/// campaigner does not lead while it does.
pub async fn election_has_one_leader_and_says_who(f: &impl Factory) {
    let Some([a, b]) = clients_if(f, ELECTIONS).await else {
        return;
    };
    let name = Names::new().name("elect-one");
    let (ea, eb) = (election(&a, &name), election(&b, &name));
    assert_eq!(leader(&eb).await, None, "a leader before any campaign");
    let first = lead(&ea, "host-a:8080").await;
    assert!(first.is_leader());
    let seen = leader(&eb)
        .await
        .expect("nobody leads after a campaign won");
    assert_eq!(seen.term, first.term(), "the leader's term");
    assert_eq!(seen.proposal_str(), Some("host-a:8080"), "the proposal");
    let second = eb
        .try_campaign(b"host-b:8080", Duration::from_millis(300))
        .await
        .unwrap_or_else(|e| panic!("the second campaign: {e}"));
    assert!(second.is_none(), "two leaders at once");
    first
        .resign()
        .await
        .unwrap_or_else(|e| panic!("resign: {e}"));
}

/// A resign hands over to the next campaigner, whose term is greater; a leader that
/// proclaims changes what everyone reads.
pub async fn election_resign_hands_over_with_a_greater_term(f: &impl Factory) {
    let Some([a, b]) = clients_if(f, ELECTIONS).await else {
        return;
    };
    let name = Names::new().name("elect-handover");
    let (ea, eb) = (election(&a, &name), election(&b, &name));
    let mut first = lead(&ea, "a").await;
    first
        .proclaim(b"a, again")
        .await
        .unwrap_or_else(|e| panic!("proclaim: {e}"));
    assert_eq!(first.proposal(), b"a, again");
    let seen = leader(&eb).await.expect("a leader");
    assert_eq!(
        seen.proposal_str(),
        Some("a, again"),
        "the proclaimed proposal"
    );
    let waiting = tokio::spawn(async move { eb.campaign(b"b").await.map(|l| (eb, l)) });
    let term = first.term();
    first
        .resign()
        .await
        .unwrap_or_else(|e| panic!("resign: {e}"));
    let (eb, second) = must(STEP, "the handover", waiting)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .unwrap_or_else(|e| panic!("the second campaign: {e}"));
    assert!(
        second.term() > term,
        "term {} after term {term}",
        second.term()
    );
    let seen = leader(&ea).await.expect("a leader after the handover");
    assert_eq!((seen.term, seen.proposal_str()), (second.term(), Some("b")));
    drop(eb);
    second
        .resign()
        .await
        .unwrap_or_else(|e| panic!("resign: {e}"));
    eventually(STEP, "nobody leads after both resigned", || async {
        match leader(&ea).await {
            None => Ok(()),
            Some(l) => Err(l),
        }
    })
    .await;
}

/// An observer sees the leader now, each change of proposal and of leader, and the end.
pub async fn election_observer_sees_each_change(f: &impl Factory) {
    let Some([a, b]) = clients_if(f, ELECTIONS).await else {
        return;
    };
    let name = Names::new().name("elect-observe");
    let (ea, eb) = (election(&a, &name), election(&b, &name));
    let mut observer = eb.observe();
    let mut next = async |what: &str| -> Option<Leader> {
        must(STEP, what, observer.next())
            .await
            .unwrap_or_else(|e| panic!("observe ({what}): {e}"))
    };
    assert_eq!(next("nobody leads").await, None);
    let mut first = lead(&ea, "a").await;
    let seen = next("the first leader").await.expect("a leader");
    assert_eq!((seen.term, seen.proposal_str()), (first.term(), Some("a")));
    first
        .proclaim(b"a2")
        .await
        .unwrap_or_else(|e| panic!("proclaim: {e}"));
    let seen = next("the proclaim").await.expect("a leader");
    assert_eq!((seen.term, seen.proposal_str()), (first.term(), Some("a2")));
    let term = first.term();
    first
        .resign()
        .await
        .unwrap_or_else(|e| panic!("resign: {e}"));
    assert_eq!(next("the resign").await, None);
    let second = lead(&ea, "c").await;
    let seen = next("the second leader").await.expect("a leader");
    assert!(seen.term > term, "term {} after {term}", seen.term);
    assert_eq!(seen.proposal_str(), Some("c"));
    second
        .resign()
        .await
        .unwrap_or_else(|e| panic!("resign: {e}"));
}

/// A campaign cancelled while it waits leaves nothing: when the leader resigns, nobody
/// leads (no contender of the cancelled campaign is left to take over), and a new campaign
/// leads at once (none is queued ahead of it).
pub async fn election_cancelled_campaign_leaves_nothing(f: &impl Factory) {
    let Some([a, b]) = clients_if(f, ELECTIONS).await else {
        return;
    };
    let name = Names::new().name("elect-cancel");
    let (ea, eb) = (election(&a, &name), election(&b, &name));
    let first = lead(&ea, "a").await;
    let waited = tokio::time::timeout(Duration::from_millis(300), eb.campaign(b"b")).await;
    assert!(waited.is_err(), "the second campaign led beside the first");
    let timed = eb
        .try_campaign(b"b", ZERO)
        .await
        .unwrap_or_else(|e| panic!("try_campaign: {e}"));
    assert!(timed.is_none(), "a zero wait led beside the leader");
    first
        .resign()
        .await
        .unwrap_or_else(|e| panic!("resign: {e}"));
    eventually(STEP, "nobody leads once the leader resigned", || async {
        match leader(&ea).await {
            None => Ok(()),
            Some(l) => Err(l),
        }
    })
    .await;
    // Nor is anything of the cancelled campaigns queued ahead of a new one.
    let again = ea
        .try_campaign(b"a again", Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("a new campaign: {e}"));
    let again = again.expect("a new campaign waited behind the cancelled ones");
    again
        .resign()
        .await
        .unwrap_or_else(|e| panic!("resign: {e}"));
}

/// A leader of an election on a client whose network goes silent, started before the cut
/// (with the default settings) beside [`a_silent_holder_stops_before_the_lock_passes_on`]'s
/// lock, whose wait it shares: [`check`](Self::check) asserts that it was told it is deposed
/// (`lost()` resolved, `is_leader()` false) before another campaigner led, by at least 1 % of
/// the lease.
///
/// [`a_silent_holder_stops_before_the_lock_passes_on`]: super::a_silent_holder_stops_before_the_lock_passes_on
pub(super) struct SilentLeader {
    first: Leadership,
    lost_at: tokio::task::JoinHandle<Instant>,
    waiting: tokio::task::JoinHandle<(Instant, dlock_core::Result<Leadership>)>,
}

impl SilentLeader {
    /// `p` (the client to be cut) leads an election named after `name`; `b` campaigns behind.
    pub(super) async fn start(p: &DynLockProvider, b: &DynLockProvider, name: &str) -> Self {
        let name = format!("{name}-leader");
        let (ep, eb) = (election(p, &name), election(b, &name));
        let first = lead(&ep, "cut-off").await;
        let lost = first.lost();
        let lost_at = tokio::spawn(async move {
            lost.await;
            Instant::now()
        });
        let waiting = tokio::spawn(async move {
            let led = eb.campaign(b"next").await;
            (Instant::now(), led)
        });
        Self {
            first,
            lost_at,
            waiting,
        }
    }

    /// After the cut at `cut_at`: the next campaigner leads within `within`, and the cut-off
    /// leader was told first.
    pub(super) async fn check(self, cut_at: Instant, within: Duration) {
        let Ok(led) = tokio::time::timeout(within, self.waiting).await else {
            panic!("nobody else led within {within:?} of the cut");
        };
        let (led_at, second) = led.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let second = second.unwrap_or_else(|e| panic!("the other campaign: {e}"));
        let lost_at = must(
            Duration::from_secs(1),
            "the deposed leader's loss",
            self.lost_at,
        )
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        assert!(!self.first.is_leader(), "still leader after another led");
        assert!(
            lost_at < led_at,
            "the leader's lost() resolved {:?} after another campaigner led",
            lost_at - led_at
        );
        let margin = led_at - lost_at;
        let lease = LockOptions::default().lease.ttl();
        let least = super::silence::least_margin(lease);
        assert!(
            margin >= least,
            "the leader's lost() resolved only {margin:?} before the next leader"
        );
        assert!(
            second.term() > self.first.term(),
            "the next term is not greater"
        );
        measure(
            "deposed leader told before the next led",
            format!("{margin:.1?}"),
        );
        measure(
            "deposed leader told after the cut",
            format!("{:.1?}", lost_at - cut_at),
        );
        drop(self.first);
        second
            .resign()
            .await
            .unwrap_or_else(|e| panic!("resign: {e}"));
    }
}

/// A leader whose hold the store dropped behind its back (it cannot know yet) is deposed:
/// another campaigner leads, the old leader's proclaim is `LockLost` (whether or not its
/// proposal reached the store first), and everyone reads the new leader's proposal.
pub async fn election_a_deposed_leaders_proclaim_is_refused(f: &impl Factory) {
    let Some([a, b]) = clients_if(f, ELECTIONS).await else {
        return;
    };
    let name = Names::new().name("elect-deposed");
    let (ea, eb) = (election(&a, &name), election(&b, &name));
    let mut first = lead(&ea, "a").await;
    if !dropped_behind_the_back(f, &name).await {
        return;
    }
    let second = lead(&eb, "b").await;
    assert!(second.term() > first.term(), "the new term is not greater");
    match first.proclaim(b"a, deposed").await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("a deposed leader's proclaim: {other:?}"),
    }
    eventually(STEP, "everyone reads the new leader", || async {
        match leader(&ea).await {
            Some(l) if l.term == second.term() && l.proposal_str() == Some("b") => Ok(()),
            other => Err(other),
        }
    })
    .await;
    second
        .resign()
        .await
        .unwrap_or_else(|e| panic!("resign: {e}"));
}
