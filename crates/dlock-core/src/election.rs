//! Leader election: a name that one campaigner at a time leads, with a proposal (what the
//! leader tells the others: its address, its id) that anyone can read and watch. The
//! leadership is a hold like a lock's: its fencing token is the leader's **term**, strictly
//! greater than every earlier leader's, and it is lost, renewed and released as a lock guard
//! is. A backend implements [`RawElection`] on its own layout (etcd's `concurrency.Election`,
//! Curator's `LeaderLatch`); [`Election`] adds the rest, as [`Lock`](crate::backend::Lock)
//! does for a mutex.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::handles::{HandleInfo, RawLock, Request, live, traced};
use crate::loss::LockKind;
use crate::name::{FencingToken, LockName};
use crate::options::LockOptions;
use crate::time::Deadline;

/// Who leads an election: the leader's term and proposal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's term: the fencing token of its leadership, strictly greater than every
    /// earlier leader's of the election.
    pub term: FencingToken,
    /// What the leader proposed, as it last proclaimed it.
    pub proposal: Vec<u8>,
}

impl Leader {
    /// The leader of `term` with `proposal`.
    pub fn new(term: FencingToken, proposal: impl Into<Vec<u8>>) -> Self {
        Self {
            term,
            proposal: proposal.into(),
        }
    }

    /// The proposal as text, if it is UTF-8.
    pub fn proposal_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.proposal).ok()
    }
}

impl fmt::Display for Leader {
    /// `term 42: <proposal>` (the proposal lossily as UTF-8).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "term {}: {}",
            self.term,
            String::from_utf8_lossy(&self.proposal)
        )
    }
}

/// A backend's election on one name.
///
/// The campaign is a mutex acquisition whose holder leads: it must keep every rule of
/// [`RawLock::acquire`](crate::backend::RawLock::acquire) (a holder of its own per call,
/// cancel safety, a fencing token that only grows), and record `proposal` where
/// [`leader`](Self::leader) reads it: with the grant where the store can (etcd, ZooKeeper),
/// else right after it ([`PostedElection`]), the leader being read meanwhile with an empty
/// proposal.
#[async_trait]
pub trait RawElection: fmt::Debug + Send + Sync + 'static {
    /// Campaigns with `proposal`, waiting until `req.deadline` to lead; `Ok(None)` once it
    /// passed. The guard's fencing token is the term.
    ///
    /// Must be cancel safe: dropped at any await, it leaves nothing behind on the store.
    async fn campaign(&self, req: &Request<'_>, proposal: &[u8]) -> Result<Option<LockGuard>>;

    /// Replaces the proposal of the leadership `leadership` (a guard
    /// [`campaign`](Self::campaign) returned), only while it leads: [`Error::LockLost`] when another leads
    /// or nobody does.
    async fn proclaim(&self, leadership: &LockGuard, proposal: &[u8]) -> Result<()>;

    /// Who leads now, as the store says.
    async fn leader(&self) -> Result<Option<Leader>>;

    /// Resolves when the leader may have changed since [`leader`](Self::leader) answered
    /// `seen`; waking early is allowed (the caller asks again). The default polls: it waits
    /// [`POLL`].
    async fn changed(&self, seen: Option<&Leader>) -> Result<()> {
        let _ = seen;
        tokio::time::sleep(POLL).await;
        Ok(())
    }
}

/// Where a backend keeps the leader's proposal beside its mutex, for an election that is the
/// mutex of the name ([`PostedElection`]): the mutex's holder leads, and posts its proposal
/// for its term (the hold's fencing token).
#[async_trait]
pub trait ProposalBoard: fmt::Debug + Send + Sync + 'static {
    /// Posts `proposal` for `term`, never over the proposal of a later term; false where the
    /// store tells that the lock is not held in that term (a proclaim then fails at once; it
    /// also asks the hold's owner, [`LockGuard::verify`]).
    async fn post(&self, term: FencingToken, proposal: &[u8]) -> Result<bool>;

    /// Who leads: the term of the lock's holder, with the proposal posted for that term
    /// (empty before its post), or `None` when the lock is free.
    async fn leader(&self) -> Result<Option<Leader>>;
}

/// The election of a backend without one of its own: its mutex `L`, whose holder leads,
/// and a [`ProposalBoard`] `B`. A campaign acquires the mutex and posts the proposal; until
/// the post, readers see the new leader with an empty proposal. A campaign dropped after the
/// grant drops its guard, which releases the hold; a post that lands after that names a term
/// that is not the lock's any more, and is never read.
#[derive(Debug)]
pub struct PostedElection<L, B> {
    lock: L,
    board: B,
}

