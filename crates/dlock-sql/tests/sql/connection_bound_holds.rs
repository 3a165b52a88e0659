//! Holds that live in a pinned connection (for-update, advisory, get-lock): the connection is
//! the lease, and its end is the hold's end.

use std::time::Duration;

use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{Lease, LockOptions, LockProvider};
use dlock_sql::SqlProvider;
use tokio::time::Instant;

use crate::support::*;

/// The for-update holder's connection killed with `KILL <id>`: the server frees the row at
/// once, so the holder is told by its connection watch (within a second for a 30 s lease),
/// not at its first renewal 10 s later, and another client gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_for_update_connection_reports_loss() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    holder_connection_ended_reports_loss(&mysql, "KILL", "for-update").await;
}

/// The same for a MySQL named lock (get-lock): its session is the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_get_lock_connection_reports_loss() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    holder_connection_ended_reports_loss(&mysql, "KILL", "get-lock").await;
}

/// The same on PostgreSQL: `pg_terminate_backend` of the holder's backend is
/// reported through `lost()` at once, and another client gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_postgres_holder_backend_reports_loss() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    holder_connection_ended_reports_loss(&pg, "SELECT pg_terminate_backend", "for-update").await;
}

/// The same for a PostgreSQL advisory lock: its session is the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_postgres_advisory_holder_reports_loss() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    holder_connection_ended_reports_loss(&pg, "SELECT pg_terminate_backend", "advisory").await;
}

/// Ends the for-update holder's server connection with `kill <id>` (or `kill(<id>)`) from an
/// admin connection, and checks the holder is told at once and the lock is free.
async fn holder_connection_ended_reports_loss(base: &str, kill: &str, strategy: &str) {
    let _serial = SERIAL.lock().await;
    let url = with_query(
        base,
        &format!("strategy={strategy}&table={}", prefix(strategy)),
    );
    let p = SqlProvider::connect(&url).await.unwrap();
    let name = Names::new().name("kill-conn");
    let opts = LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(30)));
    let g = p.lock(&name, opts).unwrap().acquire().await.unwrap();
    let id = p
        .holder_connection_id(&name)
        .expect("the holding connection");
    let db = admin(base).await;
    let statement = if kill.starts_with("SELECT") {
        format!("{kill}({id})")
    } else {
        format!("{kill} {id}")
    };
    sqlx::query(&statement).execute(&db).await.unwrap();
    must(
        Duration::from_secs(5),
        "lost() after the connection was ended, long before the first renewal (10 s)",
        g.lost(),
    )
    .await;
    assert!(!g.is_held());
    assert_eq!(
        g.loss_reason(),
        Some(dlock_core::LossReason::ConnectionLost)
    );
    let other = SqlProvider::connect(&url).await.unwrap();
    let g2 = other
        .lock(&name, LockOptions::default())
        .unwrap()
        .try_acquire(Duration::from_secs(3))
        .await
        .unwrap();
    assert!(g2.is_some(), "free once the connection is gone");
}

/// A MultiLock whose first for-update member's connection dies while it awaits the second
/// must not return: the row lock went with the connection (the server may already have given
/// it to someone else) and the member's lease has not ended, so only the store can tell.
/// Returned, such a member's fenced write would carry a token below the real holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilock_does_not_return_a_member_whose_connection_died() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let url = for_update(&mysql);
    let p = SqlProvider::connect(&url).await.unwrap();
    let other = SqlProvider::connect(&url).await.unwrap();
    let names = Names::new();
    let (first, second) = (names.name("multi-a"), names.name("multi-b"));
    let blocker = other
        .lock(&second, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let multi = dlock_core::MultiLock::new([
        p.lock(&first, LockOptions::default()).unwrap(),
        p.lock(&second, LockOptions::default()).unwrap(),
    ])
    .unwrap();
    let waiting = tokio::spawn(async move { multi.try_acquire(Duration::from_secs(20)).await });
    let id = eventually(
        Duration::from_secs(5),
        "the first member is held",
        || async { p.holder_connection_id(&first).ok_or("not yet") },
    )
    .await;
    let db = admin(&mysql).await;
    sqlx::query(&format!("KILL {id}"))
        .execute(&db)
        .await
        .unwrap();
    blocker.release().await.unwrap();
    match must(Duration::from_secs(10), "the MultiLock returns", waiting)
        .await
        .unwrap()
    {
        Err(dlock_core::Error::LockLost { .. }) => {}
        Err(e) => panic!("expected LockLost, got {e:?}"),
        Ok(Some(g)) => panic!(
            "returned a member whose connection died (tokens {:?})",
            g.fencing_tokens()
        ),
        Ok(None) => panic!("timed out although both members came free"),
    }
}

