//! The `dlock.acquire` and `dlock.release` spans: where a subscriber keeps them, the
//! acquisition's outcome, token and wait are recorded on its span (the core skips them, and
//! the span, only where no subscriber wants the span).

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use dlock_core::backend::{HandleInfo, Lock, RawLock, Request};
use dlock_core::{DistributedLock, LockGuard, LockName, LockOptions, Result, async_trait};
use tracing_subscriber::fmt::format::FmtSpan;

mod support;

/// Grants every acquisition at once, with token 7.
#[derive(Debug, Clone)]
struct Store;

#[async_trait]
impl RawLock for Store {
    async fn acquire(&self, req: &Request<'_>) -> Result<Option<LockGuard>> {
        tracing::info!("the store grants");
        Ok(Some(support::granted(req, 7)))
    }
}

/// What the subscriber wrote.
#[derive(Clone, Default)]
struct Written(Arc<Mutex<Vec<u8>>>);

impl Written {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl io::Write for Written {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One acquire and release under a subscriber that keeps spans up to `level`; what it wrote.
async fn cycle_under(level: tracing::Level) -> Result<String> {
    let written = Written::default();
    let out = written.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || out.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let name = LockName::new("spans")?;
    let lock = Lock::new(
        HandleInfo::new("test", "test://", name, LockOptions::default()),
        Store,
    );
    lock.acquire().await?.release().await?;
    Ok(written.text())
}

#[tokio::test]
async fn a_kept_span_records_how_the_acquisition_ended() -> Result<()> {
    let text = cycle_under(tracing::Level::DEBUG).await?;
    let acquire = text
        .lines()
        .find(|l| l.contains("dlock.acquire{") && l.contains(" close "))
        .unwrap_or_default();
    for field in [
        "outcome=\"acquired\"",
        "token=7",
        "waited_ms=",
        "lock=spans",
    ] {
        assert!(acquire.contains(field), "{field} missing from {text:?}");
    }
    // The store's work ran inside the span.
    let granting = text
        .lines()
        .find(|l| l.contains("the store grants"))
        .unwrap_or_default();
    assert!(
        granting.contains("dlock.acquire{"),
        "the store's event is not in the acquire span: {text:?}"
    );
    assert!(
        text.contains("dlock.release{"),
        "no release span in {text:?}"
    );
    Ok(())
}

/// Where the subscriber does not keep the span, the acquisition's own events are still
/// written, outside any dlock span.
#[tokio::test]
async fn a_span_the_subscriber_drops_is_not_entered() -> Result<()> {
    let text = cycle_under(tracing::Level::INFO).await?;
    assert!(text.contains("the store grants"), "no event in {text:?}");
    assert!(
        !text.contains("dlock."),
        "a debug span was written: {text:?}"
    );
    Ok(())
}
