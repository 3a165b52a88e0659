//! The store under attack, read from its URL: which servers a worker's proxies stand in front
//! of, and which faults can hit it.

use std::time::Duration;

use super::TortureOpts;
use super::history::FaultKind;

/// Whether a store's clients learn the data servers' addresses from the servers (a Redis
/// Cluster, a Sentinel group), past any proxy: such a store gets the process faults and
/// restarts only. Read from the parsed URL, as the Redis backend reads it.
pub(super) fn learns_addresses(url: &str) -> bool {
    let Ok(parsed) = url::Url::parse(url) else {
        return false;
    };
    match parsed.scheme() {
        "redis+sentinel" | "rediss+sentinel" => true,
        "redis" | "rediss" => parsed
            .query_pairs()
            .any(|(k, v)| k == "cluster" && matches!(&*v, "true" | "1" | "yes")),
        _ => false,
    }
}

/// Whether the store at `url` keeps its holds when its server restarts (a crash, a
/// failover): MariaDB/MySQL, SQLite, ZooKeeper and etcd write every change to disk before
/// they answer. Redis is taken as not: it keeps nothing across a crash without AOF, as
/// `scripts/services` starts it, and a Sentinel failover promotes a replica that was copied
/// asynchronously; whether a given server has AOF on is not in its URL. Nor is PostgreSQL:
/// `scripts/services` starts it with `synchronous_commit=off`, so a crash may lose the last
/// commits (a grant among them). A memory store lives in its process. On a durable store a
/// restart explains no overlap.
pub(super) fn durable(url: &str) -> bool {
    let scheme = url.split_once(':').map_or(url, |(scheme, _)| scheme);
    !matches!(
        scheme,
        "redis"
            | "rediss"
            | "redis+sentinel"
            | "rediss+sentinel"
            | "memory"
            | "postgres"
            | "postgresql"
    )
}

/// The URL parameter that sets the session of a session store (ZooKeeper's
/// `session_timeout_ms`, etcd's `ttl_s`), if `url` sets one.
pub(super) fn session_override(url: &str) -> Option<&'static str> {
    let key = session_key(url)?.0;
    query(url).any(|(k, _)| k == key).then_some(key)
}

/// The URL parameter that sets the session of a session store, its unit and its default.
fn session_key(url: &str) -> Option<(&'static str, Duration, Duration)> {
    match url.split_once("://")?.0 {
        "zk" => Some(("session_timeout_ms", Duration::from_millis(1), ZK_SESSION)),
        "etcd" | "etcds" => Some(("ttl_s", Duration::from_secs(1), ETCD_TTL)),
        _ => None,
    }
}

/// The query pairs of `url`, read without parsing its authority (`url::Url` refuses the host
/// lists of an ensemble or a cluster).
fn query(
    url: &str,
) -> impl Iterator<Item = (std::borrow::Cow<'_, str>, std::borrow::Cow<'_, str>)> {
    let q = url.split_once('?').map_or("", |(_, q)| q);
    url::form_urlencoded::parse(q.split('#').next().unwrap_or("").as_bytes())
}

/// How long the store keeps a hold whose holder went silent, at most, counted from the
/// holder's last word: the session of a session store (a ZooKeeper session, an etcd lease:
/// its holds live in it, however long the watchdog lease is), the watchdog `lease` on every
/// other store. Faults are scaled to it, and the checker's bounds count from it.
pub(super) fn span(url: &str, lease: Duration) -> Duration {
    let Some((key, unit, default)) = session_key(url) else {
        return lease;
    };
    query(url)
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse::<u32>().ok())
        .map_or(default, |n| unit.saturating_mul(n))
}

/// ZooKeeper's default session timeout (that of the backend, when it is built in).
#[cfg(feature = "zookeeper")]
const ZK_SESSION: Duration = dlock_zookeeper::DEFAULT_SESSION_TIMEOUT;
#[cfg(not(feature = "zookeeper"))]
const ZK_SESSION: Duration = Duration::from_secs(10);

/// etcd's default lease time-to-live (that of the backend, when it is built in).
#[cfg(feature = "etcd")]
const ETCD_TTL: Duration = dlock_etcd::DEFAULT_LEASE_TTL;
#[cfg(not(feature = "etcd"))]
const ETCD_TTL: Duration = Duration::from_secs(10);

/// A URL split around its host list: the head, the `host:port`s, the rest ([`hosts`]).
pub(super) type Split = (String, Vec<String>, String);

/// The proxy split of `url` (`None`: no proxies) and the requested faults that can hit it.
pub(super) fn applicable(opts: &TortureOpts, url: &str) -> (Option<Split>, Vec<FaultKind>) {
    let split = hosts(url).filter(|_| !learns_addresses(url));
    let kinds = opts
        .faults
        .iter()
        .copied()
        .filter(|k| split.is_some() || !k.needs_proxy())
        .collect();
    (split, kinds)
}

