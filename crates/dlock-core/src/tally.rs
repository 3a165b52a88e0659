//! A backend's running counts (server calls by kind, wake-ups), kept in its public stats type.

use crate::sync::Mutex;

/// A backend's running counts, kept in the very type it reports them in (a `Copy` struct of
/// `u64` fields, such as a provider's `stats()`): an event adds one to its field, and a
/// reader gets a copy of all of them, taken at one instant. No second set of counters to keep
/// in step with the reported one. Meant for events that cost a server call or a wake-up, not
/// for hot loops: each one takes a short lock.
///
/// ```
/// use dlock_core::backend::Tally;
///
/// #[derive(Clone, Copy, Debug, Default, PartialEq)]
/// struct Stats {
///     gets: u64,
///     puts: u64,
/// }
///
/// let tally = Tally::<Stats>::default();
/// tally.count(|s| &mut s.gets);
/// tally.count(|s| &mut s.gets);
/// tally.count(|s| &mut s.puts);
/// assert_eq!(tally.get(), Stats { gets: 2, puts: 1 });
/// ```
#[derive(Debug, Default)]
pub struct Tally<S>(Mutex<S>);

impl<S: Copy> Tally<S> {
    /// Counts one event, in the field `field` picks.
    pub fn count(&self, field: impl FnOnce(&mut S) -> &mut u64) {
        let mut counts = self.0.lock();
        let n = field(&mut counts);
        *n = n.saturating_add(1);
    }

    /// The counts so far.
    pub fn get(&self) -> S {
        *self.0.lock()
    }
}
