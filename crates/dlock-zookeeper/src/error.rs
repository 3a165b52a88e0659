//! Mapping the client library's errors into the core error, with retryability.

use dlock_core::{Error, LockName};
use zookeeper_client as zk;

use crate::BACKEND;

/// Whether the call may succeed if made again on the same session: the connection broke (the
/// client reconnects by itself) or the server was busy.
pub(crate) fn is_transient(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::ConnectionLoss
            | zk::Error::Timeout
            | zk::Error::Throttled
            // The client reports transport failures (connection reset, no response) of
            // requests in flight this way, e.g. when the leader of an ensemble dies.
            | zk::Error::Custom(_)
    )
}

/// Whether the error is the server's answer to the request (a refusal such as `NoNode` or
/// `NodeExists`), as opposed to no answer at all (a connection loss, a timeout, an expired or
/// closed session, a request the client never sent). An answer proves the server heard the
/// session when the request reached it.
pub(crate) fn is_answer(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::NoNode
            | zk::Error::NodeExists
            | zk::Error::NotEmpty
            | zk::Error::BadVersion
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::NoAuth
            | zk::Error::InvalidAcl
    )
}

/// Converts a `zookeeper-client` error met while acquiring (or connecting).
///
/// Connection loss, timeouts and an expired or closed session are retryable
/// [`Error::Connection`]s (a retry runs on a fresh session); refusals such as `NoAuth`,
/// `BadArguments` or `InvalidAcl` are non-retryable [`Error::Backend`]s.
pub(crate) fn from_zk(what: &str, e: zk::Error) -> Error {
    let message = format!("{what}: {e}");
    match e {
        zk::Error::ConnectionLoss
        | zk::Error::Timeout
        | zk::Error::NoHosts
        | zk::Error::SessionExpired
        | zk::Error::SessionMoved
        | zk::Error::ClientClosed
        | zk::Error::Custom(_) => Error::connection(BACKEND, message, e),
        zk::Error::Throttled | zk::Error::NotReadOnly => Error::backend(BACKEND, message, true, e),
        _ => Error::backend(BACKEND, message, false, e),
    }
}

/// Converts an error met on behalf of a hold: the node being gone, or the session that owned
/// it having expired, means the hold is lost.
pub(crate) fn for_hold(name: &LockName, what: &str, e: zk::Error) -> Error {
    match e {
        zk::Error::NoNode | zk::Error::SessionExpired => Error::lock_lost(name),
        e => from_zk(what, e),
    }
}

/// Something the server never answers, reported rather than panicked on.
pub(crate) fn unexpected(what: impl std::fmt::Display) -> Error {
    Error::backend_failed(BACKEND, what, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert!(matches!(
            from_zk("create", zk::Error::ConnectionLoss),
            Error::Connection { .. }
        ));
        assert!(from_zk("create", zk::Error::SessionExpired).is_retryable());
        assert!(from_zk("create", zk::Error::Throttled).is_retryable());
        assert!(!from_zk("create", zk::Error::NoAuth).is_retryable());
        assert!(!from_zk("create", zk::Error::BadArguments(&"x")).is_retryable());
        let name = LockName::new("a").unwrap();
        assert!(matches!(
            for_hold(&name, "delete", zk::Error::SessionExpired),
            Error::LockLost { .. }
        ));
        assert!(matches!(
            for_hold(&name, "delete", zk::Error::NoNode),
            Error::LockLost { .. }
        ));
        assert!(for_hold(&name, "delete", zk::Error::ConnectionLoss).is_retryable());
        assert!(is_transient(&zk::Error::ConnectionLoss));
        assert!(is_answer(&zk::Error::NoNode) && is_answer(&zk::Error::NodeExists));
        for silent in [
            zk::Error::ConnectionLoss,
            zk::Error::Timeout,
            zk::Error::SessionExpired,
            zk::Error::ClientClosed,
            zk::Error::BadArguments(&"x"),
        ] {
            assert!(!is_answer(&silent), "{silent:?}");
        }
        assert!(!is_transient(&zk::Error::SessionExpired));
    }
}
