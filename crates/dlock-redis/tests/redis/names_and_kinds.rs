//! Which names are refused (keys that cannot share a cluster slot, another lock's
//! bookkeeping), and kinds on one name: they exclude each other, or are refused clearly.

use crate::support::*;

/// In a cluster, a name whose `{` gives no hash tag would spread its keys over several slots:
/// it is rejected up front instead of failing with CROSSSLOT later. Names with a proper tag
/// work, and keys of names without braces land in one slot through Redisson's `{name}` rule.
#[tokio::test]
async fn cluster_rejects_names_it_cannot_colocate() {
    let Some(url) = service_url("DLOCK_REDIS_CLUSTER_URL") else {
        return;
    };
    let p = RedisProvider::connect(&url).await.unwrap();
    let names = Names::new();
    // `orders}42`: the lock key hashes whole, the keys dlock derives from it by
    // the tag `{...orders}`: CROSSSLOT at acquire time, unless refused up front.
    for bad in ["a{b", "a{}b", "x}{y", "orders}42"] {
        let e = p
            .lock(&names.name(bad), LockOptions::default())
            .unwrap_err();
        assert!(
            matches!(e, dlock_core::Error::InvalidName { .. }),
            "{bad}: {e:?}"
        );
    }
    for good in ["a{tag}b", "plain", "{tag}"] {
        let l = p.lock(&names.name(good), LockOptions::default()).unwrap();
        l.acquire().await.unwrap().release().await.unwrap();
    }
}

/// A name that is another name's bookkeeping key in Redisson's layout (a token, a fair queue,
/// a semaphore's permits, a read hold's timeout) is refused for every primitive: the two
/// would share one key and fail with WRONGTYPE, or worse.
#[tokio::test]
async fn names_that_are_bookkeeping_keys_are_refused() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let p = RedisProvider::connect(&url).await.unwrap();
    for bad in [
        "redisson_lock_token:{a}",
        "redisson_lock_queue:{a}",
        "redisson_lock_timeout:{a}",
        "{a}:timeout",
        "{a}:permits",
        "x{a}:timeout",
        "{a}:3f2c:1:rwlock_timeout:1",
    ] {
        let errors = [
            p.lock(bad, LockOptions::default()).err(),
            p.read_write_lock(bad, LockOptions::default()).err(),
            p.semaphore(bad, 2, LockOptions::default()).err(),
        ];
        for e in errors {
            assert!(
                matches!(e, Some(dlock_core::Error::InvalidName { .. })),
                "{bad}: {e:?}"
            );
        }
    }
    // Near misses stay usable: no brace, or the suffix not at the end.
    let names = Names::new();
    for good in ["a:timeout", "{a}:timeouts", "redisson_lock:x"] {
        let l = p.lock(&names.name(good), LockOptions::default()).unwrap();
        l.acquire().await.unwrap().release().await.unwrap();
    }
}

/// What an acquisition refused because the name's key is another kind's must be: a
/// non-retryable `InvalidArgument` whose text names the kind in use.
fn refused_for(r: dlock_core::Result<Option<dlock_core::LockGuard>>, in_use: &str, what: &str) {
    match r {
        Err(e @ dlock_core::Error::InvalidArgument { .. }) => {
            assert!(!e.is_retryable(), "{what}: {e}");
            assert!(
                e.to_string().contains(&format!("holds {in_use}")),
                "{what}: the error must name {in_use}: {e}"
            );
        }
        Err(e) => panic!("{what}: refused with {e:?}, not as the other kind in use"),
        Ok(Some(_)) => panic!("{what}: granted beside {in_use}"),
        Ok(None) => panic!("{what}: answered 'held', which no wait can change"),
    }
}

