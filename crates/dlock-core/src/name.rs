//! Lock names and fencing tokens.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// A validated lock name, shared by all backends.
///
/// A name is 1 to [`LockName::MAX_LEN`] bytes of UTF-8 with no NUL and no control characters.
/// Names are case-sensitive and are never rewritten: two different names always denote two
/// different locks. Backends may add limits of their own on top (and reject a name they cannot
/// represent) but never map two names to one key, path or row.
///
/// Cloning is cheap (the text is shared).
///
/// ```
/// use dlock_core::LockName;
/// assert_eq!(LockName::new("orders/42").unwrap().as_str(), "orders/42");
/// assert!(LockName::new("").is_err());
/// assert!(LockName::new("a\0b").is_err());
/// assert!(LockName::new("x".repeat(256)).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockName(Arc<str>);

impl LockName {
    /// The longest name, in bytes.
    pub const MAX_LEN: usize = 255;

    /// Validates `name`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] if the name is empty, longer than [`Self::MAX_LEN`] bytes, or
    /// contains NUL or another control character.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        let reject = |reason: String| Error::InvalidName {
            name: shorten(name),
            reason,
        };
        if name.is_empty() {
            return Err(reject("a lock name must not be empty".into()));
        }
        if name.len() > Self::MAX_LEN {
            return Err(reject(format!(
                "a lock name is at most {} bytes, this one has {}",
                Self::MAX_LEN,
                name.len()
            )));
        }
        if let Some((at, c)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(reject(format!(
                "control character U+{:04X} at byte {at}",
                u32::from(c)
            )));
        }
        Ok(Self(Arc::from(name)))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Shortens a rejected name for error messages, so a megabyte of input does not end up in a log.
fn shorten(name: &str) -> String {
    const SHOW: usize = 64;
    if name.len() <= SHOW {
        return name.to_owned();
    }
    let mut end = SHOW;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &name[..end], name.len())
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self> {
        Self::new(value)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        Self::new(value)
    }
}

/// A fencing token: a number the store issues with every acquisition of a name, strictly
/// greater than every token it issued before for that name.
///
/// Pass it to the resource you protect and have the resource reject writes carrying a token
/// lower than the highest it has seen: a holder that paused past its lease then cannot
/// overwrite the work of the next holder. Re-entering a held lock returns the same token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_unicode_and_punctuation() {
        for ok in [
            "a",
            "A",
            "orders/42",
            "x y",
            "'\"\\%_",
            "🔒",
            &"é".repeat(127),
        ] {
            assert_eq!(LockName::new(ok).unwrap().as_str(), ok);
        }
        assert_eq!(LockName::new("x".repeat(255)).unwrap().as_str().len(), 255);
    }

    #[test]
    fn rejects_bad_names_with_reasons() {
        let cases = [
            ("", "empty"),
            ("a\0b", "U+0000"),
            ("tab\there", "U+0009"),
            ("line\n", "U+000A"),
            ("del\u{7f}", "U+007F"),
            ("c1\u{85}", "U+0085"),
        ];
        for (bad, why) in cases {
            let err = LockName::new(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidName { .. }), "{bad:?}");
            assert!(err.to_string().contains(why), "{err} should say {why}");
        }
        let long = "é".repeat(128); // 256 bytes
        let err = LockName::new(&long).unwrap_err();
        assert!(err.to_string().contains("256"), "{err}");
        assert!(
            err.to_string().len() < 300,
            "long names are shortened: {err}"
        );
    }

    #[test]
    fn tokens_order() {
        assert!(FencingToken::new(1) < FencingToken::new(2));
        assert_eq!(u64::from(FencingToken::new(7)), 7);
    }
}
