//! Mapping the client library's errors into the core error, with retryability.

use dlock_core::Error;
use redis::{RedisError, RetryMethod};

use crate::BACKEND;

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

/// A reply of a shape the scripts never produce: reported, not panicked on.
pub(crate) fn unexpected(what: &str, reply: impl std::fmt::Debug) -> Error {
    Error::Backend {
        backend: BACKEND,
        message: format!("{what}: unexpected reply {reply:?}"),
        retryable: false,
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{ErrorKind, ServerErrorKind};

    #[test]
    fn classifies_server_errors() {
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "LOADING"));
        assert!(from_redis("acquire", loading).is_retryable());
        let readonly = RedisError::from((ErrorKind::Server(ServerErrorKind::ReadOnly), "READONLY"));
        assert!(from_redis("acquire", readonly).is_retryable());
        let script =
            RedisError::from((ErrorKind::Server(ServerErrorKind::ResponseError), "ERR bad"));
        assert!(!from_redis("acquire", script).is_retryable());
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(
            from_redis("acquire", io),
            Error::Connection { .. }
        ));
    }
}
