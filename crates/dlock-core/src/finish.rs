//! A future that finishes in the background if it is dropped: for the server calls that must
//! run to their end once begun (a release that a second one must not repeat half-way).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Handle;

use crate::close::cleanup;

/// Runs `task` in the caller's task, and only if the returned future is dropped after its
/// first poll and before it is done, finishes it in a task of its own (its output is then
/// dropped).
///
/// For a call that must run to its end once begun, as if it had been spawned and its handle
/// awaited, without a task per call (a spawned task costs a hop to another wake-up of a
/// worker thread each time). The difference: the call moves on only while the returned
/// future is polled, so a caller that keeps it without polling it (rather than dropping it)
/// holds the call where it is. Dropped before its first poll, `task` is dropped unpolled, as
/// a spawn that never happened. Dropped outside a runtime, or in one that is shutting down,
/// the rest of `task` is dropped, as a spawned task would be. A `task` that panicked is not
/// finished (it cannot be polled again): it is dropped. Polled again after it returned its
/// output, the future stays pending.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::backend::finish_if_dropped;
/// use tokio::sync::oneshot;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), oneshot::error::RecvError> {
/// let (answer_tx, answer) = oneshot::channel::<()>();
/// let (done_tx, done) = oneshot::channel();
/// let call = finish_if_dropped(async move {
///     let _ = answer.await; // the server's answer
///     let _ = done_tx.send("finished");
/// });
/// // Cut off after its first poll, still waiting for its answer.
/// assert!(tokio::time::timeout(Duration::ZERO, call).await.is_err());
/// let _ = answer_tx.send(());
/// // The call still ran to its end, in a task of its own.
/// assert_eq!(done.await?, "finished");
/// # Ok(()) }
/// ```
pub fn finish_if_dropped<F>(task: F) -> Finish<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Finish {
        task: Some(Box::pin(task)),
        runtime: None,
        polling: false,
    }
}

/// The future of [`finish_if_dropped`].
#[must_use = "futures do nothing unless polled"]
pub struct Finish<T: Send + 'static> {
    /// `None` once done.
    task: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    /// The runtime of the first poll, to finish on if dropped.
    runtime: Option<Handle>,
    /// A poll of `task` is under way: if it is still set in `drop`, the poll panicked.
    polling: bool,
}

impl<T: Send + 'static> fmt::Debug for Finish<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Finish")
            .field("done", &self.task.is_none())
            .finish()
    }
}

impl<T: Send + 'static> Future for Finish<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = &mut *self;
        if this.runtime.is_none() {
            this.runtime = Handle::try_current().ok();
        }
        let Some(task) = this.task.as_mut() else {
            return Poll::Pending;
        };
        this.polling = true;
        let out = task.as_mut().poll(cx);
        this.polling = false;
        if out.is_ready() {
            this.task = None;
        }
        out
    }
}

impl<T: Send + 'static> Drop for Finish<T> {
    fn drop(&mut self) {
        // A task whose poll panicked cannot be resumed: it is dropped (by `take`) here.
        let task = self.task.take().filter(|_| !self.polling);
        if let (Some(task), Some(runtime)) = (task, self.runtime.take()) {
            drop(runtime.spawn(cleanup(async move {
                drop(task.await);
            })));
        }
    }
}
