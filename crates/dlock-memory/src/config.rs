//! `memory://` URLs and the process-wide registry of named stores.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use dlock_core::backend::Mutex;
use dlock_core::{Error, RedactedUrl, Result};

use crate::store::Store;

/// Stores by name, so every `connect("memory://NAME")` in a process reaches the same store.
/// Named stores live as long as the process, so their fencing counters never go back.
fn registry() -> &'static Mutex<HashMap<String, Arc<Store>>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<Store>>>> = OnceLock::new();
    STORES.get_or_init(Mutex::default)
}

pub(crate) fn named(name: &str) -> Arc<Store> {
    let mut stores = registry().lock();
    Arc::clone(stores.entry(name.to_owned()).or_default())
}

/// What a `memory://` URL asks for: `None` for a private store, else the shared store's name.
pub(crate) fn parse(url: &str) -> Result<Option<String>> {
    let parsed = RedactedUrl::parse(url)?;
    if parsed.scheme() != "memory" {
        return Err(Error::config(format!(
            "the memory backend takes memory:// URLs, not {}://",
            parsed.scheme()
        )));
    }
    let url = parsed.expose();
    if !url.as_str().starts_with("memory://") {
        return Err(Error::config("write memory:// or memory://NAME"));
    }
    if url.password().is_some() || !url.username().is_empty() || url.port().is_some() {
        return Err(Error::config(
            "a memory:// URL has no credentials or port: memory:// or memory://NAME",
        ));
    }
    if let Some((key, _)) = parsed.query_pairs().next() {
        return Err(Error::config(format!(
            "memory:// takes no query parameters, got {key:?}"
        )));
    }
    let path = url.path();
    if !path.is_empty() && path != "/" {
        return Err(Error::config(format!(
            "memory://NAME takes no path, got {path:?}"
        )));
    }
    Ok(url.host_str().filter(|h| !h.is_empty()).map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_private_and_named_stores() {
        assert_eq!(parse("memory://").unwrap(), None);
        assert_eq!(parse("memory://shared").unwrap().as_deref(), Some("shared"));
        assert_eq!(
            parse("memory://shared/").unwrap().as_deref(),
            Some("shared")
        );
    }

    #[test]
    fn rejects_what_it_cannot_mean() {
        for bad in [
            "memory://a/b",
            "memory://u:p@a",
            "memory://a:1",
            "memory://a?x=1",
            "redis://a",
            "memory:/",
            "::",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(matches!(err, Error::Config { .. }), "{bad}: {err}");
            assert!(!err.to_string().contains(":p@"), "{err}");
        }
    }
}