/// A for-update waiter cut off (or frozen) while it waits, and granted the row then, keeps it
/// only for its lease of idleness: the server-side lease is set before the wait, so it runs
/// from the grant. Set after the grant, by a client that cannot send it any more, it would
/// leave the server's default `wait_timeout` (8 h), and everyone else would starve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cut_off_when_granted_does_not_keep_the_row() {
    use dlock_conformance::Partition;
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let url = for_update(&mysql);
    let (cut, proxied) = dlock_conformance::ProxyPartition::start(&url, 3306)
        .await
        .unwrap();
    let holder = SqlProvider::connect(&url).await.unwrap();
    let waiter = SqlProvider::connect(&proxied).await.unwrap();
    let name = Names::new().name("cut-waiter");
    let g = holder
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let w = waiter
        .lock(
            &name,
            LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(2))),
        )
        .unwrap();
    let waiting = tokio::spawn(async move { w.try_acquire(Duration::from_secs(60)).await });
    let db = admin(&mysql).await;
    let hex: String = name.bytes().map(|b| format!("{b:02X}")).collect();
    eventually(
        Duration::from_secs(10),
        "the waiter waits in the server",
        || async {
            let threads: i64 = sqlx::query_scalar(
                "SELECT COUNT(DISTINCT t.trx_mysql_thread_id) \
             FROM information_schema.INNODB_LOCKS l \
             JOIN information_schema.INNODB_TRX t ON t.trx_id = l.lock_trx_id \
             WHERE l.lock_table LIKE '%`dlock_for_update_rows`' AND l.lock_data = ?",
            )
            .bind(format!("0x{hex}"))
            .fetch_one(&db)
            .await
            .map_err(|e| e.to_string())?;
            if threads >= 2 {
                Ok(())
            } else {
                Err(format!("{threads} threads on the row"))
            }
        },
    )
    .await;
    cut.set_partitioned(true);
    g.release().await.unwrap(); // the row goes to the cut-off waiter
    let third = SqlProvider::connect(&url).await.unwrap();
    let got = third
        .lock(&name, LockOptions::default())
        .unwrap()
        .try_acquire(Duration::from_secs(15))
        .await
        .unwrap();
    assert!(
        got.is_some(),
        "the row stayed with a waiter cut off when it was granted"
    );
    waiting.abort();
}

/// A pinned hold (for-update, advisory) released before its connection's first check leaves
/// no task behind: the watcher waits in the core's starter and is dropped with the
/// connection, instead of a task that sleeps a check period (a tenth of the lease, at least
/// 100 ms) only to find the hold gone, two wake-ups of a worker per cycle for nothing; the
/// advisory release runs in no task of its own. A current-thread runtime, so every task the
/// provider spawns is counted here.
#[tokio::test]
async fn pinned_holds_released_before_their_first_check_leave_no_task() {
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    for (url, label, _) in targets_with_postgres(&["for-update", "advisory", "get-lock"]) {
        let p = SqlProvider::connect(&url).await.unwrap();
        let lock = p
            .lock(&Names::new().name("no-task"), LockOptions::default())
            .unwrap();
        // The first cycle creates the row, warms the pool and starts the runtime's starter.
        lock.acquire().await.unwrap().release().await.unwrap();
        let before = tasks();
        for _ in 0..20 {
            lock.acquire().await.unwrap().release().await.unwrap();
        }
        let after = tasks();
        assert!(
            after <= before + 2,
            "{label}: {} tasks left behind by 20 released holds",
            after.saturating_sub(before)
        );
    }
}

