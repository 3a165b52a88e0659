//! The URL parser's and the builder's tests.

use super::*;

#[test]
fn parses_and_strips_own_parameters() {
    let c =
        RedisConfig::from_url("redis://:pw@127.0.0.1:7000/0?cluster=true&timeout_ms=250").unwrap();
    assert!(c.cluster);
    assert_eq!(c.response_timeout, Duration::from_millis(250));
    assert_eq!(c.url.expose().as_str(), "redis://:pw@127.0.0.1:7000/0");
    assert_eq!(c.store_id(), "redis://127.0.0.1:7000");
    let c = RedisConfig::from_url("redis://127.0.0.1:7000/10").unwrap();
    assert_eq!(c.store_id(), "redis://127.0.0.1:7000/10");
    assert!(!format!("{c:?}").contains("pw@"));
}

#[test]
fn nodelay_is_on_unless_turned_off() {
    let nodelay = |url: &str| RedisConfig::from_url(url).unwrap().nodelay;
    assert!(nodelay("redis://h"));
    assert!(!nodelay("redis://h?nodelay=false"));
    assert!(nodelay("redis://h?nodelay=1"));
    let e = RedisConfig::from_url("redis://h?nodelay=often").unwrap_err();
    assert!(e.to_string().contains("nodelay=\"often\""), "{e}");
    let off = RedisConfig::from_url("redis://h")
        .unwrap()
        .with_nodelay(false);
    assert!(!off.nodelay);
    // On for an application's client too, whatever its own (redis-rs 1's: off).
    let client = redis::Client::open("redis://h").unwrap();
    assert!(RedisConfig::from_client(&client).unwrap().nodelay);
}

#[test]
fn parses_sentinel_urls() {
    let c = RedisConfig::from_url(
        "redis+sentinel://:pw@127.0.0.1:26390,Host-B,[::1]:26392/mymaster/2?timeout_ms=300",
    )
    .unwrap();
    let s = c.sentinel.as_ref().unwrap();
    assert_eq!(
        s.sentinels,
        ["127.0.0.1:26390", "Host-B:26379", "[::1]:26392"]
    );
    assert_eq!(s.master, "mymaster");
    assert_eq!(c.response_timeout, Duration::from_millis(300));
    assert_eq!(c.url.expose().password(), Some("pw"));
    assert_eq!(c.url.expose().path(), "/2");
    assert_eq!(
        c.store_id(),
        "redis+sentinel://127.0.0.1:26390,host-b:26379,[::1]:26392/mymaster/2"
    );
    assert!(!format!("{c:?}").contains("pw@"));
    let c = RedisConfig::from_url("redis+sentinel://h/m").unwrap();
    assert_eq!(c.store_id(), "redis+sentinel://h:26379/m");
}

#[test]
fn rejects_bad_sentinel_urls_without_leaking_the_password() {
    dlock_conformance::refuses_urls(
        RedisConfig::from_url,
        &[
            "redis+sentinel://:secret@h1,h2",
            "redis+sentinel://:secret@h1,h2/",
            "redis+sentinel://:secret@h1,,h2/m",
            "redis+sentinel://:secret@h1:0/m",
            "redis+sentinel://:secret@h1/m/x",
            "redis+sentinel://:secret@h1/m a",
            "redis+sentinel://:secret@/m",
            "redis+sentinel://:secret@h1/m?cluster=true",
            "redis+sentinel://:secret@h1/m?sentinel=x",
            "rediss+sentinel://:secret@h1/m",
        ],
    );
}

#[test]
fn a_config_from_a_client_keeps_its_settings_and_hides_the_password() {
    let client = redis::Client::open("redis://:secret@Example.COM:6380/3").unwrap();
    let c = RedisConfig::from_client(&client).unwrap();
    assert_eq!(c.store_id(), "redis://example.com:6380/3");
    let shown = format!("{c:?} {}", c.url);
    assert!(!shown.contains("secret"), "{shown}");
    let info = &c.client.as_ref().unwrap().0;
    assert_eq!(info.redis_settings().password(), Some("secret"));
    assert_eq!(info.redis_settings().db(), 3);
    let c = c
        .with_wait_replicas(1)
        .with_response_timeout(Duration::from_secs(1));
    assert_eq!(c.wait_replicas, WaitReplicas::AtLeast(1));
    assert_eq!(
        RedisConfig::from_client(&client).unwrap().wait_replicas,
        WaitReplicas::Auto
    );
}

