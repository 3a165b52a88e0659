//! `redis://` and `rediss://` URLs and the builder.

use std::time::Duration;

use dlock_core::{Error, RedactedUrl, Result};

/// How to reach Redis. Build it from a URL with [`RedisConfig::from_url`] or field by field;
/// `Debug` and `Display` never show the password.
///
/// URL: `redis[s]://[[user]:password@]host[:port][/db][?cluster=true&timeout_ms=N]`
///
/// | query parameter | meaning | default |
/// | --- | --- | --- |
/// | `cluster` | `true`: the host is a seed of a Redis Cluster | `false` |
/// | `timeout_ms` | response timeout of each server call, in milliseconds | `5000` |
/// | `fair_wait_ms` | how long a queued fair waiter has to take its turn before others skip it (Redisson's `fairLockWaitTimeout`) | `300000` |
/// | `wait_replicas` | replicas that must acknowledge a grant (`WAIT`) before `acquire` returns it; single server only | `0` |
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The server URL as given, less dlock's own query parameters.
    pub url: RedactedUrl,
    /// Whether the URL names a seed node of a Redis Cluster.
    pub cluster: bool,
    /// Response timeout of each server call.
    pub response_timeout: Duration,
    /// How long a queued fair waiter has to take its turn (Redisson's `fairLockWaitTimeout`).
    pub fair_wait: Duration,
    /// Replicas that must acknowledge a grant before `acquire` returns it (`WAIT`, within half
    /// the response timeout); if fewer do, the grant is given back and the acquire fails with
    /// a retryable error. A failover to an acknowledging replica then cannot hand the lock and
    /// an equal or lower fencing token to someone else. `0` (the default) does not wait.
    /// Single server only (a replica set behind one master); refused for a cluster.
    pub wait_replicas: u32,
}

impl RedisConfig {
    /// Parses a `redis://` or `rediss://` URL.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for another scheme, a missing host, or a bad or unknown query
    /// parameter. The message never contains the password.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = RedactedUrl::parse(url)?;
        if !crate::SCHEMES.contains(&parsed.scheme()) {
            return Err(Error::config(format!(
                "the redis backend takes redis:// or rediss:// URLs, not {}://",
                parsed.scheme()
            )));
        }
        if parsed.expose().host_str().is_none_or(str::is_empty) {
            return Err(Error::config(format!("{parsed}: a redis URL needs a host")));
        }
        let mut cluster = false;
        let mut response_timeout = Duration::from_secs(5);
        let mut fair_wait = crate::DEFAULT_FAIR_WAIT;
        let mut wait_replicas = 0;
        for (key, value) in parsed.query_pairs() {
            match key.as_str() {
                "cluster" => {
                    cluster = match value.as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        other => {
                            return Err(Error::config(format!(
                                "cluster={other:?}: expected true or false"
                            )));
                        }
                    }
                }
                "timeout_ms" => response_timeout = positive_ms(&key, &value)?,
                "fair_wait_ms" => fair_wait = positive_ms(&key, &value)?,
                "wait_replicas" => {
                    wait_replicas = value.parse().map_err(|_| {
                        Error::config(format!(
                            "wait_replicas={value:?}: expected a number of replicas"
                        ))
                    })?;
                }
                "protocol" => {
                    return Err(Error::config(
                        "protocol= is chosen by dlock (RESP3 for its subscriptions); remove it",
                    ));
                }
                other => {
                    // A typo (`clustr=true`) must not silently mean something else.
                    return Err(Error::config(format!(
                        "unknown query parameter {other:?} (known: cluster, timeout_ms, \
                         fair_wait_ms, wait_replicas)"
                    )));
                }
            }
        }
        let mut stripped = parsed.expose().clone();
        stripped.set_query(None);
        let url = RedactedUrl::parse(stripped.as_str())?;
        Self {
            url,
            cluster,
            response_timeout,
            fair_wait,
            wait_replicas,
        }
        .checked()
    }

    /// Refuses combinations dlock cannot keep.
    pub(crate) fn checked(self) -> Result<Self> {
        if self.cluster && self.wait_replicas > 0 {
            return Err(Error::config(
                "wait_replicas is not supported on a Redis Cluster yet (WAIT must reach each \
                 key's master); use it with a single server and its replicas",
            ));
        }
        Ok(self)
    }

    /// Sets how many replicas must acknowledge a grant before `acquire` returns it.
    pub fn with_wait_replicas(mut self, replicas: u32) -> Self {
        self.wait_replicas = replicas;
        self
    }

    /// Sets whether the URL names a cluster seed.
    pub fn with_cluster(mut self, cluster: bool) -> Self {
        self.cluster = cluster;
        self
    }

    /// Sets the response timeout.
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Sets the fair-lock wait.
    pub fn with_fair_wait(mut self, wait: Duration) -> Self {
        self.fair_wait = wait;
        self
    }

    /// The store id: the URL without credentials or query.
    pub(crate) fn store_id(&self) -> String {
        self.url.store_id()
    }
}

fn positive_ms(key: &str, value: &str) -> Result<Duration> {
    value
        .parse::<u64>()
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| Error::config(format!("{key}={value:?}: expected a positive integer")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_strips_own_parameters() {
        let c = RedisConfig::from_url("redis://:pw@127.0.0.1:7000/0?cluster=true&timeout_ms=250")
            .unwrap();
        assert!(c.cluster);
        assert_eq!(c.response_timeout, Duration::from_millis(250));
        assert_eq!(c.url.expose().as_str(), "redis://:pw@127.0.0.1:7000/0");
        assert_eq!(c.store_id(), "redis://127.0.0.1:7000/0");
        assert!(!format!("{c:?}").contains("pw@"));
    }

    #[test]
    fn rejects_bad_urls_without_leaking_the_password() {
        for bad in [
            "http://127.0.0.1",
            "redis://",
            "redis://:secret@h?cluster=maybe",
            "redis://:secret@h?timeout_ms=0",
            "redis://:secret@h?protocol=resp2",
            "redis://:secret@h?clustr=true",
            "redis://:secret@[::1",
        ] {
            let e = RedisConfig::from_url(bad).unwrap_err();
            assert!(matches!(e, Error::Config { .. }), "{bad}: {e}");
            assert!(!e.to_string().contains("secret"), "{bad}: {e}");
        }
    }
}
