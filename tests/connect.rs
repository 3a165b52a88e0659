//! `dlock::connect` and the facade client: URL handling and bad input (contract §13).

use std::time::Duration;

use dlock::{Error, Lease, LockOptions, MultiLock};

fn config_error(r: dlock::Result<dlock::Locks>) -> String {
    match r {
        Err(e @ Error::Config { .. }) => e.to_string(),
        Err(e) => panic!("expected Error::Config, got {e:?}"),
        Ok(l) => panic!("expected Error::Config, got a client for {}", l.store_id()),
    }
}

#[tokio::test]
async fn unknown_scheme_names_the_compiled_in_schemes() {
    let msg = config_error(dlock::connect("consul://127.0.0.1:8500").await);
    assert!(msg.contains("unknown scheme consul://"), "{msg}");
    assert!(msg.contains("memory://"), "{msg}");
}

#[tokio::test]
async fn not_a_url_is_a_config_error_without_secrets() {
    for bad in ["", "redis", "://x", "127.0.0.1:6379", "user:secret@host"] {
        let msg = config_error(dlock::connect(bad).await);
        assert!(msg.contains("not a URL"), "{bad:?}: {msg}");
    }
    let msg = config_error(dlock::connect("memory://u:secret@x:1").await);
    assert!(!msg.contains("secret"), "{msg}");
}

#[tokio::test]
async fn schemes_of_disabled_backends_name_their_feature() {
    for (url, feature) in [
        ("redis://:hunter2@127.0.0.1:6379", "redis"),
        ("zk://127.0.0.1:2181", "zookeeper"),
        ("mysql://u:hunter2@127.0.0.1/db", "mysql"),
        ("sqlite:///tmp/x.db", "sqlite"),
        ("etcd://u:hunter2@127.0.0.1:2379", "etcd"),
    ] {
        let scheme = url.split("://").next().unwrap();
        if dlock::SCHEMES.contains(&scheme) {
            continue; // compiled in: covered by the backend's own tests
        }
        let msg = config_error(dlock::connect(url).await);
        assert!(msg.contains(&format!("`{feature}` feature")), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
    }
}

/// `SCHEMES` lists every scheme the backends of this build accept: with every backend on,
/// each scheme one of them takes is there.
#[cfg(feature = "all-backends")]
#[test]
fn schemes_lists_every_scheme_of_the_backends() {
    let backends = [
        dlock::memory::SCHEMES,
        dlock::redis::SCHEMES,
        &["zk"],
        dlock::sql::SCHEMES,
        dlock::etcd::SCHEMES,
    ];
    for scheme in backends.iter().flat_map(|s| s.iter()) {
        assert!(
            dlock::SCHEMES.contains(scheme),
            "{scheme} is missing from {:?}",
            dlock::SCHEMES
        );
    }
}

#[tokio::test]
async fn bad_names_and_options_are_clear_errors() {
    let locks = dlock::connect("memory://").await.unwrap();
    let long = "x".repeat(256);
    for bad in ["", "nul\0", "bell\u{7}", long.as_str()] {
        assert!(
            matches!(locks.lock(bad), Err(Error::InvalidName { .. })),
            "{bad:?}"
        );
        assert!(matches!(
            locks.read_write_lock(bad),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            locks.semaphore(bad, 1),
            Err(Error::InvalidName { .. })
        ));
    }
    assert!(matches!(
        locks.semaphore("s", 0),
        Err(Error::InvalidArgument { .. })
    ));
    for lease in [
        Lease::Fixed(Duration::ZERO),
        Lease::watchdog(Duration::from_millis(1)),
    ] {
        let r = locks.lock_with("l", LockOptions::new().with_lease(lease));
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{lease:?}: {r:?}"
        );
    }
    assert!(matches!(
        MultiLock::new(Vec::<dlock::DynLock>::new()),
        Err(Error::InvalidArgument { .. })
    ));
}

