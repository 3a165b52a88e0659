//! The core's helpers for backends' background work: [`spawn_at`] (a task that starts late,
//! or never if its hold is gone by then) and [`finish_if_dropped`] (a call that runs in its
//! caller's task and finishes on its own only if the caller drops it).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_core::backend::{finish_if_dropped, from_now, spawn_at};
use dlock_core::{Error, Result};
use tokio::sync::{Notify, oneshot};

fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Starts at its time, not before.
#[tokio::test(start_paused = true)]
async fn a_task_spawned_later_runs_at_its_time() -> Result<()> {
    let (tx, mut rx) = oneshot::channel();
    let started = tokio::time::Instant::now();
    let _task = spawn_at(from_now(Duration::from_secs(1)), move || async move {
        let _ = tx.send(tokio::time::Instant::now());
    });
    // The clock is paused: moved by hand to just before the task's time.
    tokio::time::advance(Duration::from_millis(900)).await;
    assert!(rx.try_recv().is_err(), "the task ran before its time");
    let ran = tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .map_err(Error::config)?
        .map_err(Error::config)?;
    let at = ran.duration_since(started);
    assert!(
        at >= Duration::from_millis(950) && at <= Duration::from_millis(1_100),
        "ran {at:?} in, not about 1 s"
    );
    Ok(())
}

/// Dropped before its time: the future is dropped unpolled, and no task was ever spawned for
/// it (the runtime's starter, spawned once, aside).
#[tokio::test(start_paused = true)]
async fn a_task_dropped_before_its_time_is_never_spawned() -> Result<()> {
    // The runtime's starter, spawned with the first task.
    drop(spawn_at(from_now(Duration::from_secs(60)), move || async {}));
    let before = tasks();
    let polled = Arc::new(AtomicUsize::new(0));
    let mut receivers = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..100 {
        let (tx, rx) = oneshot::channel::<()>();
        let polled = Arc::clone(&polled);
        handles.push(spawn_at(
            from_now(Duration::from_secs(1)),
            move || async move {
                polled.fetch_add(1, Ordering::SeqCst);
                drop(tx);
            },
        ));
        receivers.push(rx);
    }
    assert_eq!(tasks(), before, "tasks spawned before their time");
    drop(handles);
    for rx in receivers {
        assert!(rx.await.is_err(), "a dropped task's future was kept");
    }
    // The clock is paused: moved by hand past the tasks' time.
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(polled.load(Ordering::SeqCst), 0, "a dropped task ran");
    assert_eq!(tasks(), before);
    Ok(())
}

/// A task whose making panics ends that task alone: the runtime's starter, which starts every
/// later task and keeper, goes on.
#[tokio::test(start_paused = true)]
async fn a_task_that_panics_while_made_stops_no_other() -> Result<()> {
    let _bad = spawn_at(
        from_now(Duration::from_millis(100)),
        || -> std::future::Ready<()> { panic!("made badly, on purpose") },
    );
    let (tx, rx) = oneshot::channel();
    let _good = spawn_at(from_now(Duration::from_secs(1)), move || async move {
        let _ = tx.send(());
    });
    // The clock is paused: it moves on by itself while every task waits.
    tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .map_err(Error::config)?
        .map_err(|_| Error::config("the later task was dropped: the starter died"))?;
    Ok(())
}

