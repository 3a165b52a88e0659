//! Undo on drop: what an acquisition did on the store, undone if its future is dropped before
//! the store's answer became a guard.

use std::fmt;
use std::future::Future;

use tokio::runtime::Handle;

use crate::close::cleanup;
use crate::finish::finish_if_dropped;

/// What an acquisition has done on the store so far (a queue entry, a node, a row, a key),
/// undone by `undo` unless it is disarmed: in a task of its own if the value is dropped (the
/// acquisition's future was cancelled, or failed half-way), or here with
/// [`run_now`](Self::run_now).
///
/// Arm it *before* sending the call that makes the state (the call may reach the store even
/// if its answer never comes back), and disarm it when the state became a guard, with no
/// await in between. The undo runs on the runtime that made the value, or the current one
/// if that one is gone; without either, nothing runs and the store's lease or session ends
/// the state.
///
/// ```
/// use dlock_core::backend::UndoOnDrop;
/// use tokio::sync::mpsc;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, mut undone) = mpsc::unbounded_channel();
/// let mut undo = UndoOnDrop::new(move |node: String| {
///     let tx = tx.clone();
///     async move { let _ = tx.send(node); }
/// });
/// undo.arm("/locks/x/_c_1-lock-0000000007".to_owned());
/// drop(undo); // the acquisition was cancelled
/// assert_eq!(undone.recv().await.as_deref(), Some("/locks/x/_c_1-lock-0000000007"));
/// # }
/// ```
pub struct UndoOnDrop<S, F>
where
    S: Send + 'static,
    F: UndoFn<S>,
{
    state: Option<S>,
    undo: F,
    runtime: Option<Handle>,
}

/// The undo of an [`UndoOnDrop`]: any `Fn(S) -> impl Future<Output = ()>` that can move into a
/// task.
pub trait UndoFn<S>: Send + Sync + 'static {
    /// The undo's future.
    type Future: Future<Output = ()> + Send + 'static;

    /// Undoes `state`.
    fn undo(&self, state: S) -> Self::Future;
}

impl<S, F, Fut> UndoFn<S> for F
where
    F: Fn(S) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    type Future = Fut;

    fn undo(&self, state: S) -> Fut {
        self(state)
    }
}

impl<S, F> UndoOnDrop<S, F>
where
    S: Send + 'static,
    F: UndoFn<S>,
{
    /// Nothing to undo yet; `undo` undoes what [`arm`](Self::arm) is given.
    pub fn new(undo: F) -> Self {
        Self {
            state: None,
            undo,
            runtime: Handle::try_current().ok(),
        }
    }

    /// What to undo from now on (it replaces what was armed, which is then not undone).
    pub fn arm(&mut self, state: S) {
        self.state = Some(state);
    }

    /// Whether something is armed.
    pub fn is_armed(&self) -> bool {
        self.state.is_some()
    }

    /// What is armed, to update in place (a node's path learned from the store's answer).
    pub fn state_mut(&mut self) -> Option<&mut S> {
        self.state.as_mut()
    }

    /// Nothing to undo any more (the state became a guard, or is gone); returns what was
    /// armed.
    pub fn disarm(&mut self) -> Option<S> {
        self.state.take()
    }

    /// Undoes now and waits for it; if this future is dropped, the undo still runs to its
    /// end in the background.
    pub async fn run_now(&mut self) {
        if let Some(state) = self.state.take() {
            finish_if_dropped(self.undo.undo(state)).await;
        }
    }
}

impl<S, F> Drop for UndoOnDrop<S, F>
where
    S: Send + 'static,
    F: UndoFn<S>,
{
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        let undo = self.undo.undo(state);
        if let Some(runtime) = self.runtime.take().or_else(|| Handle::try_current().ok()) {
            drop(runtime.spawn(cleanup(undo)));
        }
    }
}

impl<S, F> fmt::Debug for UndoOnDrop<S, F>
where
    S: Send + fmt::Debug + 'static,
    F: UndoFn<S>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UndoOnDrop")
            .field("armed", &self.state)
            .finish()
    }
}
