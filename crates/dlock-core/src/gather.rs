//! Renewals gathered into batches: a backend that can renew many holds in one call to its
//! store (a pipeline, one statement for many rows) hands each hold's renewal to a
//! [`Batcher`], which sends all that arrive within a short window as one batch and gives each
//! caller its own answer. Since the keeper renews every hold of a lease length on the same
//! beats, a provider then makes about one renewal call per renewal period, however many holds
//! it keeps.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};

use crate::error::{Error, Result};
use crate::metrics;
use crate::sync::Mutex;
use crate::time::from_now;

/// The longest a renewal may wait for its batch: a thirtieth of the lease, at most a second.
///
/// The keeper renews at most a third of the way into the lease and counts the new lease from
/// the moment it asked, so a renewal that waits this long reaches the store with more than
/// half of its lease left, and the lease the client believes in ends no later than the
/// store's.
pub fn renewal_window(ttl: Duration) -> Duration {
    (ttl / 30).min(Duration::from_secs(1))
}

/// What sends one batch: the items, in the order they came; an answer for each, in the same
/// order.
type Flush<T, R> =
    dyn Fn(Vec<T>) -> Pin<Box<dyn Future<Output = Vec<Result<R>>> + Send>> + Send + Sync;

/// Gathers the renewals of one provider's holds into batches.
///
/// Each [`call`](Batcher::call) waits at most the window it names; the batch goes out when
/// the first of its items is due, with every item that arrived by then. A caller that stops
/// waiting (its future dropped) has its item left out of a batch not yet sent. Each runtime
/// that calls has a gathering task of its own (so a runtime that stops being driven holds up
/// only its own callers), which ends when the batcher is dropped or its runtime shuts down;
/// each batch is sent by a task of its own, so a batch the store is slow to answer holds up
/// only its own items.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::backend::Batcher;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// // A store that doubles numbers, one call per batch.
/// let doubler = Batcher::new("doubler", |items: Vec<u64>| async move {
///     items.into_iter().map(|n| Ok(n * 2)).collect()
/// });
/// let (a, b) = tokio::join!(
///     doubler.call(1, Duration::from_millis(5)),
///     doubler.call(2, Duration::from_millis(5)),
/// );
/// assert_eq!((a?, b?), (2, 4));
/// assert_eq!(doubler.batches(), 1);
/// # Ok(()) }
/// ```
pub struct Batcher<T, R> {
    backend: &'static str,
    flush: Arc<Flush<T, R>>,
    /// The queue of each calling runtime's gathering task.
    queues: Mutex<Vec<(Id, Queue<T, R>)>>,
    batches: Arc<AtomicU64>,
}

