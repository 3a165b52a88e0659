//! Model checks of the races of one hold: its guards, its lease keeper, its release and its
//! loss, run under loom on the library's own state machines (`src/state.rs`), through the
//! real guard, signal and release path.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p dlock-core --release --test loom
//! ```
//!
//! Under loom there is no runtime: no keeper task and no background task run. The keeper's
//! part is played by [`Keeper`] on a thread of the model, the drop of the last guard by
//! [`drop_guard`], which runs the background release in place. Every model ends by checking
//! the hold's end: released or lost, never both, the loss reported at most once (by the call
//! whose transition made it), `lost()` resolved exactly when lost, and at most one release
//! sent to the store.
#![cfg(loom)]
#![allow(missing_docs)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc as StdArc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use dlock_core::backend::{Hold, HoldSignal, NewHold};
use dlock_core::state::loom_api::{Entry, Keeper, drop_guard, is_released};
use dlock_core::{
    Error, FencingToken, HoldState, Lease, LockGuard, LockKind, LockName, LossReason, Result,
    async_trait,
};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// The store's side of the hold: counts the releases it is sent, with an await before and
/// after each (where a caller can be cut off).
#[derive(Debug, Default)]
struct Store {
    releases: AtomicUsize,
}

#[async_trait]
impl Hold for Store {
    async fn release(&self) -> Result<()> {
        Yield(false).await;
        self.releases.fetch_add(1, Ordering::SeqCst);
        Yield(false).await;
        Ok(())
    }

    async fn extend(&self, _ttl: Duration) -> Result<()> {
        Ok(())
    }
}

/// Pending once: an await point.
struct Yield(bool);

