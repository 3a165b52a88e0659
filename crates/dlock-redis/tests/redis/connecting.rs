//! How a provider connects: from an application's own `redis::Client`, and over TLS with a
//! private authority and a client certificate.

use crate::support::*;

/// A provider made from the application's own `redis::Client` (here a RESP2
/// client, redis-rs's default) locks, wakes its waiters (its subscription connection speaks
/// RESP3 whatever the client says), and is the same store as one made from the URL, so a
/// MultiLock treats them as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_from_the_applications_client() {
    let Some(url) = service_url("DLOCK_REDIS_URL") else {
        return;
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let own = RedisProvider::from_client(&client).await.unwrap();
    let by_url = RedisProvider::connect(&url).await.unwrap();
    assert_eq!(own.store_id(), by_url.store_id());
    let name = Names::new().name("from-client");
    let held = own
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let other = RedisProvider::from_client(&client).await.unwrap();
        let name = name.clone();
        tokio::spawn(async move {
            let lock = other.lock(&name, LockOptions::default()).unwrap();
            // Woken by the release message: a 30 s lease would keep a waiter that missed it
            // asleep far longer than this bound.
            let g = must(
                Duration::from_secs(10),
                "the waiter is woken",
                lock.acquire(),
            )
            .await
            .unwrap();
            g.release().await.unwrap();
        })
    };
    eventually(Duration::from_secs(5), "the waiter subscribed", || {
        subscribed(&url, &name, 1)
    })
    .await;
    held.release().await.unwrap();
    waiter.await.unwrap();
}

/// `rediss://` with the URL's `ca_file`, `cert_file` and `key_file`: a private
/// `redis-server` of this test's own serves TLS only and asks every client for a certificate
/// its authority signed. With the authority and the client certificate, locks work; without
/// the client certificate, or without the authority (the system's roots do not know it), the
/// connect fails; a missing file is a configuration error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_and_a_client_certificate() {
    // The server is the test's own, but it runs the redis-server the shared one runs.
    if service_url("DLOCK_REDIS_URL").is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("dlock-redis-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let certs = make_certificates(&dir);
    let port = free_port().expect("a free loopback port");
    let server = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--save", "", "--dir"])
        .arg(&dir)
        .arg("--tls-cert-file")
        .arg(&certs.server.0)
        .arg("--tls-key-file")
        .arg(&certs.server.1)
        .arg("--tls-ca-cert-file")
        .arg(&certs.ca)
        .args(["--tls-auth-clients", "yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs");
    struct Stop(Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Stop(server);

    let with = |params: &str| format!("rediss://127.0.0.1:{port}/?timeout_ms=2000{params}");
    let files = format!(
        "&ca_file={}&cert_file={}&key_file={}",
        certs.ca.display(),
        certs.client.0.display(),
        certs.client.1.display()
    );
    let url = with(&files);
    let p = eventually(Duration::from_secs(20), "a TLS connection", || {
        let url = url.clone();
        async move {
            RedisProvider::connect(&url)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    let parsed = dlock_redis::RedisConfig::from_url(&url).unwrap();
    assert_eq!(parsed.tls.ca_file.as_ref(), Some(&certs.ca));
    let lock = p
        .lock(&Names::new().name("tls"), LockOptions::default())
        .unwrap();
    let g = lock.acquire().await.unwrap();
    assert!(g.fencing_token().get() > 0);
    g.release().await.unwrap();

    for (what, params) in [
        (
            "without the client certificate",
            format!("&ca_file={}", certs.ca.display()),
        ),
        (
            "without the authority",
            format!(
                "&cert_file={}&key_file={}",
                certs.client.0.display(),
                certs.client.1.display()
            ),
        ),
    ] {
        let refused = match RedisProvider::connect(&with(&params)).await {
            Ok(p) => {
                let lock = p
                    .lock(&Names::new().name("tls"), LockOptions::default())
                    .unwrap();
                lock.try_acquire(Duration::from_secs(2)).await.err()
            }
            Err(e) => Some(e),
        };
        assert!(refused.is_some(), "{what}: connected");
    }
    let missing = dir.join("nowhere.pem");
    let e = RedisProvider::connect(&with(&format!("&ca_file={}", missing.display())))
        .await
        .unwrap_err();
    assert!(
        matches!(e, dlock_core::Error::Config { .. }) && e.to_string().contains("nowhere.pem"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cluster user whom the ACL does not let run `PUBSUB` (the probe for sharded pub/sub) but
/// lets lock, publish and subscribe connects with `pubsub=auto`: the refusal means "no
/// sharded pub/sub", as for Redisson, and its waiters are woken by the releases' messages
/// (PUBLISH/SUBSCRIBE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_user_who_may_not_probe_pubsub_connects() {
    let Some(server) = PrivateRedis::start_with(false, None, true).await else {
        return;
    };
    let mut c = admin(&server.url()).await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-pubsub")
        .query_async(&mut c)
        .await
        .unwrap();
    let url = format!(
        "redis://locker:secret@127.0.0.1:{}/?cluster=true&pubsub=auto",
        server.port
    );
    let holder = RedisProvider::connect(&url).await.unwrap();
    let waiter = RedisProvider::connect(&url).await.unwrap();
    let name = Names::new().name("no-probe");
    let held = holder
        .lock(&name, LockOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let lock = waiter.lock(&name, LockOptions::default()).unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await });
    let subscribed = waiter.clone();
    eventually(Duration::from_secs(10), "the waiter subscribed", || {
        let p = subscribed.clone();
        async move {
            match p.subscriptions() {
                1 => Ok(()),
                n => Err(format!("{n} subscriptions")),
            }
        }
    })
    .await;
    let before = waiter.messages_delivered();
    held.release().await.unwrap();
    let g = must(Duration::from_secs(4), "the waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        waiter.messages_delivered() > before,
        "the waiter was not woken by the release's message"
    );
    g.release().await.unwrap();
}
