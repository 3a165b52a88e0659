//! Mapping the client library's errors into the core error, with retryability.

use dlock_core::Error;
use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

use crate::consts::BACKEND;

/// What a connection reaches, as far as an error's meaning depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// One server at a fixed address: nothing moves the connection to another server.
    Single,
    /// A master found through Sentinel, or a cluster: a failover moves the connection.
    FollowsFailovers,
}

/// Converts a `redis` error at the crate boundary.
///
/// Connection drops, timeouts, `LOADING`, `READONLY` (a failover demoted the node), `MOVED`,
/// `ASK`, `TRYAGAIN` and `CLUSTERDOWN` are retryable; a script or type error is not.
pub(crate) fn from_redis(what: &str, e: RedisError) -> Error {
    let retryable = !matches!(e.retry_method(), RetryMethod::NoRetry);
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        return Error::connection(BACKEND, format!("{what}: {e}"), e);
    }
    Error::backend(BACKEND, format!("{what}: {e}"), retryable, e)
}

/// [`from_redis`] for a command that ran through a connection reaching `reach`.
///
/// `READONLY` from a single server is not retryable: that server is a replica and stays one
/// for the connection (redis-rs reconnects to the same address, and only after a connection
/// error), so waiting cannot help and would pass for "held by someone". Through Sentinel or a
/// cluster it means a failover in progress, which the connection follows.
pub(crate) fn from_redis_on(reach: Reach, what: &str, e: RedisError) -> Error {
    if reach == Reach::Single && e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
        return Error::backend(
            BACKEND,
            format!(
                "{what}: the server is a read-only replica (READONLY), which refuses every \
                 lock write; point the URL at the master, or use redis+sentinel:// to follow \
                 the master across failovers"
            ),
            false,
            e,
        );
    }
    from_redis(what, e)
}

/// A reply of a shape the scripts never produce: reported, not panicked on.
pub(crate) fn unexpected(what: &str, reply: impl std::fmt::Debug) -> Error {
    Error::backend_failed(
        BACKEND,
        format!("{what}: unexpected reply {reply:?}"),
        false,
    )
}

/// The key of `name` is another kind's: a script answered `{-6, type}` before changing
/// anything. `lock` says whether the refused request was for a lock (else a permit).
pub(crate) fn other_kind(name: &str, key_type: &str, lock: bool) -> Error {
    let held = match key_type {
        "string" => "a semaphore (its permit counter; dlock's or Redisson's RSemaphore / \
                     RPermitExpirableSemaphore layout)"
            .to_owned(),
        "hash" => "a lock (a mutex or read-write lock hash; dlock's or Redisson's RLock / \
                   RReadWriteLock layout)"
            .to_owned(),
        other => format!("a Redis {other}, which is neither a lock nor a semaphore"),
    };
    let wanted = if lock { "a lock" } else { "a semaphore permit" };
    Error::invalid_argument(
        "name",
        format!(
            "redis key {name:?} holds {held}; {wanted} of the same name cannot be taken while \
             that key exists (kinds on one name exclude each other, and this one cannot wait \
             for the other)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_server_errors() {
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "LOADING"));
        assert!(from_redis("acquire", loading).is_retryable());
        let script =
            RedisError::from((ErrorKind::Server(ServerErrorKind::ResponseError), "ERR bad"));
        assert!(!from_redis("acquire", script).is_retryable());
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(
            from_redis("acquire", io),
            Error::Connection { .. }
        ));
    }

    /// A single server that answers READONLY is a replica for good: a clear error that no
    /// retry can cure. Through Sentinel or a cluster it is a failover in progress.
    #[test]
    fn readonly_is_final_on_a_single_server_and_retryable_behind_failover() {
        let readonly = || {
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::ReadOnly),
                "You can't write against a read only replica.",
            ))
        };
        let single = from_redis_on(Reach::Single, "acquire", readonly());
        assert!(!single.is_retryable(), "{single}");
        assert!(matches!(single, Error::Backend { .. }), "{single:?}");
        let text = single.to_string();
        assert!(
            text.contains("read-only replica") && text.contains("master"),
            "{text}"
        );
        let moving = from_redis_on(Reach::FollowsFailovers, "acquire", readonly());
        assert!(moving.is_retryable(), "{moving}");
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "LOADING"));
        assert!(from_redis_on(Reach::Single, "acquire", loading).is_retryable());
    }
}