impl<L: RawLock, B: ProposalBoard> PostedElection<L, B> {
    /// The election of `lock`'s name, with its proposals on `board`.
    pub fn new(lock: L, board: B) -> Self {
        Self { lock, board }
    }
}

#[async_trait]
impl<L: RawLock, B: ProposalBoard> RawElection for PostedElection<L, B> {
    async fn campaign(&self, req: &Request<'_>, proposal: &[u8]) -> Result<Option<LockGuard>> {
        let Some(guard) = self.lock.acquire(req).await? else {
            return Ok(None);
        };
        // A hold lost before the post is the core's to see (the guard says so); an error
        // drops the guard, which releases it.
        self.board.post(guard.fencing_token(), proposal).await?;
        Ok(Some(guard))
    }

    /// Posts, then asks the store whether the hold is still this leadership's (by its owner,
    /// not only its term: a store may grant the next holder before its token moves).
    async fn proclaim(&self, leadership: &LockGuard, proposal: &[u8]) -> Result<()> {
        let posted = self
            .board
            .post(leadership.fencing_token(), proposal)
            .await?;
        if posted && leadership.verify().await? {
            Ok(())
        } else {
            Err(Error::lock_lost(leadership.name().as_str()))
        }
    }

    async fn leader(&self) -> Result<Option<Leader>> {
        self.board.leader().await
    }
}

/// An election handle on one name. Every campaign is a contender of its own (tasks that
/// share the handle campaign against each other, as different processes do); the one that
/// leads holds a [`Leadership`], the election's hold.
#[async_trait]
pub trait DistributedElection: fmt::Debug + Send + Sync + 'static {
    /// The election's name.
    fn name(&self) -> &LockName;

    /// The options of its leaderships (lease, drift allowance).
    fn options(&self) -> &LockOptions;

    /// The backend's short name.
    fn backend(&self) -> &'static str;

    /// The store's id.
    fn store_id(&self) -> &str;

    /// Campaigns with `proposal`, waiting as long as it takes to lead.
    ///
    /// # Errors
    ///
    /// Connection and backend errors; [`Error::Closed`] once the provider is closed;
    /// [`Error::InvalidArgument`] for a proposal over [`MAX_PROPOSAL`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped campaign leaves nothing behind on the store (its contender is
    /// removed in the background, as a dropped acquire's is).
    async fn campaign(&self, proposal: &[u8]) -> Result<Leadership>;

    /// Campaigns with `proposal`, waiting at most `wait` to lead; `Ok(None)` if another still
    /// leads then.
    ///
    /// # Errors
    ///
    /// As [`campaign`](Self::campaign), and an error (never `Ok(None)`) when the store did not
    /// answer.
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Self::campaign).
    async fn try_campaign(&self, proposal: &[u8], wait: Duration) -> Result<Option<Leadership>>;

    /// Who leads now and what they proposed, or `None` when nobody does.
    ///
    /// # Errors
    ///
    /// Connection and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    async fn leader(&self) -> Result<Option<Leader>>;

    /// Watches the leader: [`Observer::next`] returns the leader now, then each change of
    /// leader or proposal.
    fn observe(&self) -> Observer;
}

/// An election handle shared behind an `Arc`.
pub type DynElection = Arc<dyn DistributedElection>;

/// An election handle over a backend's [`RawElection`].
#[derive(Debug)]
pub struct Election<E> {
    info: HandleInfo,
    raw: Arc<E>,
}

/// The longest proposal a campaign or a proclaim takes: 64 KiB, which every store keeps in
/// one value (MySQL's `BLOB`; ZooKeeper refuses a node over 1 MiB, etcd a request over
/// 1.5 MiB). Put a larger description where the leader's proposal points.
pub const MAX_PROPOSAL: usize = 64 * 1024;

fn check_proposal(proposal: &[u8]) -> Result<()> {
    if proposal.len() > MAX_PROPOSAL {
        return Err(Error::invalid_argument(
            "proposal",
            format!(
                "{} bytes is longer than the {MAX_PROPOSAL}-byte maximum of a proposal",
                proposal.len()
            ),
        ));
    }
    Ok(())
}

/// How often an [`Observer`] asks the store who leads, on a backend without notices of its
/// own (the default [`RawElection::changed`]).
pub const POLL: Duration = Duration::from_millis(100);

impl<E: RawElection> Election<E> {
    /// A handle.
    pub fn new(info: HandleInfo, raw: E) -> Self {
        Self {
            info,
            raw: Arc::new(raw),
        }
    }

    /// The backend part.
    pub fn raw(&self) -> &E {
        &self.raw
    }