/// A for-update pool that stays exhausted (every connection pins a held lock) is an error that
/// says so, never `None`, "held by someone", for a name nobody holds.
#[tokio::test]
async fn for_update_pool_exhaustion_is_an_error_not_a_busy_lock() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let p = SqlProvider::connect(&with_query(&for_update(&mysql), "pool=1"))
        .await
        .unwrap();
    let names = Names::new();
    let held = p
        .lock(&names.name("pins-the-pool"), LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let other = p
        .lock(&names.name("free"), LockOptions::default())
        .unwrap()
        .try_acquire(Duration::from_millis(200))
        .await;
    match other {
        Err(dlock_core::Error::Backend {
            message, retryable, ..
        }) => {
            assert!(message.contains("pool"), "{message}");
            assert!(!retryable);
        }
        other => panic!("a free name on an exhausted pool: {other:?}"),
    }
    held.release().await.unwrap();
}

/// A MySQL for-update provider whose lock pool has two connections, three fresh names from
/// `labels`, and the first of them held by the calling task; `None` without MySQL.
async fn pool_of_two_holding(
    labels: [&str; 3],
) -> Option<(SqlProvider, [String; 3], dlock_core::LockGuard)> {
    let mysql = service_url("DLOCK_MYSQL_URL")?;
    let p = SqlProvider::connect(&with_query(&for_update(&mysql), "pool=2"))
        .await
        .unwrap();
    let names = Names::new();
    let names = labels.map(|l| names.name(l));
    let held = p
        .lock(&names[0], LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    Some((p, names, held))
}

/// A task that holds a for-update lock and asks (with no deadline) for a second one while
/// every connection of the lock pool is pinned gets an error saying it may be waiting for
/// itself, instead of waiting for ever: the connection it waits for is its own lock's
/// waiter's, which waits for it. A task that holds none waits as long as it takes and gets
/// its lock once a connection is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_holding_a_pinned_lock_is_not_left_waiting_for_its_own_waiter() {
    let Some((p, [a, b, c], held)) = pool_of_two_holding(["held", "nested", "other"]).await else {
        return;
    };
    // A waiter of the held lock pins the pool's second connection.
    let waiter = {
        let lock = p.lock(&a, LockOptions::default()).unwrap();
        tokio::spawn(async move { lock.acquire().await })
    };
    eventually(
        Duration::from_secs(10),
        "the waiter pins the second connection",
        || {
            let lock = p.lock(&c, LockOptions::default()).unwrap();
            async move {
                match lock.try_acquire(Duration::ZERO).await {
                    Err(dlock_core::Error::Backend { message, .. }) if message.contains("pool") => {
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
    // A task that holds nothing waits for a connection as long as it takes.
    let patient = {
        let lock = p.lock(&c, LockOptions::default()).unwrap();
        tokio::spawn(async move { lock.acquire().await })
    };
    let nested = p.lock(&b, LockOptions::default()).unwrap();
    let e = must(
        Duration::from_secs(60),
        "the holder's second acquire ends",
        nested.acquire(),
    )
    .await
    .expect_err("no connection can come");
    assert!(
        matches!(&e, dlock_core::Error::WouldDeadlock { reason, .. } if reason.contains("pool=")),
        "{e}"
    );
    assert!(!e.is_retryable());
    held.release().await.unwrap();
    let w = must(Duration::from_secs(10), "the waiter gets the lock", waiter)
        .await
        .unwrap()
        .unwrap();
    w.release().await.unwrap();
    let g = must(
        Duration::from_secs(30),
        "the patient task gets its lock",
        patient,
    )
    .await
    .unwrap()
    .unwrap();
    g.release().await.unwrap();
}

/// A task that holds a for-update lock and asks for a second one while the lock pool is
/// full of other tasks' holds is not waiting for itself: it waits (past the pool's 10 s wait)
/// and gets its lock when another task releases, never a `WouldDeadlock`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_busy_with_other_tasks_holds_is_waited_for() {
    let Some((p, [_, b, c], held)) = pool_of_two_holding(["mine", "next", "theirs"]).await else {
        return;
    };
    let (release_c, released) = tokio::sync::oneshot::channel::<()>();
    let (taken_tx, taken) = tokio::sync::oneshot::channel::<()>();
    let other = {
        let lock = p.lock(&c, LockOptions::default()).unwrap();
        tokio::spawn(async move {
            let g = lock.acquire().await.unwrap();
            let _ = taken_tx.send(());
            let _ = released.await;
            g.release().await.unwrap();
        })
    };
    taken.await.unwrap();
    // The other task lets go of its lock 12 s from now: past the pool's wait.
    let at = dlock_core::backend::later(Instant::now(), Duration::from_secs(12));
    tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        let _ = release_c.send(());
    });
    let next = p.lock(&b, LockOptions::default()).unwrap();
    let g = must(Duration::from_secs(40), "the second lock", next.acquire())
        .await
        .expect("a busy pool is no deadlock");
    assert!(
        Instant::now() >= at,
        "granted before a connection came free"
    );
    g.release().await.unwrap();
    held.release().await.unwrap();
    other.await.unwrap();
}

/// `describe` of a for-update lock neither takes it nor bumps its fence: a try of the lock with
/// NOWAIT would take a fencing token when the lock is free (and make a concurrent NOWAIT
/// acquirer fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describing_a_for_update_lock_neither_takes_it_nor_bumps_the_fence() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let p = SqlProvider::connect(&for_update(&mysql)).await.unwrap();
    let name = Names::new().name("describe-fence");
    let lock = p.lock(&name, LockOptions::default()).unwrap();
    let g = lock.acquire().await.unwrap();
    let first = g.fencing_token().get();
    let status = p.describe(&name).await.unwrap();
    assert!(status.is_held(), "{status:?}");
    assert_eq!(status.last_token, Some(first));
    g.release().await.unwrap();
    for _ in 0..3 {
        let status = p.describe(&name).await.unwrap();
        assert!(!status.is_held(), "{status:?}");
        assert_eq!(status.last_token, Some(first), "describe bumped the fence");
    }
    let g = lock.acquire().await.unwrap();
    assert_eq!(
        g.fencing_token().get(),
        first + 1,
        "the next holder's token is the next one: describe handed out none"
    );
    g.release().await.unwrap();
}

/// A for-update guard dropped on a thread with no tokio runtime still frees its row at once:
/// the release, and with it the pinned connection's COMMIT, runs on the runtime the guard was
/// made on (the core's guard captures that runtime), so the pinned connection does not leak.
/// Without it the row would stay locked for the hold's 60 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_for_update_guard_dropped_outside_the_runtime_frees_its_row() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let url = for_update(&mysql);
    let (a, b) = (
        SqlProvider::connect(&url).await.unwrap(),
        SqlProvider::connect(&url).await.unwrap(),
    );
    let name = Names::new().name("drop-off-runtime");
    let opts = LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(60)));
    let g = a.lock(&name, opts).unwrap().acquire().await.unwrap();
    std::thread::spawn(move || drop(g)).join().unwrap();
    let g = must(
        Duration::from_secs(15),
        "an acquire after the drop",
        b.lock(&name, LockOptions::default())
            .unwrap()
            .try_acquire(Duration::from_secs(10)),
    )
    .await
    .unwrap()
    .expect("the dropped guard's row was freed well within its 60 s lease");
    g.release().await.unwrap();
}