/// A mutex and a writer of one name exclude each other, in both orders. A writer asking while
/// a mutex holds is kept out (both share the hash, and the mutex's release deletes it
/// whole: a writer let in beside it would be wiped, and a second writer let in beside the
/// first). It is let in once the mutex is released, and then a second writer and a mutex
/// wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_and_a_writer_of_one_name_never_hold_together() {
    let Some((url, a)) = shared().await else {
        return;
    };
    let b = RedisProvider::connect(&url).await.unwrap();
    let c = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("mutex-write");
    // A short watchdog lease: a writer waiting on the mutex (whose release message goes to
    // the mutex channel) looks again within the hash's PTTL.
    let m = a
        .lock(&name, watchdog(1500))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let writer = b.read_write_lock(&name, LockOptions::default()).unwrap();
    let beside = writer.try_write(Duration::from_millis(300)).await.unwrap();
    assert!(
        beside.is_none(),
        "a writer was granted beside a mutex holder"
    );
    let waiting = tokio::spawn(async move { writer.write().await });
    m.release().await.unwrap();
    let w1 = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the writer is let in once the mutex is released")
        .unwrap()
        .unwrap();
    let second = c
        .read_write_lock(&name, LockOptions::default())
        .unwrap()
        .try_write(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(second.is_none(), "two writers at once");
    let mutex = c.lock(&name, LockOptions::default()).unwrap();
    let m2 = mutex.try_acquire(Duration::from_millis(300)).await.unwrap();
    assert!(m2.is_none(), "a mutex granted beside a writer");
    assert!(w1.is_held());
    w1.release().await.unwrap();
    let m2 = mutex
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the mutex is let in once the writer is released");
    m2.release().await.unwrap();
    forget(&url, &name).await;
}

/// A mutex and a reader of one name exclude each other, in both orders; readers still share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_and_a_reader_of_one_name_never_hold_together() {
    let Some((url, a)) = shared().await else {
        return;
    };
    let b = RedisProvider::connect(&url).await.unwrap();
    let c = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("mutex-read");
    let mutex = a.lock(&name, watchdog(1500)).unwrap();
    let m = mutex.acquire().await.unwrap();
    let rw = b.read_write_lock(&name, LockOptions::default()).unwrap();
    let beside = rw.try_read(Duration::from_millis(300)).await.unwrap();
    assert!(
        beside.is_none(),
        "a reader was granted beside a mutex holder"
    );
    m.release().await.unwrap();
    let r1 = rw
        .try_read(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the reader is let in once the mutex is released");
    let r2 = c
        .read_write_lock(&name, LockOptions::default())
        .unwrap()
        .try_read(Duration::ZERO)
        .await
        .unwrap()
        .expect("readers share");
    let m = mutex.try_acquire(Duration::from_millis(300)).await.unwrap();
    assert!(m.is_none(), "a mutex granted beside readers");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let m = mutex
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the mutex is let in once the readers are gone");
    m.release().await.unwrap();
    forget(&url, &name).await;
}

/// A lock and a semaphore of one name cannot wait for each other (a counter and a hash at one
/// key): while one kind's key exists, the other kind is refused at once with a non-retryable
/// `InvalidArgument` naming the kind in use, for every lock primitive, for `acquire()` without
/// deadline and for `available()`; the refused call changes nothing (here: an expired permit
/// in the semaphore's timeouts set is not reclaimed into a lock's hash), and the holder keeps
/// its hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_semaphore_of_one_name_refuse_each_other_clearly() {
    let Some((url, a)) = shared().await else {
        return;
    };
    let b = RedisProvider::connect(&url).await.unwrap();
    let names = Names::new();

    // A permit held: the locks are refused.
    let counted = names.name("sem-first");
    let sem = a.semaphore(&counted, 2, LockOptions::default()).unwrap();
    let permit = sem.acquire().await.unwrap();
    let mutex = b.lock(&counted, LockOptions::default()).unwrap();
    refused_for(
        mutex.try_acquire(Duration::ZERO).await,
        "a semaphore",
        "mutex",
    );
    refused_for(
        mutex.try_acquire(Duration::from_secs(1)).await,
        "a semaphore",
        "mutex with a wait",
    );
    let forever = tokio::time::timeout(Duration::from_secs(5), mutex.acquire())
        .await
        .expect("acquire() without deadline is refused at once, not retried");
    refused_for(forever.map(Some), "a semaphore", "acquire()");
    let fair = b
        .lock(&counted, LockOptions::default().with_fair(true))
        .unwrap();
    refused_for(
        fair.try_acquire(Duration::ZERO).await,
        "a semaphore",
        "fair mutex",
    );
    let rw = b.read_write_lock(&counted, LockOptions::default()).unwrap();
    refused_for(rw.try_read(Duration::ZERO).await, "a semaphore", "read");
    refused_for(rw.try_write(Duration::ZERO).await, "a semaphore", "write");
    assert!(permit.is_held());
    let second = sem
        .try_acquire(Duration::ZERO)
        .await
        .unwrap()
        .expect("the semaphore's second permit is untouched");
    permit.release().await.unwrap();
    second.release().await.unwrap();
    forget(&url, &counted).await;

    // A lock held (a mutex, then a writer): permits are refused, and nothing is changed.
    for (i, write) in [false, true].into_iter().enumerate() {
        let name = names.name(&format!("lock-first-{i}"));
        let held = if write {
            a.read_write_lock(&name, LockOptions::default())
                .unwrap()
                .write()
                .await
                .unwrap()
        } else {
            a.lock(&name, LockOptions::default())
                .unwrap()
                .acquire()
                .await
                .unwrap()
        };
        let mut c = admin(&url).await;
        let before: Vec<String> = redis::cmd("HGETALL")
            .arg(&name)
            .query_async(&mut c)
            .await
            .unwrap();
        let timeouts = format!("{{{name}}}:timeout");
        let _: i64 = redis::cmd("ZADD")
            .arg(&timeouts)
            .arg(1)
            .arg("an-expired-permit")
            .query_async(&mut c)
            .await
            .unwrap();
        let sem = b.semaphore(&name, 1, LockOptions::default()).unwrap();
        refused_for(sem.try_acquire(Duration::ZERO).await, "a lock", "permit");
        refused_for(
            sem.try_acquire(Duration::from_secs(1)).await,
            "a lock",
            "permit with a wait",
        );
        let available = sem.available().await;
        refused_for(available.map(|_| None), "a lock", "available()");
        let after: Vec<String> = redis::cmd("HGETALL")
            .arg(&name)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(before, after, "the lock's hash is untouched");
        let left: i64 = redis::cmd("ZCARD")
            .arg(&timeouts)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(left, 1, "the refused acquire reclaimed a permit first");
        assert!(held.is_held());
        held.release().await.unwrap();
        forget(&url, &name).await;
    }
}

