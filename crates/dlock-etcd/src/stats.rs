//! What a provider counts: its server calls by kind, and its waiters' wake-ups.

/// Server calls made by one provider, by kind; see
/// [`EtcdProvider::stats`](crate::EtcdProvider::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdStats {
    /// Transactions (acquire, check, release, renewal).
    pub txns: u64,
    /// Range reads (a waiter's look for its predecessor; its looks at that key once its watch
    /// is created, if the store moved on meanwhile, and then every 10 ms for 150 ms, until
    /// one shows that no write came in between; `describe`).
    pub gets: u64,
    /// Watches opened (one per wait for a predecessor's delete).
    pub watches: u64,
    /// Waiters woken by their predecessor's delete: with no herd, one per handoff.
    pub wakeups: u64,
    /// Leases granted: one at connect, and one after each loss of the lease.
    pub leases: u64,
    /// Keep-alives of the provider's lease sent: the provider's own, every third of the
    /// lease's time-to-live, and one per batch of the watchdog's renewals (however many holds
    /// it carries).
    pub keep_alives: u64,
}