/// A holding connection that answers slowly (a loaded machine) is not taken for a dead one:
/// a watcher's check cut off before the lease (after a third of it, say) would close the
/// connection, and so end a live hold on the server. Here every reply comes 2.5 s late on a
/// 6 s lease (a cut-off at a third, 2 s, loses the hold about 2.6 s in). The lease is fixed,
/// so the watcher's checks (which set the server-side lease to what is left) are the only
/// statements: a watchdog's renewals would queue behind them, and no check limit keeps a
/// watchdog lease on a link that slow.
///
/// The release waits behind the check in flight, up to 2.5 s: it starts 3 s in, so that it
/// reaches the server before the lease ends (a release 4 s in, behind a check sent 4 s in,
/// whose server-side lease of what was left, 2 s, would end the session first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_holding_connection_keeps_its_hold() {
    use dlock_conformance::ProxyPartition;
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let url = for_update(&mysql);
    let (proxy, proxied) = ProxyPartition::start(&url, 3306).await.unwrap();
    let p = SqlProvider::connect(&proxied).await.unwrap();
    let name = Names::new().name("slow-holder");
    let lease = Duration::from_secs(6);
    let g = p
        .lock(&name, LockOptions::new().with_lease(Lease::Fixed(lease)))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    proxy.delay_replies(Duration::from_millis(2500));
    let lost = tokio::time::timeout(Duration::from_secs(3), g.lost()).await;
    assert!(
        lost.is_err(),
        "a slow connection was taken for a dead one: {:?}",
        g.loss_reason()
    );
    // The server still has it: another client, not behind the proxy, is refused.
    let direct = SqlProvider::connect(&url).await.unwrap();
    assert!(
        direct
            .lock(&name, LockOptions::default())
            .unwrap()
            .try_acquire(Duration::ZERO)
            .await
            .unwrap()
            .is_none(),
        "the server let the hold go"
    );
    proxy.delay_replies(Duration::ZERO);
    g.release().await.unwrap();
}