#[tokio::test]
async fn named_memory_stores_are_shared_and_private_ones_are_not() {
    let a = dlock::connect("memory://facade-shared").await.unwrap();
    let b = dlock::connect("memory://facade-shared").await.unwrap();
    let private = dlock::connect("memory://").await.unwrap();
    assert_eq!(a.store_id(), b.store_id());
    let g = a.lock("n").unwrap().acquire().await.unwrap();
    assert!(
        b.lock("n")
            .unwrap()
            .try_acquire(Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    let p = private
        .lock("n")
        .unwrap()
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    assert!(p.is_some(), "a private store shares nothing");
    g.release().await.unwrap();
}

#[tokio::test]
async fn multilock_spans_stores_and_rolls_back() {
    let one = dlock::connect("memory://multi-one").await.unwrap();
    let two = dlock::connect("memory://multi-two").await.unwrap();
    let blocker = two.lock("b").unwrap().acquire().await.unwrap();
    let multi = MultiLock::new(vec![two.lock("b").unwrap(), one.lock("a").unwrap()]).unwrap();
    // Canonical order: by store id, then name.
    let order: Vec<_> = multi
        .members()
        .iter()
        .map(|l| l.store_id().to_owned())
        .collect();
    assert_eq!(order, ["memory://multi-one", "memory://multi-two"]);
    assert!(
        multi
            .try_acquire(Duration::from_millis(50))
            .await
            .unwrap()
            .is_none()
    );
    let a = one
        .lock("a")
        .unwrap()
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    assert!(a.is_some(), "the lock on the first store was rolled back");
    drop(a);
    blocker.release().await.unwrap();
    let all = multi
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("both free");
    assert_eq!(all.fencing_tokens().len(), 2);
    all.release().await.unwrap();
}

#[test]
fn guard_dropped_without_a_runtime_does_not_panic() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (locks, guard) = rt.block_on(async {
        let locks = dlock::connect("memory://").await.unwrap();
        let guard = locks.lock("x").unwrap().acquire().await.unwrap();
        (locks, guard)
    });
    drop(rt);
    drop(guard); // no runtime: nothing is sent, the lease ends it
    drop(locks);
}

#[tokio::test]
async fn run_does_the_work_under_the_lock_and_releases_it() {
    use dlock::DistributedLockExt;
    let locks = dlock::connect("memory://").await.unwrap();
    let lock = locks.lock("run").unwrap();
    let other = locks.lock("run").unwrap();
    let token = lock
        .run(|token| {
            let other = std::sync::Arc::clone(&other);
            async move {
                let busy = other.try_acquire(Duration::ZERO).await.unwrap().is_none();
                assert!(busy, "the work runs under the lock");
                token
            }
        })
        .await
        .unwrap();
    assert!(token.get() > 0);
    let free = other.try_acquire(Duration::ZERO).await.unwrap();
    assert!(
        free.is_some(),
        "released when run returns (awaited, not in the background)"
    );
    // Held elsewhere: try_run does not run the work.
    let held = free.unwrap();
    let ran = lock
        .try_run(Duration::from_millis(20), |_| async { unreachable!() })
        .await
        .unwrap();
    assert!(ran.is_none());
    held.release().await.unwrap();
}

#[tokio::test]
async fn run_drops_the_work_when_the_lock_is_lost() {
    use dlock::DistributedLockExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    let locks = dlock::connect("memory://").await.unwrap();
    let short = LockOptions::new().with_lease(Lease::Fixed(Duration::from_millis(50)));
    let lock = locks.lock_with("lost-run", short).unwrap();
    let finished = std::sync::Arc::new(AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&finished);
    let r = lock
        .run(|_| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            flag.store(true, Ordering::SeqCst);
        })
        .await;
    assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the work was dropped at the loss"
    );
}

/// `ConnectOptions` writes credentials and parameters into the URL, percent-encoded; it
/// refuses to set what the URL already sets, and never shows the password.
#[test]
fn connect_options_write_into_the_url() {
    let o = dlock::ConnectOptions::new()
        .username("app")
        .password("p@ss:w/rd?&")
        .param("timeout_ms", "100");
    assert_eq!(
        o.apply("redis://h:1/0").unwrap(),
        "redis://app:p%40ss%3Aw%2Frd%3F%26@h:1/0?timeout_ms=100"
    );
    assert_eq!(
        o.apply("redis+sentinel://s1,s2/m?wait_replicas=1").unwrap(),
        "redis+sentinel://app:p%40ss%3Aw%2Frd%3F%26@s1,s2/m?wait_replicas=1&timeout_ms=100"
    );
    assert!(!format!("{o:?}").contains("p@ss"), "{o:?}");
    // The fragment stays last, an empty userinfo stays, and an escaped key is the same key.
    let p = dlock::ConnectOptions::new().param("timeout_ms", "5");
    assert_eq!(
        p.apply("redis://h/0#x").unwrap(),
        "redis://h/0?timeout_ms=5#x"
    );
    assert_eq!(
        p.apply("sqlite://@dir/locks.db").unwrap(),
        "sqlite://@dir/locks.db?timeout_ms=5"
    );
    assert!(p.apply("redis://h?timeout%5Fms=1").is_err());
    let secret = dlock::ConnectOptions::new().param("sentinel_password", "hunter2");
    assert!(!format!("{secret:?}").contains("hunter2"), "{secret:?}");
    // A user in the URL and the password beside it.
    let password = dlock::ConnectOptions::new().password("pw");
    assert_eq!(
        password.apply("mysql://app@db:3306/x").unwrap(),
        "mysql://app:pw@db:3306/x"
    );
    for (url, says) in [
        ("redis://u:hunter2@h", "the user is in both"),
        ("redis://:hunter2@h", "the password is in both"),
        ("redis://h?timeout_ms=5", "\"timeout_ms\""),
        ("h:1", "not a URL"),
    ] {
        let e = o.apply(url).unwrap_err();
        assert!(matches!(e, Error::Config { .. }), "{url}: {e:?}");
        let shown = format!("{e} {e:?}");
        assert!(shown.contains(says), "{url}: {shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("p@ss"),
            "{shown}"
        );
    }
}

