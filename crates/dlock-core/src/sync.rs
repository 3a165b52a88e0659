//! A mutex that ignores poisoning, for the short critical sections of dlock and its backends.

use std::fmt;

/// A `std::sync::Mutex` whose [`lock`](Self::lock) ignores poisoning.
///
/// Every critical section in dlock leaves its data consistent before anything in it can
/// panic, so a panic in another thread that held the lock is no reason to panic here. Hold it
/// only for a few statements and never across an `.await`.
///
/// ```
/// use dlock_core::backend::Mutex;
///
/// let m = Mutex::new(1);
/// *m.lock() += 1;
/// assert_eq!(*m.lock(), 2);
/// ```
#[derive(Default)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    /// A mutex holding `value`.
    pub const fn new(value: T) -> Self {
        Self(std::sync::Mutex::new(value))
    }

    /// The value, taken out of the mutex.
    pub fn into_inner(self) -> T {
        self.0
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Locks it, whether or not another holder panicked.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Mutex").field(&&*self.lock()).finish()
    }
}