/// With the check's limit at the lease (see `a_slow_holding_connection_keeps_its_hold`), a
/// holder whose session the server ended behind a network that no longer carries the reset
/// must stop vouching for its hold once a check goes unanswered for a third of its lease
/// (`is_held()` false while suspended), not at the end of a fixed lease. With the check cut
/// off only at the lease, the guard said held for the whole 15 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holder_behind_a_dead_network_stops_vouching() {
    use dlock_conformance::{Partition, ProxyPartition};
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let (_, url) = advisory_rw(&pg).await;
    let (cut, proxied) = ProxyPartition::start(&url, 5432).await.unwrap();
    let p = SqlProvider::connect(&proxied).await.unwrap();
    let db = admin(&pg).await;
    let name = Names::new().name("dead-network");
    let lease = Duration::from_secs(9);
    let g = p
        .lock(&name, LockOptions::new().with_lease(Lease::Fixed(lease)))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let pid = p.holder_connection_id(&name).unwrap();
    cut.set_partitioned(true);
    sqlx::query(&format!("SELECT pg_terminate_backend({pid})"))
        .execute(&db)
        .await
        .unwrap();
    let ended = Instant::now();
    eventually(
        Duration::from_secs(5),
        "the guard stops vouching (a third of the lease, and a check period)",
        || async {
            if g.is_held() {
                Err(format!(
                    "held {:?} after its session ended",
                    ended.elapsed()
                ))
            } else {
                Ok(())
            }
        },
    )
    .await;
    cut.set_partitioned(false);
}

/// A for-update hold released cleanly is not reported lost when its watcher, mid-check, finds
/// the connection given back (no `dlock.lost` warning, no resolved `lost()` for a released
/// hold): the watcher tells a connection given back clean from one closed. A race: many short
/// holds, each watched (every 100 ms) while released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_for_update_hold_is_not_reported_lost() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let p = SqlProvider::connect(&for_update(&pg)).await.unwrap();
    let name = Names::new().name("released-clean");
    let l = p
        .lock(
            &name,
            LockOptions::new().with_lease(Lease::watchdog(Duration::from_secs(1))),
        )
        .unwrap();
    // lost() also resolves at the lease end of a released hold, so each hold is judged within
    // its lease: batches of holds, then two watcher periods, then every hold of the batch
    // whose lease has not ended must not be reported lost.
    let lease = Duration::from_secs(1);
    let mut judged = 0;
    for _ in 0..8 {
        let mut watched = Vec::new();
        for _ in 0..40 {
            // The lease counts from when the granted request was sent, which may be well
            // before the acquire returns (the fence comes after it): judge from before the
            // call, not after it, or a loaded machine ends some leases before they are judged.
            let before = Instant::now();
            let g = l.acquire().await.unwrap();
            watched.push((before, before.elapsed(), Box::pin(g.lost())));
            g.release().await.unwrap();
        }
        // A window for something that must not happen, not a wait for an event.
        tokio::time::sleep(Duration::from_millis(250)).await;
        for (before, took, lost) in watched {
            let reported = tokio::time::timeout(Duration::ZERO, lost).await;
            let since = before.elapsed();
            if since < lease - Duration::from_millis(100) {
                judged += 1;
                assert!(
                    reported.is_err(),
                    "a released hold was reported lost {since:?} after its acquire started \
                     (the acquire took {took:?}; the lease is {lease:?})"
                );
            }
        }
    }
    assert!(judged > 0, "no hold could be judged within its lease");
}