/// `describe` tells a write hold (exclusive) from a read hold (shared).
#[tokio::test]
async fn describe_tells_a_write_hold_from_a_read_hold() {
    let Some((url, p)) = shared().await else {
        return;
    };
    let name = Names::new().name("describe");
    let rw = p.read_write_lock(&name, LockOptions::default()).unwrap();
    let w = rw.write().await.unwrap();
    assert_eq!(
        p.describe(&name).await.unwrap().kind,
        Some(dlock_core::LockKind::Write)
    );
    w.release().await.unwrap();
    let r = rw.read().await.unwrap();
    assert_eq!(
        p.describe(&name).await.unwrap().kind,
        Some(dlock_core::LockKind::Read)
    );
    r.release().await.unwrap();
    forget(&url, &name).await;
}

/// `key_prefix` keeps applications that share one server apart: the same name under two
/// prefixes (and none) is three locks, each at its prefixed key in Redisson's layout, and two
/// providers of one prefix exclude each other. A prefix with braces is refused (it would take
/// the hash tag from the names).
#[tokio::test]
async fn a_key_prefix_keeps_applications_apart() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let names = Names::new();
    let name = names.name("prefixed");
    let sep = if url.contains('?') { '&' } else { '?' };
    let billing = RedisProvider::connect(&format!("{url}{sep}key_prefix=billing:"))
        .await
        .unwrap();
    let billing_too = RedisProvider::connect(&format!("{url}{sep}key_prefix=billing:"))
        .await
        .unwrap();
    let reports = RedisProvider::connect(&format!("{url}{sep}key_prefix=reports:"))
        .await
        .unwrap();
    let plain = RedisProvider::connect(&url).await.unwrap();
    let held: Vec<_> = [&billing, &reports, &plain]
        .into_iter()
        .map(|p| p.lock(&name, LockOptions::default()).unwrap())
        .collect();
    let mut guards = Vec::new();
    for l in &held {
        guards.push(
            l.try_acquire(Duration::ZERO)
                .await
                .unwrap()
                .expect("another prefix's hold kept this one out"),
        );
    }
    let other = billing_too.lock(&name, LockOptions::default()).unwrap();
    assert!(
        other.try_acquire(Duration::ZERO).await.unwrap().is_none(),
        "two providers of one prefix did not exclude each other"
    );
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for key in [
        format!("billing:{name}"),
        format!("reports:{name}"),
        name.clone(),
    ] {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(kind, "hash", "{key} is not a Redisson lock hash");
    }
    assert_eq!(
        billing.describe(&name).await.unwrap().holders.len(),
        1,
        "describe reads the prefixed key"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    // Another set of locks, so another store to MultiLock (which keeps one name per store).
    assert_ne!(billing.store_id(), plain.store_id());
    assert_eq!(billing.store_id(), billing_too.store_id());
    let e = RedisProvider::connect(&format!("{url}{sep}key_prefix=%7Bapp%7D:"))
        .await
        .unwrap_err();
    assert!(matches!(e, dlock_core::Error::Config { .. }), "{e:?}");
}
