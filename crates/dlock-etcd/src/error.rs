//! Mapping the client library's errors into the core error, with retryability.

use dlock_core::Error;
use etcd_client::Error as EtcdError;
use tonic::Code;

use crate::BACKEND;

/// What the client library says when a keep-alive stream it opens finds the lease gone (the
/// server's first answer has a time-to-live of 0).
const KEEPER_FOUND_NO_LEASE: &str = "lease not found";

/// Whether a call that failed this way may succeed if made again: the transport failed, the
/// member had no leader (an election), or the server was busy. A full database is not
/// transient: it refuses writes until an operator frees space.
pub(crate) fn is_transient(e: &EtcdError) -> bool {
    match e {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => true,
        EtcdError::GRpcStatus(_) if is_no_space(e) => false,
        EtcdError::GRpcStatus(s) => matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::ResourceExhausted
                | Code::Unknown
                | Code::Cancelled
        ),
        EtcdError::LeaseKeepAliveError(_) => !is_lease_gone(e),
        EtcdError::WatchError(_) => true,
        _ => false,
    }
}

/// Whether the server said the lease does not exist (it expired or was revoked): in a call's
/// answer, or in the first answer of a keep-alive stream opened for it.
pub(crate) fn is_lease_gone(e: &EtcdError) -> bool {
    match e {
        EtcdError::GRpcStatus(s) => {
            s.code() == Code::NotFound && s.message().contains("lease not found")
        }
        EtcdError::LeaseKeepAliveError(m) => m == KEEPER_FOUND_NO_LEASE,
        _ => false,
    }
}

/// Whether the server refused a write because its database reached its quota (etcd's NOSPACE
/// alarm, "etcdserver: mvcc: database space exceeded"): it refuses every write and every
/// lease grant until an operator compacts, defragments and disarms the alarm.
pub(crate) fn is_no_space(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(s)
        if s.code() == Code::ResourceExhausted && s.message().contains("database space exceeded"))
}

/// The core error for a failed call, saying what was attempted.
pub(crate) fn from_etcd(what: &str, e: EtcdError) -> Error {
    let message = format!("{what}: {e}");
    match &e {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => {
            Error::connection(BACKEND, message, e)
        }
        EtcdError::GRpcStatus(s) if s.code() == Code::Unavailable => {
            Error::connection(BACKEND, message, e)
        }
        EtcdError::GRpcStatus(s) if s.code() == Code::Unauthenticated => {
            Error::backend(BACKEND, message, false, e)
        }
        _ if is_no_space(&e) => Error::backend(
            BACKEND,
            format!(
                "{message} (etcd refuses writes and lease grants: its database is full, the \
                 NOSPACE alarm is raised; an operator must compact and defragment it, then \
                 disarm the alarm with `etcdctl alarm disarm`)"
            ),
            false,
            e,
        ),
        _ => {
            let retry = is_transient(&e);
            Error::backend(BACKEND, message, retry, e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errors a lease gone and a full database arrive as, from etcd 3.4 and the client
    /// library, beside the busy server that shares the full database's code.
    #[test]
    fn a_lease_gone_and_a_full_database_are_told_apart() {
        let status = |code, message: &str| EtcdError::GRpcStatus(tonic::Status::new(code, message));
        let gone = [
            status(Code::NotFound, "etcdserver: requested lease not found"),
            EtcdError::LeaseKeepAliveError(KEEPER_FOUND_NO_LEASE.into()),
        ];
        for e in &gone {
            assert!(is_lease_gone(e) && !is_transient(e), "{e}");
        }
        let closed = EtcdError::LeaseKeepAliveError("channel closed".into());
        assert!(!is_lease_gone(&closed) && is_transient(&closed));

        let full = status(
            Code::ResourceExhausted,
            "etcdserver: mvcc: database space exceeded",
        );
        assert!(!is_transient(&full));
        let e = from_etcd("put k", full);
        assert!(!e.is_retryable(), "{e:?}");
        assert!(e.to_string().contains("database space exceeded"), "{e}");
        assert!(e.to_string().contains("alarm disarm"), "{e}");
        let busy = status(Code::ResourceExhausted, "etcdserver: too many requests");
        assert!(is_transient(&busy));
        assert!(from_etcd("put k", busy).is_retryable());
    }
}
