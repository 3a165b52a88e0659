//! URL helpers shared by the backends: parsing with credentials kept out of errors, and
//! redaction for logs, `Debug` and `Display`.

use std::fmt;

use url::Url;

use crate::error::{Error, Result};

/// A parsed backend URL whose `Debug` and `Display` never show the password.
///
/// ```
/// use dlock_core::RedactedUrl;
/// let url = RedactedUrl::parse("redis://user:secret@127.0.0.1:6379/0").unwrap();
/// assert_eq!(url.to_string(), "redis://user:***@127.0.0.1:6379/0");
/// assert_eq!(url.expose().password(), Some("secret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedactedUrl(Url);

impl RedactedUrl {
    /// Parses `text`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`], whose message shows the text with any password redacted.
    pub fn parse(text: &str) -> Result<Self> {
        Url::parse(text).map(Self).map_err(|e| Error::Config {
            message: format!("malformed URL {:?}: {e}", redact(text)),
            source: Some(Box::new(e)),
        })
    }

    /// The URL with its credentials, for the client library that needs them.
    pub fn expose(&self) -> &Url {
        &self.0
    }

    /// The scheme, e.g. `"redis"`.
    pub fn scheme(&self) -> &str {
        self.0.scheme()
    }

    /// The query parameters, decoded.
    pub fn query_pairs(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.0
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
    }

    /// The URL without credentials or query, normalised: a stable id for the store.
    ///
    /// For the network schemes dlock knows, the host is lower-cased and a missing port becomes
    /// the scheme's default; a trailing slash goes, so `mysql://DB.example/app/` and
    /// `mysql://db.example:3306/app` are one store (a [`MultiLock`](crate::MultiLock) orders
    /// and de-duplicates locks by it). Different host names for one machine (`localhost` and
    /// `127.0.0.1`) stay different: nothing is resolved.
    pub fn store_id(&self) -> String {
        let mut url = self.0.clone();
        let _ = url.set_password(None);
        let _ = url.set_username("");
        url.set_query(None);
        url.set_fragment(None);
        if let Some(port) = default_port(url.scheme()) {
            // Host names of network stores are case-insensitive.
            if let Some(host) = url.host_str().map(str::to_ascii_lowercase) {
                let _ = url.set_host(Some(&host));
            }
            if url.port().is_none() {
                let _ = url.set_port(Some(port));
            }
        }
        let path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&path);
        url.to_string()
    }
}

impl fmt::Display for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.clone();
        if shown.password().is_some() {
            let _ = shown.set_password(Some("***"));
        }
        f.write_str(&redact_query(shown.as_str()))
    }
}

impl fmt::Debug for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedactedUrl({self})")
    }
}

/// The default port of the schemes dlock serves, for [`RedactedUrl::store_id`].
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "redis" | "rediss" => Some(6379),
        "mysql" | "mariadb" => Some(3306),
        "postgres" | "postgresql" => Some(5432),
        "zk" => Some(2181),
        "etcd" | "etcds" => Some(2379),
        _ => None,
    }
}

/// Reads a backend's configuration from its URL in an application's configuration file: the
/// value is the URL as a string, and `parse` (the backend's `from_url`) checks it exactly as
/// [`connect`](https://docs.rs/dlock/latest/dlock/fn.connect.html) would, so a typo in a
/// parameter fails the load instead of running with a default. dlock's message never shows
/// the URL's password, but a format may quote the input beside it (toml prints the line):
/// keep the password out of the file's URL ([`ConnectOptions`] of the `dlock` crate, or an
/// environment variable). Each backend's `serde` feature implements `Deserialize` with it.
///
/// [`ConnectOptions`]: https://docs.rs/dlock/latest/dlock/struct.ConnectOptions.html
///
/// ```
/// # use dlock_core::{Error, Result};
/// struct Config(String);
///
/// impl<'de> serde::Deserialize<'de> for Config {
///     fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
///         dlock_core::backend::deserialize_url(d, |url: &str| -> Result<Config> {
///             match url.strip_prefix("my://") {
///                 Some(host) => Ok(Config(host.to_owned())),
///                 None => Err(Error::config(format!("not a my:// URL: {}", dlock_core::redact(url)))),
///             }
///         })
///     }
/// }
///
/// use serde::de::{Deserialize, value::{Error as DeError, StrDeserializer}};
/// let read = |text| Config::deserialize(StrDeserializer::<DeError>::new(text));
/// assert_eq!(read("my://host").unwrap().0, "host");
/// let refused = read("other://u:secret@host").err().unwrap().to_string();
/// assert!(refused.contains("not a my:// URL") && !refused.contains("secret"), "{refused}");
/// ```
#[cfg(feature = "serde")]
pub fn deserialize_url<'de, D, T>(
    deserializer: D,
    parse: impl FnOnce(&str) -> crate::Result<T>,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let url = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(deserializer)?;
    parse(&url).map_err(serde::de::Error::custom)
}