impl Future for Yield {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A fresh hold on `store`, with a clone of its signal. No runtime: no keeper task.
fn hold(store: &Arc<Store>) -> (LockGuard, HoldSignal) {
    let signal = HoldSignal::new();
    let hold: StdArc<dyn Hold> = StdArc::new(Shim(Arc::clone(store)));
    let new = NewHold::new(
        "loom",
        LockKind::Mutex,
        LockName::new("model").expect("a valid name"),
        FencingToken::new(1),
        Lease::watchdog(Duration::from_secs(3600)),
        tokio::time::Instant::now(),
        hold,
    )
    .with_signal(signal.clone());
    (LockGuard::new(new), signal)
}

/// `Hold` for the loom `Arc` of the store (the library keeps a std `Arc<dyn Hold>`).
#[derive(Debug)]
struct Shim(Arc<Store>);

#[async_trait]
impl Hold for Shim {
    async fn release(&self) -> Result<()> {
        self.0.release().await
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        self.0.extend(ttl).await
    }
}

/// Runs `fut` to its end on this thread. Every await of these futures is a [`Yield`], ready
/// when polled again: no waker is needed.
fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

/// Whether a future is ready at its first poll.
fn ready_now(fut: impl Future<Output = ()>) -> bool {
    let mut fut = std::pin::pin!(fut);
    fut.as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_ready()
}

/// What every model checks at its end: the hold is released or lost, never both, and never
/// neither (every model ends with a release or a loss); `reports` is how many `mark_lost`
/// calls of the model said they reported the loss.
fn check_end(signal: &HoldSignal, store: &Store, reports: usize) -> End {
    let lost = signal.is_lost();
    let released = is_released(signal);
    assert!(
        !(lost && released),
        "the hold is both released and lost ({:?})",
        signal.reason()
    );
    assert!(lost || released, "the hold is neither released nor lost");
    assert_eq!(
        signal.reason().is_some(),
        lost,
        "a lost hold has its reason, only a lost one"
    );
    assert!(reports <= 1, "the loss was reported {reports} times");
    assert_eq!(
        ready_now(signal.lost()),
        lost,
        "lost() resolves exactly when the hold is lost"
    );
    let sent = store.releases.load(Ordering::SeqCst);
    assert!(sent <= 1, "the store was sent {sent} releases");
    if lost {
        assert_eq!(signal.state(), HoldState::Lost);
        End::Lost(signal.reason())
    } else {
        End::Released
    }
}

#[derive(Debug, PartialEq)]
enum End {
    Lost(Option<LossReason>),
    Released,
}

/// Release against loss: the guard's release runs while the backend reports a loss.
///
/// Invariant: exactly one of the two wins. If the loss wins, `mark_lost` said so, the hold
/// is lost and never released (the release then sends the store at most its one release);
/// if the release wins, `mark_lost` reported nothing, the hold is released and `lost()`
/// never resolves.
#[test]
fn release_against_loss() {
    loom::model(|| {
        let store = Arc::new(Store::default());
        let (guard, signal) = hold(&store);
        let backend = signal.clone();
        let loser = thread::spawn(move || backend.mark_lost(LossReason::Forced));
        let released = block_on(guard.release());
        let reported = loser.join().expect("the loss thread");
        let end = check_end(&signal, &store, usize::from(reported));
        match end {
            End::Lost(reason) => {
                assert!(reported, "a loss nobody reported");
                assert_eq!(reason, Some(LossReason::Forced));
            }
            End::Released => {
                assert!(released.is_ok(), "not lost, yet the release failed");
                assert_eq!(store.releases.load(Ordering::SeqCst), 1);
            }
        }
    });
}

/// Loss against loss: the backend and the keeper report a loss at once, each with its reason.
///
/// Invariant: exactly one call reports it, and its reason is the one that stays; the hold
/// ends lost, never released.
#[test]
fn loss_against_loss() {
    loom::model(|| {
        let store = Arc::new(Store::default());
        let (guard, signal) = hold(&store);
        let backend = signal.clone();
        let other = thread::spawn(move || backend.mark_lost(LossReason::Forced));
        let mine = signal.mark_lost(LossReason::LeaseEnded);
        let theirs = other.join().expect("the other loss thread");
        assert!(
            mine != theirs,
            "reported {} times",
            u8::from(mine) + u8::from(theirs)
        );
        let winner = if mine {
            LossReason::LeaseEnded
        } else {
            LossReason::Forced
        };
        assert_eq!(signal.reason(), Some(winner));
        block_on(drop_guard(guard));
        let end = check_end(&signal, &store, 1);
        assert!(matches!(end, End::Lost(_)), "{end:?}");
    });
}

/// Release against suspend and resume: a session that disconnects and comes back while the
/// guard releases.
///
/// Invariant: a suspension is not a loss: the hold ends released (the release succeeds and
/// sends one release), never lost, and not suspended once the session is back.
#[test]
fn release_against_suspend_and_resume() {
    loom::model(|| {
        let store = Arc::new(Store::default());
        let (guard, signal) = hold(&store);
        let session = signal.clone();
        let flapper = thread::spawn(move || {
            session.set_suspended(true);
            session.set_suspended(false);
        });
        let released = block_on(guard.release());
        flapper.join().expect("the session thread");
        assert_eq!(check_end(&signal, &store, 0), End::Released);
        assert!(released.is_ok(), "{released:?}");
        assert_eq!(store.releases.load(Ordering::SeqCst), 1);
        assert_eq!(signal.state(), HoldState::Held);
    });
}

/// The last guard's drop against a re-entry by the same owner.
///
/// Invariant: a re-entry is refused once the last guard left; of the leaves exactly one is
/// the last, so the store is sent exactly one release, after every guard is gone, and the
/// hold ends released.
#[test]
fn last_guard_drop_against_reentry() {
    loom::model(|| {
        let store = Arc::new(Store::default());
        let (guard, signal) = hold(&store);
        let entry = Entry::of(&guard).expect("a hold");
        let store2 = Arc::clone(&store);
        let owner = thread::spawn(move || {
            if let Some(again) = entry.enter() {
                // Entered before the last leave: the hold is not released under it.
                assert_eq!(store2.releases.load(Ordering::SeqCst), 0);
                block_on(drop_guard(again));
                true
            } else {
                false
            }
        });
        block_on(drop_guard(guard));
        let _entered = owner.join().expect("the owner thread");
        assert_eq!(check_end(&signal, &store, 0), End::Released);
        assert_eq!(store.releases.load(Ordering::SeqCst), 1);
    });
}

/// The last guard's drop against its keeper stopping armed (its runtime shut down).
///
/// Invariant: the keeper is disarmed or stopped armed, once: if the drop disarmed it first,
/// the hold ends released and nothing reports a loss; if the keeper stopped first, the hold
/// ends lost for `KeeperStopped`, never released, with at most one release sent (the
/// clean-up).
#[test]
fn drop_against_keeper_stop() {
    loom::model(|| {
        let store = Arc::new(Store::default());
        let (guard, signal) = hold(&store);
        let keeper = Keeper::of(&guard).expect("a hold");
        let stopper = thread::spawn(move || keeper.dropped());
        block_on(drop_guard(guard));
        stopper.join().expect("the keeper thread");
        match check_end(&signal, &store, 0) {
            End::Lost(reason) => assert_eq!(reason, Some(LossReason::KeeperStopped)),
            End::Released => assert_eq!(store.releases.load(Ordering::SeqCst), 1),
        }
    });
}

/// The last guard's drop against a renewal that finds the hold gone: the keeper reports the
/// loss and cleans up, while the drop releases.
///
/// Invariant: the store is sent at most one release (the keeper's clean-up and the release
/// claim the same one), the hold ends released or lost for `Gone`, never both.
#[test]
fn drop_against_failed_renewal() {
    loom::model(|| {
        let store = Arc::new(Store::default());
        let (guard, signal) = hold(&store);
        let keeper = Keeper::of(&guard).expect("a hold");
        let renewal =
            thread::spawn(move || block_on(keeper.ends_after_loss(Some(LossReason::Gone))));
        block_on(drop_guard(guard));
        renewal.join().expect("the keeper thread");
        match check_end(&signal, &store, 0) {
            End::Lost(reason) => assert_eq!(reason, Some(LossReason::Gone)),
            End::Released => {}
        }
        assert_eq!(
            store.releases.load(Ordering::SeqCst),
            1,
            "one release, always"
        );
    });
}

/// Clean-up after a loss, claimed by the keeper and by the release at once.
///
/// Invariant: exactly one of them cleans up (the store is sent exactly one release), and the
/// release reports the loss (`LockLost`), whoever cleaned up.
#[test]
fn cleanup_claimed_once() {
    loom::model(|| {
        let store = Arc::new(Store::default());
        let (guard, signal) = hold(&store);
        assert!(signal.mark_lost(LossReason::SessionExpired));
        let keeper = Keeper::of(&guard).expect("a hold");
        let cleaner = thread::spawn(move || block_on(keeper.ends_after_loss(None)));
        let released = block_on(guard.release());
        cleaner.join().expect("the keeper thread");
        assert!(
            matches!(released, Err(Error::LockLost { .. })),
            "{released:?}"
        );
        assert_eq!(
            check_end(&signal, &store, 1),
            End::Lost(Some(LossReason::SessionExpired))
        );
        assert_eq!(store.releases.load(Ordering::SeqCst), 1);
    });
}

/// Cancellation at every await of the release: the release future is polled `polls` times
/// and dropped (0: never polled, which drops the guard), with no runtime to finish it, while
/// the keeper finds the lease end.
///
/// Invariant: however far the release got, the hold ends released or lost, never both, with
/// at most one release sent; a hold that ends released had its release sent.
fn cancelled_release(polls: usize) {
    loom::model(move || {
        let store = Arc::new(Store::default());
        let (guard, signal) = hold(&store);
        let keeper = Keeper::of(&guard).expect("a hold");
        let lease_end =
            thread::spawn(move || block_on(keeper.ends_after_loss(Some(LossReason::LeaseEnded))));
        let mut release = Box::pin(guard.release());
        let mut cx = Context::from_waker(Waker::noop());
        let mut done = None;
        for _ in 0..polls {
            if let Poll::Ready(out) = release.as_mut().poll(&mut cx) {
                done = Some(out);
                break;
            }
        }
        drop(release);
        lease_end.join().expect("the keeper thread");
        match check_end(&signal, &store, 0) {
            End::Lost(reason) => assert_eq!(reason, Some(LossReason::LeaseEnded)),
            End::Released => {
                assert_eq!(store.releases.load(Ordering::SeqCst), 1);
                assert!(matches!(done, Some(Ok(()))), "{done:?}");
            }
        }
    });
}

#[test]
fn release_cancelled_before_its_first_poll() {
    cancelled_release(0);
}

#[test]
fn release_cancelled_before_the_store_call() {
    cancelled_release(1);
}

#[test]
fn release_cancelled_after_the_store_call() {
    cancelled_release(2);
}

#[test]
fn release_run_to_its_end() {
    cancelled_release(4);
}
