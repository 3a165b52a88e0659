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
use crate::handles::{HandleInfo, Request, live, traced};
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
/// [`leader`](Self::leader) reads it, from the moment it leads.
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
    /// Connection and backend errors; [`Error::Closed`] once the provider is closed.
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
    /// [`Error::LockLost`] when this no longer leads; connection and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Dropped, the store has the old proposal or the new one.
    pub async fn proclaim(&mut self, proposal: &[u8]) -> Result<()> {
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