/// Implements `serde::Deserialize` for a backend's configuration type with
/// [`deserialize_url`](crate::backend::deserialize_url) and the type's own
/// `from_url(&str) -> Result<Self>`: the value is the URL as a string, checked exactly as
/// `from_url` checks it. The calling crate depends on `serde` and invokes the macro under its
/// own `serde` feature, so the impl exists exactly when that feature is on.
#[cfg(feature = "serde")]
#[doc(hidden)]
#[macro_export]
macro_rules! deserialize_from_url {
    ($config:ident) => {
        #[doc = "With the `serde` feature: read from the URL (a string), checked exactly as"]
        #[doc = concat!("[`", stringify!($config), "::from_url`] checks it, so an unknown")]
        #[doc = "parameter fails the load."]
        impl<'de> ::serde::Deserialize<'de> for $config {
            fn deserialize<D: ::serde::Deserializer<'de>>(
                d: D,
            ) -> ::std::result::Result<Self, D::Error> {
                $crate::backend::deserialize_url(d, Self::from_url)
            }
        }
    };
}

/// Decodes the `%XX` escapes of a URL part (a user, a password, a path); `None` if an escape
/// is malformed or the result is not UTF-8, so a backend refuses such a URL instead of
/// guessing.
///
/// ```
/// use dlock_core::backend::percent_decode;
///
/// assert_eq!(percent_decode("a%2Fb%25").as_deref(), Some("a/b%"));
/// assert_eq!(percent_decode("%zz"), None);
/// assert_eq!(percent_decode("%C3"), None);
/// ```
pub fn percent_decode(text: &str) -> Option<String> {
    // The `percent-encoding` crate decodes; it keeps a `%` that starts no escape as it is,
    // which a URL's credentials must not be guessed from: such text is refused first.
    let bytes = text.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(i, b)| {
        *b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return None;
    }
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

/// Parses a comma-separated list of `host[:port]` (a `[v6]` host in brackets), as in
/// `zk://a:2181,b:2181` or the Sentinels of a `redis+sentinel://` URL: each entry becomes
/// `host:port`, with `default_port` where none is given. Shared by the backends whose URLs
/// name several servers.
///
/// ```
/// use dlock_core::backend::parse_host_list;
/// assert_eq!(
///     parse_host_list("a:1,[::1],b", 26379).unwrap(),
///     ["a:1", "[::1]:26379", "b:26379"]
/// );
/// assert!(parse_host_list("a:1,,b", 26379).is_err());
/// ```
///
/// # Errors
///
/// A message naming the bad entry: an empty list or entry, an unclosed `[`, a character
/// that has no place in a host, a port that is not `1..=65535`.
pub fn parse_host_list(list: &str, default_port: u16) -> std::result::Result<Vec<String>, String> {
    if list.is_empty() {
        return Err("no host".into());
    }
    list.split(',')
        .map(|h| parse_host(h, default_port))
        .collect()
}

/// A URL that names a list of servers, split after its `scheme://`:
/// `[user:password@]host[:port][,host[:port]...][/path][?query]`, with no `#fragment`, as the
/// `zk://` and `etcd://` URLs are. `Debug` never shows the password.
///
/// ```
/// use dlock_core::backend::HostListUrl;
///
/// let url = HostListUrl::parse("u:p%40ss@a,b:2/base?x=1&flag", 7, "a my URL").unwrap();
/// assert_eq!(url.credentials, Some(("u".to_owned(), "p@ss".to_owned())));
/// assert_eq!(url.hosts, ["a:7", "b:2"]);
/// assert_eq!(url.path, "/base");
/// assert_eq!(url.params().collect::<Vec<_>>(), [("x", "1"), ("flag", "")]);
/// assert!(HostListUrl::parse("a#top", 7, "a my URL").unwrap_err().contains("a my URL"));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostListUrl<'a> {
    /// The user and the password, percent-decoded; the user is never empty.
    pub credentials: Option<(String, String)>,
    /// `host:port` of each server, in the order given (see [`parse_host_list`]).
    pub hosts: Vec<String>,
    /// The path with its leading `/`, as written (not decoded); `""` without one.
    pub path: &'a str,
    /// The query without its `?`, as written; `""` without one.
    pub query: &'a str,
}

