//! The one error type every backend returns.

use std::fmt;

/// A boxed error from a backend's client library, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a distributed lock.
///
/// "Not acquired within the wait" is not an error: [`try_acquire`](crate::DistributedLock::try_acquire)
/// returns `Ok(None)` for it. Use [`Error::is_retryable`] to decide whether the same call may
/// succeed later.
///
/// Each variant is `#[non_exhaustive]` as well, so that fields can be added: outside this
/// crate, build one with its constructor ([`Error::config`], [`Error::backend`],
/// [`Error::connection`], …) and end a pattern that names fields with `..`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name is not acceptable (see [`LockName`](crate::LockName)).
    #[error("invalid lock name {name:?}: {reason}")]
    #[non_exhaustive]
    InvalidName {
        /// The name as given (possibly shortened for display).
        name: String,
        /// Why it was rejected.
        reason: String,
    },

    /// An argument other than the name is out of range: zero permits, a zero or too-short lease.
    #[error("invalid argument `{argument}`: {reason}")]
    #[non_exhaustive]
    InvalidArgument {
        /// Which argument.
        argument: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// The configuration (usually a URL) is malformed, names an unknown scheme, or names a
    /// backend whose Cargo feature is not enabled. URLs in the message have their password
    /// redacted.
    #[error("invalid configuration: {message}")]
    #[non_exhaustive]
    Config {
        /// What is wrong, for a human.
        message: String,
        /// The parser's error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The backend cannot honour an option or operation; it refuses rather than pretend.
    #[error("{backend} does not support {what}")]
    #[non_exhaustive]
    Unsupported {
        /// The backend, e.g. `"redis"`.
        backend: &'static str,
        /// The option or operation, e.g. `"fair locks"`.
        what: String,
    },

    /// The hold this guard stood for is gone: it expired, its session ended, or someone else
    /// took the lock. Nothing was changed on the server.
    #[error("the hold on lock {name:?} was lost")]
    #[non_exhaustive]
    LockLost {
        /// The lock's name.
        name: String,
    },

    /// The call would wait forever on a lock the caller itself holds, e.g. asking for the
    /// write lock while holding the read lock of the same read-write lock.
    #[error("acquiring {name:?} would deadlock: {reason}")]
    #[non_exhaustive]
    WouldDeadlock {
        /// The lock's name.
        name: String,
        /// Which hold of the caller's blocks the request.
        reason: String,
    },

    /// The provider was closed ([`LockProvider::close`](crate::LockProvider::close)): it
    /// hands out no more holds.
    #[error("the {backend} provider was closed: {name:?} cannot be acquired")]
    #[non_exhaustive]
    Closed {
        /// The backend, e.g. `"redis"`.
        backend: &'static str,
        /// The lock's name.
        name: String,
    },

    /// The backend could not be reached or the connection broke. Retrying can help.
    #[error("{backend} connection error: {message}")]
    #[non_exhaustive]
    Connection {
        /// The backend, e.g. `"redis"`.
        backend: &'static str,
        /// What failed, with any address redacted of credentials.
        message: String,
        /// The client library's error.
        #[source]
        source: Option<BoxError>,
    },

    /// The backend answered with an error.
    #[error("{backend} error: {message}")]
    #[non_exhaustive]
    Backend {
        /// The backend, e.g. `"mysql"`.
        backend: &'static str,
        /// What failed.
        message: String,
        /// Whether the same call may succeed if tried again (e.g. a deadlock victim, a server
        /// still loading its data, a failover in progress).
        retryable: bool,
        /// The client library's error.
        #[source]
        source: Option<BoxError>,
    },
}

impl Error {
    /// Whether the failed call may succeed if made again (after a backoff or a reconnect).
    ///
    /// Connection errors are retryable; backend errors say so themselves; invalid input,
    /// unsupported options, lost holds, deadlocks and a closed provider never are.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connection { .. } => true,
            Self::Backend { retryable, .. } => *retryable,
            Self::InvalidName { .. }
            | Self::InvalidArgument { .. }
            | Self::Config { .. }
            | Self::Unsupported { .. }
            | Self::LockLost { .. }
            | Self::WouldDeadlock { .. }
            | Self::Closed { .. } => false,
        }
    }

    /// A copy of this error for another caller of the same failed call (each item of a
    /// batch that failed as a whole): the same variant, fields and retryability; the source,
    /// which cannot be cloned, is added to the message.
    pub fn duplicate(&self) -> Self {
        let with_source = |message: &str, source: &Option<BoxError>| match source {
            Some(s) => format!("{message}: {s}"),
            None => message.to_owned(),
        };
        match self {
            Self::InvalidName { name, reason } => Self::InvalidName {
                name: name.clone(),
                reason: reason.clone(),
            },
            Self::InvalidArgument { argument, reason } => Self::InvalidArgument {
                argument,
                reason: reason.clone(),
            },
            Self::Config { message, source } => Self::Config {
                message: with_source(message, source),
                source: None,
            },
            Self::Unsupported { backend, what } => Self::Unsupported {
                backend,
                what: what.clone(),
            },
            Self::LockLost { name } => Self::LockLost { name: name.clone() },
            Self::Closed { backend, name } => Self::Closed {
                backend,
                name: name.clone(),
            },
            Self::WouldDeadlock { name, reason } => Self::WouldDeadlock {
                name: name.clone(),
                reason: reason.clone(),
            },
            Self::Connection {
                backend,
                message,
                source,
            } => Self::Connection {
                backend,
                message: with_source(message, source),
                source: None,
            },
            Self::Backend {
                backend,
                message,
                retryable,
                source,
            } => Self::Backend {
                backend,
                message: with_source(message, source),
                retryable: *retryable,
                source: None,
            },
        }
    }

    /// Shorthand for [`Error::Config`] without a source.
    pub fn config(message: impl fmt::Display) -> Self {
        Self::Config {
            message: message.to_string(),
            source: None,
        }
    }

    /// Shorthand for [`Error::Config`] with a source: the parser's or the client library's
    /// error that made the configuration unusable.
    pub fn config_caused(message: impl fmt::Display, source: impl Into<BoxError>) -> Self {
        Self::Config {
            message: message.to_string(),
            source: Some(source.into()),
        }
    }

    /// Shorthand for [`Error::InvalidName`]: `name` as given, and why it was rejected.
    pub fn invalid_name(name: impl fmt::Display, reason: impl fmt::Display) -> Self {
        Self::InvalidName {
            name: name.to_string(),
            reason: reason.to_string(),
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid_argument(argument: &'static str, reason: impl fmt::Display) -> Self {
        Self::InvalidArgument {
            argument,
            reason: reason.to_string(),
        }
    }

    /// Shorthand for [`Error::Unsupported`].
    pub fn unsupported(backend: &'static str, what: impl fmt::Display) -> Self {
        Self::Unsupported {
            backend,
            what: what.to_string(),
        }
    }

    /// For backends: an acquire without a deadline came back without the lock, which a wait
    /// loop never does. Reported (retryable) rather than panicked on.
    pub fn unbounded_wait_ended(backend: &'static str, name: impl fmt::Debug) -> Self {
        Self::Backend {
            backend,
            message: format!("an unbounded wait for {name:?} ended without the lock"),
            retryable: true,
            source: None,
        }
    }

    /// Shorthand for [`Error::LockLost`].
    pub fn lock_lost(name: impl fmt::Display) -> Self {
        Self::LockLost {
            name: name.to_string(),
        }
    }

    /// Shorthand for [`Error::WouldDeadlock`]: the lock's name, and which hold of the
    /// caller's blocks the request.
    pub fn would_deadlock(name: impl fmt::Display, reason: impl fmt::Display) -> Self {
        Self::WouldDeadlock {
            name: name.to_string(),
            reason: reason.to_string(),
        }
    }

    /// Shorthand for [`Error::Closed`]: an acquisition of `name` through a closed provider
    /// of `backend`.
    pub fn closed(backend: &'static str, name: impl fmt::Display) -> Self {
        Self::Closed {
            backend,
            name: name.to_string(),
        }
    }

    /// Shorthand for [`Error::Connection`] with a source.
    pub fn connection(
        backend: &'static str,
        message: impl fmt::Display,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Connection {
            backend,
            message: message.to_string(),
            source: Some(source.into()),
        }
    }

    /// [`Error::Connection`] for a store that did not answer in time: nothing says whether
    /// anyone holds the lock.
    pub fn no_answer(backend: &'static str, message: impl fmt::Display) -> Self {
        Self::Connection {
            backend,
            message: message.to_string(),
            source: None,
        }
    }

    /// [`Error::Connection`] without a source: the backend could not be reached or the
    /// connection broke, and no client library error says more than `message`. (For a
    /// store that did not answer in time, see [`Error::no_answer`].)
    pub fn connection_failed(backend: &'static str, message: impl fmt::Display) -> Self {
        Self::Connection {
            backend,
            message: message.to_string(),
            source: None,
        }
    }

    /// Shorthand for [`Error::Backend`] with a source.
    pub fn backend(
        backend: &'static str,
        message: impl fmt::Display,
        retryable: bool,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Backend {
            backend,
            message: message.to_string(),
            retryable,
            source: Some(source.into()),
        }
    }

    /// [`Error::Backend`] without a source: the backend's answer (or what dlock made of it)
    /// is all there is to say, in `message`; `retryable` says whether the same call may
    /// succeed if tried again.
    pub fn backend_failed(
        backend: &'static str,
        message: impl fmt::Display,
        retryable: bool,
    ) -> Self {
        Self::Backend {
            backend,
            message: message.to_string(),
            retryable,
            source: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_classification() {
        assert!(Error::connection("redis", "refused", "io").is_retryable());
        assert!(Error::backend("mysql", "deadlock", true, "1213").is_retryable());
        assert!(!Error::backend("mysql", "syntax", false, "1064").is_retryable());
        assert!(!Error::lock_lost("a").is_retryable());
        assert!(!Error::config("bad url").is_retryable());
        assert!(!Error::invalid_argument("permits", "zero").is_retryable());
    }

    #[test]
    fn a_duplicate_keeps_the_kind_retryability_and_the_sources_text() {
        let e = Error::backend("redis", "renew", false, "NOSCRIPT");
        let d = e.duplicate();
        assert!(matches!(
            d,
            Error::Backend {
                retryable: false,
                ..
            }
        ));
        assert_eq!(d.to_string(), "redis error: renew: NOSCRIPT");
        let c = Error::connection("redis", "broken pipe", "io").duplicate();
        assert!(c.is_retryable());
        assert!(
            matches!(Error::lock_lost("a").duplicate(), Error::LockLost { name } if name == "a")
        );
    }

    #[test]
    fn the_shorthands_build_their_variant() {
        use std::error::Error as _;

        let e = Error::invalid_name("", "empty");
        assert!(
            matches!(&e, Error::InvalidName { name, reason } if name.is_empty() && reason == "empty")
        );
        assert!(!e.is_retryable());

        let e = Error::would_deadlock("rw", "holds the read lock");
        assert!(
            matches!(&e, Error::WouldDeadlock { name, reason } if name == "rw" && reason == "holds the read lock")
        );
        assert!(!e.is_retryable());

        let e = Error::closed("redis", "a");
        assert!(matches!(&e, Error::Closed { backend: "redis", name } if name == "a"));
        assert!(!e.is_retryable());

        let e = Error::config_caused("bad port", "invalid digit");
        assert!(matches!(&e, Error::Config { message, source: Some(_) } if message == "bad port"));
        assert_eq!(
            e.source().map(ToString::to_string).as_deref(),
            Some("invalid digit")
        );
        assert!(!e.is_retryable());

        let e = Error::connection_failed("sqlite", "the connection broke");
        assert!(matches!(
            &e,
            Error::Connection { backend: "sqlite", message, source: None } if message == "the connection broke"
        ));
        assert!(e.is_retryable());

        for retryable in [true, false] {
            let e = Error::backend_failed("mysql", "unexpected reply", retryable);
            assert!(matches!(
                &e,
                Error::Backend { backend: "mysql", message, source: None, .. } if message == "unexpected reply"
            ));
            assert_eq!(e.is_retryable(), retryable);
        }
    }

    #[test]
    fn sources_are_chained() {
        let e = Error::connection("redis", "connect to 127.0.0.1:1 failed", "refused");
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("refused"));
        assert_eq!(
            e.to_string(),
            "redis connection error: connect to 127.0.0.1:1 failed"
        );
    }
}