impl<T, R> fmt::Debug for Batcher<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("backend", &self.backend)
            .field("batches", &self.batches.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Where a runtime's callers put their items.
type Queue<T, R> = mpsc::UnboundedSender<Pending<T, R>>;

/// One caller's item, when it is due, and where its answer goes.
struct Pending<T, R> {
    item: T,
    due: Instant,
    answer: oneshot::Sender<Result<R>>,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// A batcher of `backend` (for errors and the `dlock_renewal_calls_total` metric) whose
    /// batches `flush` sends: it must answer each item, in order.
    pub fn new<F, Fut>(backend: &'static str, flush: F) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<R>>> + Send + 'static,
    {
        Self {
            backend,
            flush: Arc::new(move |items| Box::pin(flush(items))),
            queues: Mutex::new(Vec::new()),
            batches: Arc::default(),
        }
    }

    /// A batcher whose batches are sent with `owner`, held weakly because the owner (a
    /// provider's session) usually owns the batcher: once the owner is gone, every item of a
    /// batch fails (retryable) with "the provider was dropped", and `flush` is not called.
    pub fn with_owner<O, F, Fut>(backend: &'static str, owner: Weak<O>, flush: F) -> Self
    where
        O: Send + Sync + 'static,
        F: Fn(Arc<O>, Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<R>>> + Send + 'static,
    {
        Self::new(backend, move |items: Vec<T>| {
            let sent = match owner.upgrade() {
                Some(owner) => Ok(flush(owner, items)),
                None => Err(items.len()),
            };
            async move {
                match sent {
                    Ok(sent) => sent.await,
                    Err(n) => (0..n)
                        .map(|_| Err(Error::no_answer(backend, "the provider was dropped")))
                        .collect(),
                }
            }
        })
    }

    /// Sends `item` in a batch that leaves within `within`, and returns its answer.
    ///
    /// Fails (retryable) if no Tokio runtime runs this call, or if the batch was dropped
    /// unanswered (its runtime shut down, or its send panicked).
    pub async fn call(&self, item: T, within: Duration) -> Result<R> {
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            item,
            due: from_now(within),
            answer,
        };
        self.sender()?.send(pending).map_err(|_| self.dropped())?;
        answered.await.map_err(|_| self.dropped())?
    }

    /// How many batches have been sent.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// The queue of this runtime's gathering task, started if there is none yet (the
    /// runtime's first call). Queues of runtimes that shut down are dropped on the way.
    fn sender(&self) -> Result<Queue<T, R>> {
        let runtime = Handle::try_current().map_err(|_| {
            Error::no_answer(self.backend, "a batched renewal needs a Tokio runtime")
        })?;
        let id = runtime.id();
        let mut queues = self.queues.lock();
        queues.retain(|(_, tx)| !tx.is_closed());
        if let Some((_, tx)) = queues.iter().find(|(of, _)| *of == id) {
            return Ok(tx.clone());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        runtime.spawn(gather(
            rx,
            Arc::clone(&self.flush),
            self.backend,
            Arc::clone(&self.batches),
        ));
        queues.push((id, tx.clone()));
        Ok(tx)
    }

    fn dropped(&self) -> Error {
        Error::no_answer(
            self.backend,
            "a batch of renewals was dropped unanswered (its runtime shut down)",
        )
    }
}

/// A runtime's gathering task: gathers items until the first is due, and hands them to a
/// task of their own that sends them as one batch and answers each; ends when the batcher is
/// dropped.
async fn gather<T: Send + 'static, R: Send + 'static>(
    mut queue: mpsc::UnboundedReceiver<Pending<T, R>>,
    flush: Arc<Flush<T, R>>,
    backend: &'static str,
    batches: Arc<AtomicU64>,
) {
    while let Some(first) = queue.recv().await {
        let mut due = first.due;
        let mut batch = vec![first];
        loop {
            tokio::select! {
                biased;
                () = sleep_until(due) => break,
                next = queue.recv() => match next {
                    Some(p) => {
                        due = due.min(p.due);
                        batch.push(p);
                    }
                    None => break,
                },
            }
        }
        while let Ok(p) = queue.try_recv() {
            batch.push(p);
        }
        batch.retain(|p| !p.answer.is_closed());
        if batch.is_empty() {
            continue;
        }
        batches.fetch_add(1, Ordering::Relaxed);
        metrics::renewal_call(backend, batch.len());
        tokio::spawn(send(batch, Arc::clone(&flush), backend));
    }
}

/// Sends one batch and gives each caller its answer.
async fn send<T, R>(batch: Vec<Pending<T, R>>, flush: Arc<Flush<T, R>>, backend: &'static str) {
    let (items, answers): (Vec<T>, Vec<_>) = batch.into_iter().map(|p| (p.item, p.answer)).unzip();
    let mut replies = flush(items).await.into_iter();
    for answer in answers {
        let reply = replies.next().unwrap_or_else(|| {
            Err(Error::no_answer(
                backend,
                "the store's answer to a batch of renewals had no answer for this one",
            ))
        });
        let _ = answer.send(reply);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A batcher that records each batch's size and answers each item with itself (an item
    /// of 0 with an error).
    fn echo(sizes: Arc<Mutex<Vec<usize>>>) -> Batcher<u32, u32> {
        Batcher::new("test", move |items: Vec<u32>| {
            sizes.lock().push(items.len());
            async move {
                items
                    .into_iter()
                    .map(|n| {
                        if n == 0 {
                            Err(Error::lock_lost("zero"))
                        } else {
                            Ok(n)
                        }
                    })
                    .collect()
            }
        })
    }

    /// An owned batcher sends with its owner while it lives, and answers every item with a
    /// retryable error, without sending, once it is gone.
    #[tokio::test(start_paused = true)]
    async fn an_owned_batcher_fails_its_items_once_the_owner_is_gone() {
        let owner = Arc::new(10_u32);
        let b = Batcher::with_owner(
            "test",
            Arc::downgrade(&owner),
            |o: Arc<u32>, items: Vec<u32>| async move {
                items.into_iter().map(|n| Ok(n + *o)).collect()
            },
        );
        let w = Duration::from_millis(5);
        assert_eq!(b.call(1, w).await.ok(), Some(11));
        drop(owner);
        let gone = b.call(1, w).await;
        assert!(
            matches!(&gone, Err(e) if e.is_retryable() && e.to_string().contains("the provider was dropped")),
            "{gone:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn calls_within_one_window_go_as_one_batch_and_each_gets_its_own_answer() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let b = echo(Arc::clone(&sizes));
        let w = Duration::from_secs(1);
        let (one, zero, three) = tokio::join!(b.call(1, w), b.call(0, w), b.call(3, w));
        assert_eq!(one.ok(), Some(1));
        assert!(matches!(zero, Err(Error::LockLost { .. })));
        assert_eq!(three.ok(), Some(3));
        assert_eq!(*sizes.lock(), vec![3]);
        assert_eq!(b.batches(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_leaves_when_its_first_item_is_due() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let b = echo(Arc::clone(&sizes));
        let asked = Instant::now();
        // The second item may wait longer, but goes with the first.
        let (a, c) = tokio::join!(
            b.call(1, Duration::from_millis(100)),
            b.call(2, Duration::from_secs(60))
        );
        assert_eq!((a.ok(), c.ok()), (Some(1), Some(2)));
        assert_eq!(asked.elapsed(), Duration::from_millis(100));
        assert_eq!(*sizes.lock(), vec![2]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_whose_caller_stopped_waiting_is_left_out() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let b = echo(Arc::clone(&sizes));
        let w = Duration::from_secs(1);
        let gone = tokio::time::timeout(Duration::from_millis(10), b.call(7, w)).await;
        assert!(gone.is_err());
        assert_eq!(b.call(8, w).await.ok(), Some(8));
        assert_eq!(*sizes.lock(), vec![1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_answer_is_an_error_for_the_unanswered_not_a_panic() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let b = Batcher::new("test", move |items: Vec<u32>| {
            counted.fetch_add(1, Ordering::SeqCst);
            // Answers the first item only.
            async move { items.into_iter().take(1).map(Ok).collect() }
        });
        let w = Duration::from_millis(5);
        let (a, c) = tokio::join!(b.call(1, w), b.call(2, w));
        assert_eq!(a.ok(), Some(1));
        assert!(c.is_err_and(|e| e.is_retryable()));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_batcher_outlives_its_runtime() -> std::io::Result<()> {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let b = echo(Arc::clone(&sizes));
        for n in 1..=2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()?;
            let got = rt.block_on(b.call(n, Duration::from_millis(1)));
            assert_eq!(got.ok(), Some(n));
        }
        assert_eq!(*sizes.lock(), vec![1, 1]);
        Ok(())
    }

    /// A runtime that is no longer driven (a current-thread runtime outside `block_on`)
    /// keeps its own gathering task, not the others': another runtime's calls are answered.
    #[test]
    fn a_runtime_left_idle_holds_up_only_its_own_callers() -> std::io::Result<()> {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let b = Arc::new(echo(Arc::clone(&sizes)));
        let idle = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        // Its gathering task starts, then the runtime is left alone with an item queued.
        let queued = Arc::clone(&b);
        idle.block_on(async move {
            let waiting =
                tokio::spawn(async move { queued.call(1, Duration::from_millis(1)).await });
            tokio::task::yield_now().await;
            drop(waiting);
        });
        let busy = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()?;
        let got = busy.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), b.call(2, Duration::from_millis(1))).await
        });
        assert_eq!(got.ok().and_then(Result::ok), Some(2));
        drop(idle);
        Ok(())
    }

    /// A batch the store does not answer holds up only its own items: the next batch is sent
    /// and answered meanwhile.
    #[tokio::test(start_paused = true)]
    async fn a_batch_left_unanswered_holds_up_only_its_own_items() {
        let left = Arc::new(tokio::sync::Notify::new());
        let told = Arc::clone(&left);
        let b = Batcher::new("test", move |items: Vec<u32>| {
            let told = Arc::clone(&told);
            async move {
                if items.contains(&0) {
                    told.notify_one();
                    std::future::pending::<()>().await;
                }
                items.into_iter().map(Ok).collect()
            }
        });
        let b = Arc::new(b);
        let first = Arc::clone(&b);
        let hung = tokio::spawn(async move { first.call(0, Duration::from_millis(1)).await });
        // The first batch has left and hangs.
        left.notified().await;
        let later =
            tokio::time::timeout(Duration::from_secs(5), b.call(5, Duration::from_millis(1))).await;
        assert_eq!(later.ok().and_then(Result::ok), Some(5));
        assert!(!hung.is_finished());
        hung.abort();
    }

    #[test]
    fn the_window_is_a_thirtieth_of_the_lease_at_most_a_second() {
        assert_eq!(
            renewal_window(Duration::from_secs(3)),
            Duration::from_millis(100)
        );
        assert_eq!(
            renewal_window(Duration::from_secs(30)),
            Duration::from_secs(1)
        );
        assert_eq!(
            renewal_window(Duration::from_secs(600)),
            Duration::from_secs(1)
        );
    }
}