impl<'a> HostListUrl<'a> {
    /// Splits `rest`, the URL after its `scheme://`; a host without a port gets
    /// `default_port`. `what` names such a URL in the messages (`"a zk URL"`).
    ///
    /// # Errors
    ///
    /// A message saying what is wrong, never showing the password: a `#fragment`, credentials
    /// that are not `user:password` or have an empty user, a malformed `%`-escape in them, no
    /// host, a bad host list.
    pub fn parse(
        rest: &'a str,
        default_port: u16,
        what: &str,
    ) -> std::result::Result<Self, String> {
        if rest.contains('#') {
            return Err(format!("{what} has no #fragment"));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (userinfo, hostlist) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let credentials = userinfo.map(parse_credentials).transpose()?;
        if hostlist.is_empty() {
            return Err(format!("{what} needs at least one host"));
        }
        Ok(Self {
            credentials,
            hosts: parse_host_list(hostlist, default_port)?,
            path,
            query,
        })
    }

    /// The query's `key=value` parameters in order, as written (not decoded); a parameter
    /// without `=` has the value `""`.
    pub fn params(&self) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        self.query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').unwrap_or((p, "")))
    }
}

impl fmt::Debug for HostListUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostListUrl")
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("query", &redact_query(&format!("?{}", self.query)))
            .finish()
    }
}

/// `user:password`, percent-decoded, with a user.
fn parse_credentials(info: &str) -> std::result::Result<(String, String), String> {
    let Some((user, password)) = info.split_once(':') else {
        return Err("credentials must be user:password".into());
    };
    let user = percent_decode(user).ok_or("malformed %-escape in the user")?;
    let password = percent_decode(password).ok_or("malformed %-escape in the password")?;
    if user.is_empty() {
        return Err("authentication needs a user name".into());
    }
    Ok((user, password))
}

fn parse_host(host: &str, default_port: u16) -> std::result::Result<String, String> {
    if host.is_empty() {
        return Err("empty host in the host list".into());
    }
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let Some(end) = v6.find(']') else {
            return Err(format!("unclosed [ in host {host:?}"));
        };
        let after = &v6[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(format!("junk after ] in host {host:?}")),
        };
        (&host[..end + 2], port)
    } else {
        match host.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host, None),
        }
    };
    if name.is_empty() || name == "[]" {
        return Err(format!("empty host name in {host:?}"));
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || "/?#@%".contains(c))
    {
        return Err(format!("bad character in host {host:?}"));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("bad port {p:?} in host {host:?}"))?,
    };
    Ok(format!("{name}:{port}"))
}

/// Redacts the password of anything that looks like `scheme://user:password@host`, even text
/// that does not parse as a URL, for error messages about malformed input; and the value of
/// every query parameter whose name contains `password`.
pub fn redact(text: &str) -> String {
    redact_query(&redact_userinfo(text))
}

/// The password of `scheme://user:password@host`, redacted.
fn redact_userinfo(text: &str) -> String {
    let Some(scheme_end) = text.find("://") else {
        return text.to_owned();
    };
    let rest = &text[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return text.to_owned();
    };
    let userinfo = &authority[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &text[..scheme_end + 3],
            &userinfo[..colon],
            &rest[at..]
        ),
        None => text.to_owned(),
    }
}