#[test]
fn wait_replicas_is_auto_by_default_and_reads_a_number_or_auto() {
    let wait = |url: &str| RedisConfig::from_url(url).map(|c| c.wait_replicas);
    assert_eq!(wait("redis://h").unwrap(), WaitReplicas::Auto);
    assert_eq!(
        wait("redis://h?wait_replicas=auto").unwrap(),
        WaitReplicas::Auto
    );
    assert_eq!(
        wait("redis://h?wait_replicas=2").unwrap(),
        WaitReplicas::AtLeast(2)
    );
    assert_eq!(
        wait("redis://h?wait_replicas=0").unwrap(),
        WaitReplicas::AtLeast(0)
    );
    assert_eq!(
        wait("redis://h?cluster=true&wait_replicas=auto").unwrap(),
        WaitReplicas::Auto
    );
    assert!(wait("redis://h?cluster=true&wait_replicas=1").is_err());
    assert!(wait("redis://h?wait_replicas=some").is_err());
}

#[test]
fn rejects_bad_urls_without_leaking_the_password() {
    dlock_conformance::refuses_urls(
        RedisConfig::from_url,
        &[
            "http://127.0.0.1",
            "redis://",
            "redis://:secret@h?cluster=maybe",
            "redis://:secret@h?timeout_ms=0",
            "redis://:secret@h?protocol=resp2",
            "redis://:secret@h?clustr=true",
            "redis://:secret@h?cluster=true&pubsub=shard",
            // Sharded pub/sub is a cluster's: a single server would not hear Redisson.
            "redis://:secret@h?pubsub=sharded",
            "redis://:secret@[::1",
        ],
    );
}

/// `ca_file`, `cert_file` and `key_file` belong to `rediss://`, the last two together;
/// the paths are decoded once.
#[test]
fn rediss_takes_its_files() {
    let c = RedisConfig::from_url(
        "rediss://:secret@h:1/0?ca_file=/etc/c%20a.pem&cert_file=/c.pem&key_file=/k.pem",
    )
    .unwrap();
    assert_eq!(
        c.tls.ca_file,
        Some(std::path::PathBuf::from("/etc/c a.pem"))
    );
    assert_eq!(c.tls.identity, Some(("/c.pem".into(), "/k.pem".into())));
    assert!(!c.url.expose().as_str().contains("ca_file"));
    assert!(RedisConfig::from_url("rediss://h").unwrap().tls.is_empty());
    // `+` is a `+` in a path, as etcds:// reads it.
    let c = RedisConfig::from_url("rediss://h?ca_file=/a+b.pem").unwrap();
    assert_eq!(c.tls.ca_file, Some(std::path::PathBuf::from("/a+b.pem")));
    let c = RedisConfig::from_url("rediss://h?ca%5Ffile=/c.pem").unwrap();
    assert_eq!(c.tls.ca_file, Some(std::path::PathBuf::from("/c.pem")));
    // Files set by hand where they cannot apply are refused on connect's check.
    let mut plain = RedisConfig::from_url("redis://h").unwrap();
    plain.tls.ca_file = Some("/ca.pem".into());
    assert!(
        plain
            .checked()
            .unwrap_err()
            .to_string()
            .contains("rediss://")
    );
    for (bad, says) in [
        ("redis://:secret@h?ca_file=/x.pem", "use rediss://"),
        ("rediss://:secret@h?cert_file=/c.pem", "go together"),
        ("rediss://:secret@h?key_file=", "file path"),
        ("rediss://:secret@h?ca_file=/a%zz", "malformed"),
        ("redis+sentinel://:secret@s1/m?ca_file=/a.pem", "Sentinel"),
    ] {
        let e = RedisConfig::from_url(bad).unwrap_err().to_string();
        assert!(e.contains(says) && !e.contains("secret"), "{bad}: {e}");
    }
}

#[test]
fn pubsub_mode() {
    let c = RedisConfig::from_url("redis://h:7000?cluster=true").unwrap();
    assert_eq!(c.pubsub, PubSubMode::Auto);
    for (mode, want) in [
        ("auto", PubSubMode::Auto),
        ("sharded", PubSubMode::Sharded),
        ("classic", PubSubMode::Classic),
    ] {
        let c =
            RedisConfig::from_url(&format!("redis://h:7000?cluster=true&pubsub={mode}")).unwrap();
        assert_eq!(c.pubsub, want, "{mode}");
    }
    // Classic on a single server is what it uses anyway.
    assert!(RedisConfig::from_url("redis://h?pubsub=classic").is_ok());
}

#[test]
fn sentinel_credentials() {
    let c = RedisConfig::from_url(
        "redis+sentinel://:master-pw@h1,h2/m?sentinel_username=sen&sentinel_password=s%26cret",
    )
    .unwrap();
    let auth = c.sentinel.as_ref().unwrap().auth.as_ref().unwrap();
    assert_eq!(auth.username.as_deref(), Some("sen"));
    assert_eq!(auth.password, "s&cret");
    let shown = format!("{c:?} {}", c.store_id());
    assert!(
        !shown.contains("cret") && !shown.contains("master-pw"),
        "{shown}"
    );
    dlock_conformance::refuses_urls(
        RedisConfig::from_url,
        &[
            "redis://h?sentinel_password=secret",
            "redis+sentinel://h/m?sentinel_username=sen",
        ],
    );
}
