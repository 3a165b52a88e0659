//! A [`Partition`] for any TCP store: a [`dlock_proxy::Proxy`] between one client and the
//! server.

use std::time::Duration;

use dlock_core::{Error, Result};
use dlock_proxy::{Fault, Proxy};

use crate::Partition;

/// A fault-injecting proxy in front of one server, as a [`Partition`]: partitioned, it moves
/// no bytes either way while the connections stay open, as a lost network does.
#[derive(Debug)]
pub struct ProxyPartition {
    proxy: Proxy,
}

impl ProxyPartition {
    /// Starts a proxy in front of the server `url` names (its host and port) and returns it
    /// with `url` rewritten to go through it. Only single-server URLs can be proxied.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if `url` has no single host and port; [`Error::Backend`] if the proxy
    /// cannot listen.
    pub async fn start(url: &str, default_port: u16) -> Result<(Self, String)> {
        let mut parsed = url::Url::parse(url).map_err(|e| Error::config(format!("{url}: {e}")))?;
        let host = parsed
            .host_str()
            .filter(|h| !h.contains(','))
            .ok_or_else(|| Error::config(format!("{url}: not a single host")))?
            .to_owned();
        let port = parsed.port().unwrap_or(default_port);
        let proxy = Proxy::start((host.as_str(), port))
            .await
            .map_err(|e| Error::backend("dlock-proxy", "cannot start the proxy", true, e))?;
        let addr = proxy.addr();
        parsed
            .set_ip_host(addr.ip())
            .and_then(|()| parsed.set_port(Some(addr.port())))
            .map_err(|()| Error::config(format!("{url}: cannot point it at the proxy")))?;
        Ok((Self { proxy }, parsed.to_string()))
    }
}

impl ProxyPartition {
    /// Delays every reply of the server by `delay` (a slow network or a loaded server), or
    /// forwards them as they come again (`Duration::ZERO`).
    pub fn delay_replies(&self, delay: Duration) {
        self.proxy.set_fault(if delay.is_zero() {
            Fault::None
        } else {
            Fault::DelayReplies(delay)
        });
    }
}

impl Partition for ProxyPartition {
    fn set_partitioned(&self, partitioned: bool) {
        self.proxy.set_fault(if partitioned {
            Fault::Partition
        } else {
            Fault::None
        });
    }
}
