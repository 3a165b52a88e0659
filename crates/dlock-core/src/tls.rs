//! The files of a TLS connection to a store, as every backend's URL gives them: one policy
//! for all of them.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Whom a TLS connection to a store trusts, and the client's own certificate, as the URL's
/// `ca_file=`, `cert_file=` and `key_file=` give them (each a path to a PEM file,
/// percent-encoded in the URL).
///
/// The policy is the same on every backend that takes these parameters (Redis's `rediss://`,
/// etcd's `etcds://`): with `ca_file`, the server's certificate must chain to that authority
/// alone; without it, to the public roots of the backend's client library (etcd: the Mozilla
/// roots of webpki-roots; Redis: the operating system's store, which redis-rs reads: dlock
/// does not switch it, since a Cargo feature would switch it for the application's own
/// Redis clients too). `cert_file` and `key_file` go together, for servers that ask for a
/// client certificate. The files are read when the provider connects, and a missing or
/// unreadable one is an [`Error::Config`] naming it.
///
/// ```
/// use dlock_core::TlsFiles;
///
/// let mut tls = TlsFiles::default();
/// for (key, value) in [("ca_file", "/etc/ca d.pem"), ("timeout_ms", "5")] {
///     let taken = tls.take_param(key, value)?;
///     assert_eq!(taken, key == "ca_file");
/// }
/// let tls = tls.checked()?;
/// assert_eq!(tls.ca_file.as_deref(), Some(std::path::Path::new("/etc/ca d.pem")));
///
/// let mut half = TlsFiles::default();
/// half.take_param("cert_file", "/c.pem")?;
/// assert!(half.checked().is_err());
/// # Ok::<(), dlock_core::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// PEM file of the certificate authority that signed the servers' certificates
    /// (`ca_file=`); without it, the client library's public roots.
    pub ca_file: Option<PathBuf>,
    /// PEM files of the client's certificate and key (`cert_file=`, `key_file=`: both or
    /// neither), kept apart until [`TlsFiles::checked`] pairs them.
    pub identity: Option<(PathBuf, PathBuf)>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// The names of the parameters it takes.
    pub const PARAMS: [&'static str; 3] = ["ca_file", "cert_file", "key_file"];

    /// Takes the query parameter `key=value` (`value` decoded from its `%`-escapes) if it is
    /// one of [`TlsFiles::PARAMS`] (`true`); `false` leaves it to the caller.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty path.
    pub fn take_param(&mut self, key: &str, value: &str) -> Result<bool> {
        let slot = match key {
            "ca_file" => &mut self.ca_file,
            "cert_file" => &mut self.cert_file,
            "key_file" => &mut self.key_file,
            _ => return Ok(false),
        };
        if value.is_empty() {
            return Err(Error::config(format!("{key}= needs a file path")));
        }
        *slot = Some(PathBuf::from(value));
        Ok(true)
    }

    /// Pairs `cert_file` with `key_file`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if only one of them was given.
    pub fn checked(mut self) -> Result<Self> {
        match (self.cert_file.take(), self.key_file.take()) {
            (Some(cert), Some(key)) => self.identity = Some((cert, key)),
            (None, None) => {}
            _ => return Err(Error::config("cert_file= and key_file= go together")),
        }
        Ok(self)
    }

    /// Whether it names any file.
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.identity.is_none()
    }

    /// Reads the authority's PEM file, if one was given.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the file if it cannot be read.
    pub fn read_ca(&self) -> Result<Option<Vec<u8>>> {
        self.ca_file
            .as_deref()
            .map(|path| read(path, "-----BEGIN CERTIFICATE-----", "a PEM certificate"))
            .transpose()
    }

    /// Reads the client's certificate and key (PEM), if they were given.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the file that cannot be read.
    pub fn read_identity(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.identity
            .as_ref()
            .map(|(cert, key)| {
                Ok((
                    read(cert, "-----BEGIN CERTIFICATE-----", "a PEM certificate")?,
                    read(key, "PRIVATE KEY-----", "a PEM private key")?,
                ))
            })
            .transpose()
    }
}

/// Reads `path`, which must hold `marker` (a PEM header): a file of something else is a
/// configuration error naming it, never a connection error a caller would retry.
fn read(path: &Path, marker: &str, what: &str) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).map_err(|e| Error::Config {
        message: format!("TLS: cannot read {}: {e}", path.display()),
        source: Some(Box::new(e)),
    })?;
    if !bytes.windows(marker.len()).any(|w| w == marker.as_bytes()) {
        return Err(Error::config(format!(
            "TLS: {} holds no {what} (no {marker:?} line)",
            path.display()
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that is not the PEM it should be is a configuration error naming it.
    #[test]
    fn files_of_something_else_are_configuration_errors() {
        let dir = std::env::temp_dir().join(format!("dlock-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = dir.join("notes.txt");
        std::fs::write(&text, "not a certificate").unwrap();
        let mut tls = TlsFiles::default();
        tls.take_param("ca_file", text.to_str().unwrap()).unwrap();
        tls.take_param("cert_file", text.to_str().unwrap()).unwrap();
        tls.take_param("key_file", text.to_str().unwrap()).unwrap();
        let tls = tls.checked().unwrap();
        for e in [tls.read_ca().unwrap_err(), tls.read_identity().unwrap_err()] {
            assert!(matches!(e, Error::Config { .. }), "{e}");
            assert!(
                !e.is_retryable() && e.to_string().contains("notes.txt"),
                "{e}"
            );
        }
        let missing = TlsFiles {
            ca_file: Some(dir.join("nowhere.pem")),
            ..TlsFiles::default()
        };
        assert!(
            missing
                .read_ca()
                .unwrap_err()
                .to_string()
                .contains("nowhere.pem")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