/// PostgreSQL keeps a pinned hold for a stopped client by a session timeout of at most
/// 2^31 - 1 ms (24.8 days): a longer lease is refused where the hold is pinned (its store
/// would free a hold its client still vouches for), and accepted where the lease is a row's.
#[tokio::test]
async fn postgres_refuses_pinned_leases_longer_than_its_session_timeouts() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let day = Duration::from_secs(24 * 60 * 60);
    for (strategy, pinned) in [
        ("for-update", true),
        ("advisory", true),
        ("unique-insert", false),
    ] {
        let url = with_query(
            &pg,
            &format!("strategy={strategy}&table={}", prefix(strategy)),
        );
        let p = SqlProvider::connect(&url).await.unwrap();
        for lease in [Lease::Fixed(25 * day), Lease::watchdog(25 * day)] {
            let r = p.lock("long-lease", LockOptions::new().with_lease(lease));
            match (pinned, r) {
                (true, Err(dlock_core::Error::InvalidArgument { .. })) | (false, Ok(_)) => {}
                (_, other) => panic!("{strategy}, {lease:?}: {other:?}"),
            }
        }
        let r = p.lock(
            "long-lease",
            LockOptions::new().with_lease(Lease::Fixed(24 * day)),
        );
        assert!(r.is_ok(), "{strategy}: 24 days: {r:?}");
    }
}

/// A pinned guard that outlives the runtime it was taken on (a synchronous wrapper with a
/// runtime per call) and is dropped with no runtime at all gives its pool slot back: the
/// connection is taken out of the pool and closed (the server then frees the row), so the
/// provider's one-connection lock pool serves the next lock on the next runtime. A leaked
/// connection would keep the slot for good.
#[test]
fn a_pinned_guard_dropped_after_its_runtime_gives_its_pool_slot_back() {
    let Some(pg) = service_url("DLOCK_POSTGRES_URL") else {
        return;
    };
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let url = with_query(&for_update(&pg), "pool=1");
    let name = Names::new().name("guard-outlives-runtime");
    let first = runtime();
    let (provider, guard) = first.block_on(async {
        let provider = SqlProvider::connect(&url).await.unwrap();
        let lock = provider.lock(&name, LockOptions::default()).unwrap();
        let guard = lock.acquire().await.unwrap();
        (provider, guard)
    });
    drop(first);
    drop(guard);
    let second = runtime();
    let granted = second.block_on(async {
        provider
            .lock(&name, LockOptions::default())
            .unwrap()
            .try_acquire(Duration::from_secs(10))
            .await
    });
    let g = granted
        .expect("the lock pool has its slot back")
        .expect("the server freed the row of the closed connection");
    second.block_on(g.release()).unwrap();
}

/// A get-lock waiter whose `GET_LOCK` is interrupted (`KILL QUERY`, as pt-kill does; a
/// statement time limit answers the same NULL) goes on waiting: it held nothing, and the wait
/// is the caller's. It gets the lock once the holder releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_get_lock_wait_goes_on() {
    let Some(mysql) = service_url("DLOCK_MYSQL_URL") else {
        return;
    };
    let url = with_query(
        &mysql,
        &format!("strategy=get-lock&table={}", prefix("get-lock")),
    );
    let holder = SqlProvider::connect(&url).await.unwrap();
    let waiter = SqlProvider::connect(&url).await.unwrap();
    let name = Names::new().name("interrupted");
    let g = holder
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let lock = waiter.lock(&name, LockOptions::default()).unwrap();
    let waiting = tokio::spawn(async move { lock.try_acquire(Duration::from_secs(30)).await });
    let db = admin(&mysql).await;
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    let id: i64 = eventually(
        Duration::from_secs(10),
        "the waiter's GET_LOCK waits on the server",
        || async {
            sqlx::query(
                "SELECT ID FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE CONCAT('%GET_LOCK(%', ?, '%') AND ID <> CONNECTION_ID()",
            )
            .bind(format!("X'{hex}'"))
            .fetch_optional(&db)
            .await
            .unwrap()
            .map(|row| sqlx::Row::try_get::<i64, _>(&row, 0).unwrap())
            .ok_or("not yet")
        },
    )
    .await;
    sqlx::query(&format!("KILL QUERY {id}"))
        .execute(&db)
        .await
        .unwrap();
    g.release().await.unwrap();
    let got = must(
        Duration::from_secs(20),
        "the waiter after its wait was interrupted",
        waiting,
    )
    .await
    .unwrap();
    match got {
        Ok(Some(g)) => g.release().await.unwrap(),
        other => panic!("the interrupted waiter: {other:?}"),
    }
}