    async fn campaign_until(
        &self,
        proposal: &[u8],
        deadline: Deadline,
    ) -> Result<Option<Leadership>> {
        check_proposal(proposal)?;
        let req = self.info.request(deadline);
        let guard = traced(&self.info, LockKind::Mutex, || {
            live(&self.info, deadline, || self.raw.campaign(&req, proposal))
        })
        .await?;
        Ok(guard.map(|guard| Leadership {
            guard,
            proposal: proposal.to_vec(),
            raw: Arc::clone(&self.raw) as Arc<dyn RawElection>,
        }))
    }
}

#[async_trait]
impl<E: RawElection> DistributedElection for Election<E> {
    fn name(&self) -> &LockName {
        self.info.name()
    }

    fn options(&self) -> &LockOptions {
        self.info.options()
    }

    fn backend(&self) -> &'static str {
        self.info.backend()
    }

    fn store_id(&self) -> &str {
        self.info.store_id()
    }

    async fn campaign(&self, proposal: &[u8]) -> Result<Leadership> {
        self.campaign_until(proposal, Deadline::NEVER)
            .await?
            .ok_or_else(|| Error::unbounded_wait_ended(self.info.backend(), self.info.name()))
    }

    async fn try_campaign(&self, proposal: &[u8], wait: Duration) -> Result<Option<Leadership>> {
        self.campaign_until(proposal, Deadline::after(wait)).await
    }

    async fn leader(&self) -> Result<Option<Leader>> {
        self.raw.leader().await
    }

    fn observe(&self) -> Observer {
        Observer {
            raw: Arc::clone(&self.raw) as Arc<dyn RawElection>,
            seen: None,
        }
    }
}

/// The leadership of one campaign: the election's hold, as a [`LockGuard`] is a lock's.
/// Its fencing token is the [`term`](Self::term); pass it with every write the leader makes,
/// so that a store can refuse a deposed leader's late writes.
///
/// Dropped without [`resign`](Self::resign), it resigns in the background, as a dropped
/// guard releases.
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    proposal: Vec<u8>,
    raw: Arc<dyn RawElection>,
}

impl Leadership {
    /// The term: the leadership's fencing token, strictly greater than every earlier
    /// leader's.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The proposal this leader last made.
    pub fn proposal(&self) -> &[u8] {
        &self.proposal
    }

    /// Whether this still leads, as far as this process can tell: false from the hold's
    /// horizon on, before anyone else can lead (see [`LockGuard::is_held`]).
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when the leadership is lost (never after a resign): stop acting as leader.
    /// Resolves before anyone else can lead, as [`LockGuard::lost`] does.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// The hold under the leadership: its lease, horizon and state.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The hold alone, as a lock guard: for code that handles holds of every kind alike (it
    /// is lost, renewed and released as the leadership is; dropping it resigns).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Replaces the proposal the others read, while this leads.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] when this no longer leads; [`Error::InvalidArgument`] for a
    /// proposal over [`MAX_PROPOSAL`]; connection and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Dropped, the store has the old proposal or the new one.
    pub async fn proclaim(&mut self, proposal: &[u8]) -> Result<()> {
        check_proposal(proposal)?;
        if !self.guard.is_held() {
            return Err(self.not_leader());
        }
        self.raw.proclaim(&self.guard, proposal).await?;
        self.proposal = proposal.to_vec();
        Ok(())
    }

    /// Steps down: the hold is released, and the next campaigner leads.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::release`]: [`Error::LockLost`] if the leadership had already been
    /// lost.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }

    fn not_leader(&self) -> Error {
        Error::lock_lost(self.guard.name().as_str())
    }
}

/// Watches an election's leader (see [`DistributedElection::observe`]).
#[derive(Debug)]
pub struct Observer {
    raw: Arc<dyn RawElection>,
    /// What the last `next` returned; `None` before the first.
    seen: Option<Option<Leader>>,
}

impl Observer {
    /// The leader now on the first call, then waits for the next change of leader or
    /// proposal and returns it (`None`: nobody leads). Changes quicker than the store's
    /// notice (or the poll, on a backend that polls) may be seen only as their last state.
    ///
    /// # Errors
    ///
    /// Connection and backend errors; the observer can be asked again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing, and the next call compares with what the last
    /// completed call returned.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            if let Some(seen) = &self.seen {
                self.raw.changed(seen.as_ref()).await?;
            }
            let now = self.raw.leader().await?;
            if self.seen.as_ref() != Some(&now) {
                self.seen = Some(now.clone());
                return Ok(now);
            }
        }
    }
}
