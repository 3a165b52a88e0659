//! Mapping the client library's errors into the core error, with retryability.

use dlock_core::Error;
use etcd_client::Error as EtcdError;
use tonic::Code;

use crate::BACKEND;

/// Whether a call that failed this way may succeed if made again: the transport failed, the
/// member had no leader (an election), or the server was busy.
pub(crate) fn is_transient(e: &EtcdError) -> bool {
    match e {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => true,
        EtcdError::GRpcStatus(s) => matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::ResourceExhausted
                | Code::Unknown
                | Code::Cancelled
        ),
        EtcdError::LeaseKeepAliveError(_) | EtcdError::WatchError(_) => true,
        _ => false,
    }
}

/// Whether the server said the lease does not exist (it expired or was revoked).
pub(crate) fn is_lease_gone(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(s)
        if s.code() == Code::NotFound && s.message().contains("lease not found"))
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
        _ => {
            let retry = is_transient(&e);
            Error::backend(BACKEND, message, retry, e)
        }
    }
}
