//! Connecting to a member that asks more than an address: TLS with a private CA and a client
//! certificate, and authentication whose token ends.

use std::time::Duration;

use dlock_conformance::tls::{make_certificates, openssl};
use dlock_conformance::{Names, eventually, must, service_url};
use dlock_core::{LockOptions, LockProvider};
use dlock_etcd::EtcdProvider;
use dlock_etcd::etcd_client::Client;

use crate::support::member::PrivateMember;

/// `etcds://`: a private etcd member of this test's own that serves TLS only and asks every
/// client for a certificate its CA signed. With the CA and the client certificate, locks
/// work; without the client certificate, without the CA (the public roots do not know it),
/// or over plain `etcd://`, connecting fails with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_with_a_private_ca_and_a_client_certificate() {
    // The member is this test's own, but it runs Debian's etcd like the shared ones.
    if service_url("DLOCK_ETCD_URL").is_none() {
        return;
    }
    let member = PrivateMember::start_tls(
        "tls",
        &[
            "--cert-file",
            "{dir}/server.pem",
            "--key-file",
            "{dir}/server.key",
            "--client-cert-auth",
            "--trusted-ca-file",
            "{dir}/ca.pem",
        ],
        |dir| drop(make_certificates(dir)),
    );
    let (at, file) = (member.endpoint(), |f: &str| member.file(f));

    let url = format!(
        "etcds://{at}?ca_file={}&cert_file={}&key_file={}&connect_timeout_ms=2000",
        file("ca.pem"),
        file("client.pem"),
        file("client.key")
    );
    let p = eventually(
        Duration::from_secs(30),
        "a TLS connection to the member",
        || {
            let url = url.clone();
            async move { EtcdProvider::connect(&url).await.map_err(|e| e.to_string()) }
        },
    )
    .await;
    assert!(p.config().tls.is_some());
    let lock = p
        .lock(&Names::new().name("tls"), LockOptions::default())
        .unwrap();
    let g = lock.acquire().await.unwrap();
    assert!(g.fencing_token().get() > 0);
    assert!(
        lock.try_acquire(Duration::ZERO).await.unwrap().is_none() || g.is_held(),
        "held"
    );
    g.release().await.unwrap();

    for (what, bad) in [
        (
            "without the client certificate",
            format!(
                "etcds://{at}?ca_file={}&connect_timeout_ms=2000",
                file("ca.pem")
            ),
        ),
        (
            "without the CA",
            format!(
                "etcds://{at}?cert_file={}&key_file={}&connect_timeout_ms=2000",
                file("client.pem"),
                file("client.key")
            ),
        ),
        (
            "over plain etcd://",
            format!("etcd://{at}?connect_timeout_ms=2000"),
        ),
    ] {
        let r = must(Duration::from_secs(20), what, EtcdProvider::connect(&bad)).await;
        match r {
            Ok(_) => panic!("{what}: connected"),
            Err(e) => eprintln!("{what}: {e}"),
        }
    }
    let missing = format!("etcds://{at}?ca_file={}", file("nope.pem"));
    let e = EtcdProvider::connect(&missing).await.unwrap_err();
    assert!(matches!(e, dlock_core::Error::Config { .. }), "{e}");
    assert!(e.to_string().contains("nope.pem"), "{e}");
}

/// With authentication on, a client's token ends (a JWT after its time-to-live, here 2 s; a
/// simple token when its member restarts): the provider logs in again, so its calls go on
/// rather than failing as `Unauthenticated` for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_logs_in_again_when_its_token_ends() {
    if service_url("DLOCK_ETCD_URL").is_none() {
        return;
    }
    let member = PrivateMember::start(
        "auth",
        &["--auth-token=jwt,pub-key={dir}/jwt.pub,priv-key={dir}/jwt.key,sign-method=ES256,ttl=2s"],
        |dir| {
            openssl(
                dir,
                &[
                    "ecparam",
                    "-name",
                    "prime256v1",
                    "-genkey",
                    "-noout",
                    "-out",
                    "jwt.key",
                ],
            );
            openssl(dir, &["ec", "-in", "jwt.key", "-pubout", "-out", "jwt.pub"]);
        },
    );
    member.await_serving().await;
    member.etcdctl(&["user", "add", "root:dlock-root-pw"]).await;
    member.etcdctl(&["auth", "enable"]).await;

    let url = format!("etcd://root:dlock-root-pw@{}", member.endpoint());
    let p = EtcdProvider::connect(&url).await.unwrap();
    let lock = p
        .lock(&Names::new().name("auth"), LockOptions::default())
        .unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    // A client that logged in with the provider, and never again: once its calls are
    // refused, the token the provider got at the same time has ended too.
    let options = dlock_etcd::etcd_client::ConnectOptions::new().with_user("root", "dlock-root-pw");
    let mut witness = Client::connect([member.endpoint()], Some(options))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the tokens end", || {
        let mut w = witness.clone();
        async move {
            match w.get("x", None).await {
                Err(e) => Ok(e.to_string()),
                Ok(_) => Err("still accepted"),
            }
        }
    })
    .await;
    let _ = witness.get("x", None).await;
    let g = must(
        Duration::from_secs(10),
        "an acquire after the token ended",
        lock.try_acquire(Duration::from_secs(5)),
    )
    .await
    .unwrap_or_else(|e| panic!("after the token ended: {e}"))
    .expect("the lock is free");
    g.release().await.unwrap();
}