/// Splits `scheme://[userinfo@]host:port[,host:port...][/rest]` into the head before the
/// hosts, the host:port list (with the scheme's default port filled in) and the rest.
fn hosts(url: &str) -> Option<Split> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let default = match scheme {
        "redis" | "rediss" => 6379,
        "mysql" | "mariadb" => 3306,
        "zk" => 2181,
        "postgres" | "postgresql" => 5432,
        "etcd" | "etcds" => 2379,
        _ => return None,
    };
    // A list the store's own parser would refuse is left unproxied; the store says why.
    let hosts = dlock::backend::parse_host_list(hostlist, default).ok()?;
    Some((format!("{scheme}://{userinfo}"), hosts, tail.to_owned()))
}

/// A store of its own for worker `i` (the no-exclusion sabotage of an embedded store).
pub(super) fn private_store(url: &str, i: u32) -> String {
    match url.split_once('?') {
        Some((path, query)) => format!("{path}.w{i}?{query}"),
        None => format!("{url}.w{i}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_proxyable_hosts() {
        let (head, list, tail) = hosts("mysql://u:p@db.example/app?strategy=x").unwrap();
        assert_eq!(head, "mysql://u:p@");
        assert_eq!(list, ["db.example:3306"]);
        assert_eq!(tail, "/app?strategy=x");
        let (_, list, tail) = hosts("zk://a:1,b,[::1]:3/chroot").unwrap();
        assert_eq!(list, ["a:1", "b:2181", "[::1]:3"]);
        assert_eq!(tail, "/chroot");
        assert!(hosts("sqlite:///tmp/x.db").is_none());
        assert!(hosts("redis://h").is_some_and(|(_, l, _)| l == ["h:6379"]));
    }

    #[test]
    fn only_redis_postgres_and_memory_stores_may_forget_holds_in_a_restart() {
        for url in [
            "redis://h",
            "rediss://h",
            "redis+sentinel://s/m",
            "memory://",
            "postgres://h/db",
        ] {
            assert!(!durable(url), "{url}");
        }
        for url in [
            "sqlite:///tmp/x.db",
            "mysql://u:p@h/db",
            "zk://h:2181",
            "etcd://h:2379",
        ] {
            assert!(durable(url), "{url}");
        }
    }

    #[test]
    fn session_stores_are_judged_by_their_session() {
        let lease = Duration::from_secs(30);
        assert_eq!(span("redis://h", lease), lease);
        assert_eq!(span("mysql://u:p@h/db", lease), lease);
        assert_eq!(span("zk://h:2181", lease), Duration::from_secs(10));
        assert_eq!(
            span("zk://h:2181/x?session_timeout_ms=2000", lease),
            Duration::from_secs(2)
        );
        assert_eq!(span("etcd://h", lease), Duration::from_secs(10));
        assert_eq!(span("etcd://h/p?ttl_s=2", lease), Duration::from_secs(2));
        // Host lists, which `url::Url` cannot parse.
        assert_eq!(
            span("zk://h:1,h:2,h:3/c?session_timeout_ms=3000", lease),
            Duration::from_secs(3)
        );
        assert_eq!(span("zk://h:1,h:2,h:3", lease), Duration::from_secs(10));
        assert_eq!(
            span("etcd://h:1,h:2?ttl_s=4", lease),
            Duration::from_secs(4)
        );
        assert_eq!(
            session_override("zk://h:1,h:2?session_timeout_ms=1"),
            Some("session_timeout_ms")
        );
        assert_eq!(
            session_override("zk://h?session_timeout_ms=1"),
            Some("session_timeout_ms")
        );
        assert_eq!(session_override("etcd://h?ttl_s=2"), Some("ttl_s"));
        assert_eq!(session_override("zk://h"), None);
        assert_eq!(session_override("redis://h?ttl_s=2"), None);
    }

    #[test]
    fn clusters_and_sentinel_groups_are_read_from_the_url() {
        for url in [
            "redis://h:7000?cluster=true",
            "redis://h:7000/?cluster=1",
            "rediss://h:7000?timeout_ms=5&cluster=yes",
            "redis+sentinel://s1,s2/master",
        ] {
            assert!(learns_addresses(url), "{url}");
        }
        for url in [
            "redis://h:7000?cluster=false",
            "mysql://u:p@sentinel-db/app",
            "redis://u:cluster=true@h",
            "zk://sentinel:2181",
        ] {
            assert!(!learns_addresses(url), "{url}");
        }
    }
}
