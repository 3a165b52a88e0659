//! dlock's spans and events, in one place: `dlock.acquire`, `dlock.release`, `dlock.renew`,
//! `dlock.extend` (debug spans) and the `dlock.lost` warning, each with the same fields on
//! every backend.

use std::future::Future;

use tracing::Instrument;

use crate::loss::{LockKind, LossReason};
use crate::name::{FencingToken, LockName};

/// Whether `span` (one of dlock's, all at debug level) is worth entering and recording: a
/// subscriber keeps it, or no `tracing` dispatcher was ever set and a `log` logger takes
/// debug records, to which `tracing`'s `log` feature (which sqlx turns on) then hands the
/// span's enters and records, as `tracing`'s own macros decide. (In a build without that
/// feature, such a logger gets nothing from the span it keeps: a little work for nothing.)
pub(crate) fn kept(span: &tracing::Span) -> bool {
    !span.is_disabled()
        || (!tracing::dispatcher::has_been_set()
            && log::STATIC_MAX_LEVEL >= log::LevelFilter::Debug
            && log::max_level() >= log::LevelFilter::Debug)
}

/// Runs `fut` inside `span`, or as it is when the span is not [`kept`]: a span a subscriber
/// disabled still costs a check of the `log` crate on each enter and exit of every poll, on
/// an uncontended lock's hot path. (A function returning the future, not an `async fn`,
/// which would keep `fut` twice; see [`Deadline::run`](crate::time::Deadline::run).)
pub(crate) fn in_span<F: Future>(
    span: &tracing::Span,
    fut: F,
) -> futures::future::Either<tracing::instrument::Instrumented<F>, F> {
    if kept(span) {
        futures::future::Either::Left(fut.instrument(span.clone()))
    } else {
        futures::future::Either::Right(fut)
    }
}

/// The `dlock.acquire` span; `outcome`, `token` and `waited_ms` are recorded when the
/// acquisition ends.
pub(crate) fn acquire(backend: &'static str, kind: LockKind, name: &LockName) -> tracing::Span {
    tracing::debug_span!(
        "dlock.acquire",
        backend,
        kind = %kind,
        lock = %name,
        outcome = tracing::field::Empty,
        token = tracing::field::Empty,
        waited_ms = tracing::field::Empty,
    )
}

/// The `dlock.release` span; `background` when a dropped guard's release runs in a task.
pub(crate) fn release(
    backend: &'static str,
    kind: LockKind,
    name: &LockName,
    background: bool,
) -> tracing::Span {
    tracing::debug_span!("dlock.release", backend, kind = %kind, lock = %name, background)
}

/// The `dlock.renew` span of one watchdog renewal.
pub(crate) fn renew(backend: &'static str, kind: LockKind, name: &LockName) -> tracing::Span {
    tracing::debug_span!("dlock.renew", backend, kind = %kind, lock = %name)
}

/// The `dlock.extend` span of one `extend`.
pub(crate) fn extend(backend: &'static str, kind: LockKind, name: &LockName) -> tracing::Span {
    tracing::debug_span!("dlock.extend", backend, kind = %kind, lock = %name)
}

/// Who a hold is, for the `dlock.lost` event.
#[derive(Debug)]
pub(crate) struct Who {
    pub(crate) backend: &'static str,
    pub(crate) kind: LockKind,
    pub(crate) name: LockName,
    pub(crate) token: FencingToken,
}

/// The `dlock.lost` warning (and the loss metric).
pub(crate) fn lost(who: Option<&Who>, reason: LossReason) {
    match who {
        // A close ends its provider's holds on purpose: no warning.
        Some(w) if reason == LossReason::Closed => {
            crate::metrics::lost(w.backend, w.kind, reason);
            tracing::debug!(
                backend = w.backend,
                kind = %w.kind,
                lock = %w.name,
                token = w.token.get(),
                "dlock.lost: closed"
            );
        }
        Some(w) => {
            crate::metrics::lost(w.backend, w.kind, reason);
            tracing::warn!(
                backend = w.backend,
                kind = %w.kind,
                lock = %w.name,
                token = w.token.get(),
                reason = %reason,
                "dlock.lost"
            );
        }
        None => tracing::warn!(reason = %reason, "dlock.lost"),
    }
}

#[cfg(test)]
mod tests {
    use super::kept;

    /// No `tracing` dispatcher is ever set in this test binary: a span is kept for the `log`
    /// crate only where a logger takes debug records.
    #[test]
    fn without_a_subscriber_a_span_is_kept_only_for_a_debug_logger() {
        assert!(!tracing::dispatcher::has_been_set(), "a dispatcher was set");
        let span = tracing::debug_span!("dlock.test");
        log::set_max_level(log::LevelFilter::Info);
        assert!(!kept(&span), "kept for a logger at info");
        log::set_max_level(log::LevelFilter::Debug);
        assert!(kept(&span), "not kept for a logger at debug");
        log::set_max_level(log::LevelFilter::Off);
    }
}