/// A task whose handle is dropped after it started runs on to its end.
#[tokio::test(start_paused = true)]
async fn a_task_started_runs_on_when_its_handle_is_dropped() -> Result<()> {
    let go = Arc::new(Notify::new());
    let (started_tx, started_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    let wait = Arc::clone(&go);
    let task = spawn_at(from_now(Duration::from_millis(100)), move || async move {
        let _ = started_tx.send(());
        wait.notified().await;
        let _ = done_tx.send(());
    });
    started_rx.await.map_err(Error::config)?;
    drop(task);
    go.notify_one();
    tokio::time::timeout(Duration::from_secs(5), done_rx)
        .await
        .map_err(Error::config)?
        .map_err(Error::config)?;
    Ok(())
}

/// Outside a runtime there is nothing to run the task on: it is dropped, and nothing panics.
#[test]
fn a_task_spawned_later_outside_a_runtime_is_dropped() {
    let (tx, mut rx) = oneshot::channel::<()>();
    drop(spawn_at(
        from_now(Duration::from_millis(1)),
        move || async move {
            drop(tx);
        },
    ));
    assert!(matches!(
        rx.try_recv(),
        Err(oneshot::error::TryRecvError::Closed)
    ));
}

/// A call that finishes runs in its caller's task: no task is spawned for it.
#[tokio::test]
async fn a_finished_call_ran_in_its_callers_task() -> Result<()> {
    // A test's body is not a task (it has no id): the caller is one.
    let caller = tokio::spawn(async {
        let caller = tokio::task::id();
        let ran_in = finish_if_dropped(async {
            tokio::task::yield_now().await;
            tokio::task::id()
        })
        .await;
        (caller, ran_in)
    });
    let (caller, ran_in) = caller.await.map_err(Error::config)?;
    assert_eq!(ran_in, caller, "the call ran in a task of its own");
    Ok(())
}

/// A call dropped half-way finishes in a task of its own; one dropped before its first poll
/// never runs.
#[tokio::test]
async fn a_call_dropped_half_way_finishes_in_the_background() -> Result<()> {
    let go = Arc::new(Notify::new());
    let (done_tx, done_rx) = oneshot::channel();
    let (started_tx, started_rx) = oneshot::channel();
    let wait = Arc::clone(&go);
    // A test's body is not a task (it has no id): the caller is one.
    let caller = tokio::spawn(async move {
        let call = finish_if_dropped(async move {
            let _ = started_tx.send(());
            wait.notified().await;
            let _ = done_tx.send(tokio::task::id());
        });
        let mut call = Box::pin(call);
        tokio::select! {
            () = &mut call => return Err(Error::config("the call finished before it was let go")),
            started = started_rx => started.map_err(Error::config)?,
        }
        drop(call);
        Ok(tokio::task::id())
    });
    let caller = caller.await.map_err(Error::config)??;
    go.notify_one();
    let finished_in = tokio::time::timeout(Duration::from_secs(5), done_rx)
        .await
        .map_err(Error::config)?
        .map_err(Error::config)?;
    assert_ne!(finished_in, caller, "finished in the task that dropped it");

    let (tx, rx) = oneshot::channel::<()>();
    drop(finish_if_dropped(async move {
        let _ = tx.send(());
    }));
    assert!(rx.await.is_err(), "a call dropped unpolled ran");
    Ok(())
}

/// A call whose poll panicked cannot be resumed: it is not handed to a task of its own (where
/// its next poll would panic again, "resumed after panicking"), only dropped. The caller's
/// task sees the one panic.
#[tokio::test]
async fn a_call_that_panicked_is_not_finished_in_the_background() -> Result<()> {
    let panics = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&panics);
    let before = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
    }));
    let caller = tokio::spawn(finish_if_dropped(async {
        tokio::task::yield_now().await;
        std::panic::panic_any("a broken call");
    }));
    let joined = caller.await;
    // Any task spawned while the caller unwound ends (it would panic at once).
    let quiet = dlock_core::backend::Deadline::after(Duration::from_secs(5));
    while tasks() > 0 && !quiet.has_passed() {
        tokio::task::yield_now().await;
    }
    let _ = std::panic::take_hook();
    std::panic::set_hook(before);
    assert!(
        joined.is_err_and(|e| e.is_panic()),
        "the caller did not panic"
    );
    assert_eq!(tasks(), 0, "a task is left");
    assert_eq!(
        panics.load(Ordering::SeqCst),
        1,
        "the call was resumed after its panic"
    );
    Ok(())
}