/// A password given beside the URL reaches the server (MariaDB's `dlock` user), and a wrong
/// one is refused without showing it.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn connect_with_a_password_beside_the_url() {
    let Ok(env) = std::env::var("DLOCK_MYSQL_URL") else {
        assert!(
            std::env::var("DLOCK_TEST_REQUIRE").as_deref() != Ok("all"),
            "DLOCK_MYSQL_URL is not set but DLOCK_TEST_REQUIRE=all"
        );
        eprintln!("skipped: DLOCK_MYSQL_URL is not set");
        return;
    };
    let mut parsed = url::Url::parse(&env).unwrap();
    let password = parsed.password().unwrap_or("").to_owned();
    parsed.set_password(None).unwrap();
    let bare = parsed.to_string();
    let locks = dlock::connect_with(&bare, &dlock::ConnectOptions::new().password(&password))
        .await
        .unwrap();
    let g = locks
        .lock("connect-with/beside")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
    let wrong = dlock::ConnectOptions::new().password("not-the-Pa55word");
    let e = dlock::connect_with(&bare, &wrong).await.unwrap_err();
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains("not-the-Pa55word"), "{shown}");
}

/// With the `serde` feature, options come from an application's configuration.
#[cfg(feature = "serde")]
#[test]
fn connect_options_deserialize() {
    let o: dlock::ConnectOptions = serde_json::from_str(
        r#"{"username": "app", "password": "s3cret", "params": {"strategy": "optimistic"}}"#,
    )
    .unwrap();
    assert_eq!(
        o,
        dlock::ConnectOptions::new()
            .username("app")
            .password("s3cret")
            .param("strategy", "optimistic")
    );
    assert!(serde_json::from_str::<dlock::ConnectOptions>(r#"{"passwd": "x"}"#).is_err());
}

/// With the `serde` feature, each backend's configuration comes from an application's
/// configuration as its URL, checked as `connect` checks it: a typo in a parameter fails the
/// load, and the error does not show the password.
#[cfg(all(
    feature = "serde",
    feature = "redis",
    feature = "zookeeper",
    feature = "mysql",
    feature = "etcd"
))]
#[test]
fn backend_configs_deserialize_from_their_urls() {
    #[derive(serde::Deserialize)]
    struct App {
        redis: dlock::redis::RedisConfig,
        zk: dlock::zookeeper::ZkConfig,
        sql: dlock::sql::SqlConfig,
        etcd: dlock::etcd::EtcdConfig,
    }
    let app: App = serde_json::from_str(
        r#"{"redis": "redis://127.0.0.1:6390/?fair_wait_ms=17000",
            "zk": "zk://127.0.0.1:2181/app?session_timeout_ms=4000",
            "sql": "mysql://u:p@127.0.0.1/db?strategy=optimistic",
            "etcd": "etcd://127.0.0.1:2379/app/?ttl_s=30"}"#,
    )
    .unwrap();
    assert_eq!(app.redis.fair_wait, Duration::from_secs(17));
    assert_eq!(app.zk.session_timeout, Duration::from_secs(4));
    assert_eq!(app.zk.chroot, "/app");
    assert_eq!(app.sql.strategy, dlock::sql::Strategy::Optimistic);
    assert_eq!(app.etcd.lease_ttl, Duration::from_secs(30));

    for (bad, what) in [
        (r#""redis://:Pa55@127.0.0.1/?clustr=true""#, "clustr"),
        (r#""zk://127.0.0.1?session_timeout=4""#, "session_timeout"),
        (
            r#""mysql://u:Pa55@127.0.0.1/db?strategy=optimstic""#,
            "optimstic",
        ),
        (r#""etcd://u:Pa55@127.0.0.1?ttl=30""#, "ttl"),
    ] {
        let e = match what {
            "clustr" => serde_json::from_str::<dlock::redis::RedisConfig>(bad).err(),
            "session_timeout" => serde_json::from_str::<dlock::zookeeper::ZkConfig>(bad).err(),
            "optimstic" => serde_json::from_str::<dlock::sql::SqlConfig>(bad).err(),
            _ => serde_json::from_str::<dlock::etcd::EtcdConfig>(bad).err(),
        };
        let shown = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(shown.contains(what), "{bad}: {shown}");
        assert!(!shown.contains("Pa55"), "{bad}: {shown}");
    }
    assert!(serde_json::from_str::<dlock::redis::RedisConfig>("42").is_err());
}