/// The values of query parameters whose name says password (`sentinel_password=...`),
/// redacted.
fn redact_query(text: &str) -> String {
    let Some(q) = text.find('?') else {
        return text.to_owned();
    };
    let (head, query) = text.split_at(q + 1);
    let (query, fragment) = query.split_at(query.find('#').unwrap_or(query.len()));
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _))
                if key
                    .to_ascii_lowercase()
                    .replace("%5f", "_")
                    .contains("password") =>
            {
                format!("{key}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{head}{}{fragment}", pairs.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The password of the user part and of every query parameter that names one, in text
    /// that parses as a URL or not.
    #[test]
    fn redacts_passwords_in_text_and_parameters() {
        for (text, shown) in [
            (
                "redis+sentinel://:p@h/m?sentinel_password=s3&timeout_ms=5#f",
                "redis+sentinel://:***@h/m?sentinel_password=***&timeout_ms=5#f",
            ),
            ("x://h/?Password=a&b=c", "x://h/?Password=***&b=c"),
            ("x://h/?flag&b=c", "x://h/?flag&b=c"),
            (
                "x://h/?sentinel%5Fpassword=a",
                "x://h/?sentinel%5Fpassword=***",
            ),
            ("mysql://u:p@h:3306/db?x=1", "mysql://u:***@h:3306/db?x=1"),
            ("redis://:pw@h", "redis://:***@h"),
            ("redis://h:6379", "redis://h:6379"),
            ("not a url", "not a url"),
            ("zk://a:1,b:2/chroot", "zk://a:1,b:2/chroot"),
            ("x://u:p@w@h/", "x://u:***@h/"),
        ] {
            assert_eq!(redact(text), shown, "{text}");
        }
    }

    /// What a backend's `serde` feature adds: the URL read through the type's `from_url`, its
    /// refusals told without the password.
    #[cfg(feature = "serde")]
    #[test]
    fn configs_deserialize_through_from_url() {
        use serde::de::Deserialize;
        use serde::de::value::{Error as DeError, StrDeserializer};

        #[derive(Debug)]
        struct Config(RedactedUrl);

        impl Config {
            fn from_url(url: &str) -> Result<Self> {
                RedactedUrl::parse(url).map(Self)
            }
        }

        crate::deserialize_from_url!(Config);

        let read = |text| Config::deserialize(StrDeserializer::<DeError>::new(text));
        let config = read("redis://u:secret@h").unwrap();
        assert_eq!(config.0.expose().password(), Some("secret"));
        let refused = read("redis://u:secret@[bad/").unwrap_err().to_string();
        assert!(
            refused.contains("malformed URL") && !refused.contains("secret"),
            "{refused}"
        );
    }

    #[test]
    fn malformed_urls_are_config_errors_without_secrets() {
        let err = RedactedUrl::parse("redis://u:secret@[bad/").unwrap_err();
        assert!(matches!(err, Error::Config { .. }));
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn debug_and_display_hide_the_password() {
        let url =
            RedactedUrl::parse("mysql://root:hunter2@127.0.0.1/db?strategy=optimistic").unwrap();
        assert!(!format!("{url:?} {url}").contains("hunter2"));
        assert_eq!(url.store_id(), "mysql://127.0.0.1:3306/db");
    }

    #[test]
    fn store_ids_are_normalised() {
        let id = |u: &str| RedactedUrl::parse(u).unwrap().store_id();
        assert_eq!(
            id("mysql://DB.Example/app/"),
            id("mysql://db.example:3306/app")
        );
        assert_eq!(id("redis://Host"), "redis://host:6379");
        assert_eq!(id("redis://host:6379/"), "redis://host:6379");
        assert_eq!(id("redis://u:p@host:7000/1?x=y"), "redis://host:7000/1");
        assert_ne!(id("redis://host:7000"), id("redis://host:7001"));
        assert_eq!(id("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
    }
}
