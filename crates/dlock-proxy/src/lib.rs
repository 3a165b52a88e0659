#![doc = include_str!("../README.md")]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// What the proxy does to the traffic it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Forward everything as it comes.
    #[default]
    None,
    /// Delay every chunk, both ways.
    Latency(Duration),
    /// Move nothing either way; connections stay open and bytes wait (a partition).
    Partition,
    /// A host that went away: the open connections stall as in [`Partition`](Self::Partition),
    /// and new ones are closed as soon as they are accepted.
    Vanished,
    /// Move nothing from the client to the server (one-way partition).
    Upstream,
    /// Move nothing from the server to the client (one-way partition).
    Downstream,
    /// Delay the server's replies only.
    DelayReplies(Duration),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Up,
    Down,
}

impl Fault {
    /// Whether bytes going `dir` must wait.
    fn stalls(self, dir: Direction) -> bool {
        matches!(
            (self, dir),
            (Self::Partition | Self::Vanished, _)
                | (Self::Upstream, Direction::Up)
                | (Self::Downstream, Direction::Down)
        )
    }

    fn delay(self, dir: Direction) -> Duration {
        match (self, dir) {
            (Self::Latency(d), _) | (Self::DelayReplies(d), Direction::Down) => d,
            _ => Duration::ZERO,
        }
    }
}

struct Shared {
    fault: watch::Sender<Fault>,
    /// Cancelled (and replaced) by [`Proxy::reset`]: every connection opened before ends.
    reset: std::sync::Mutex<CancellationToken>,
    open: AtomicUsize,
    accepted: AtomicUsize,
}

/// A fault-injecting TCP proxy in front of one server. See the crate docs.
pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    _accept: AbortOnDropHandle<()>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("fault", &self.fault())
            .finish()
    }
}

impl Proxy {
    /// Starts a proxy on an ephemeral loopback port in front of `upstream`. Needs a tokio
    /// runtime; it runs until dropped.
    ///
    /// # Errors
    ///
    /// When `upstream` does not resolve or the local port cannot be bound.
    pub async fn start(upstream: impl ToSocketAddrs) -> io::Result<Self> {
        let upstream = tokio::net::lookup_host(upstream)
            .await?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no upstream address"))?;
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (fault, _) = watch::channel(Fault::None);
        let shared = Arc::new(Shared {
            fault,
            reset: std::sync::Mutex::new(CancellationToken::new()),
            open: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
        });
        let stop = CancellationToken::new();
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            Arc::clone(&shared),
            stop.clone(),
        ));
        Ok(Self {
            addr,
            upstream,
            shared,
            _accept: AbortOnDropHandle::new(accept),
            stop,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server behind the proxy.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Puts `fault` in force for every connection, open or new.
    pub fn set_fault(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
        tracing::debug!(proxy = %self.addr, ?fault, "dlock-proxy fault");
    }

    /// Resets every connection open now: both its ends get a TCP reset (RST), as from a
    /// middlebox or a host that lost the connection; new ones are accepted as usual.
    pub fn reset(&self) {
        let mut reset = self
            .shared
            .reset
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        reset.cancel();
        *reset = CancellationToken::new();
    }

    /// Connections open right now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted_connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((client, _)) = accepted else { continue };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if *shared.fault.borrow() == Fault::Vanished {
            drop(client);
            continue;
        }
        let reset = shared
            .reset
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let shared = Arc::clone(&shared);
        let stop = stop.clone();
        tokio::spawn(async move {
            shared.open.fetch_add(1, Ordering::SeqCst);
            tokio::select! {
                () = stop.cancelled() => {}
                () = connection(client, upstream, &shared, &reset) => {}
            }
            shared.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Forwards one connection until either side closes it, or until `reset`: then both sides get
/// a TCP reset (RST, as from a middlebox or a host that lost the connection's state), not an
/// orderly close.
async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    shared: &Shared,
    reset: &CancellationToken,
) {
    let server = tokio::select! {
        () = reset.cancelled() => {
            let _ = client.set_zero_linger();
            return;
        }
        server = TcpStream::connect(upstream) => match server {
            Ok(server) => server,
            Err(_) => return,
        },
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = pump(
        &mut client_read,
        &mut server_write,
        shared.fault.subscribe(),
        Direction::Up,
    );
    let down = pump(
        &mut server_read,
        &mut client_write,
        shared.fault.subscribe(),
        Direction::Down,
    );
    let was_reset = tokio::select! {
        () = up => false,
        () = down => false,
        () = reset.cancelled() => true,
    };
    if was_reset {
        // Whole again, a stream closes without the shutdown (FIN) a write half's drop sends,
        // and with a zero linger its close sends RST.
        for (read, write) in [(client_read, client_write), (server_read, server_write)] {
            if let Ok(stream) = read.reunite(write) {
                let _ = stream.set_zero_linger();
            }
        }
    }
}

/// Copies `from` to `to`, applying the fault in force to each chunk.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
    dir: Direction,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // A stalled direction does not even read: its bytes wait in the sockets.
        if fault.wait_for(|f| !f.stalls(dir)).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = fault.borrow().delay(dir);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        // Bytes read before a stall began are held back until it ends.
        if fault.wait_for(|f| !f.stalls(dir)).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server on an ephemeral port.
    async fn echo() -> io::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        Ok(addr)
    }

    /// Sends a ping and reads its echo: `None` if none came within `limit`.
    async fn round_trip(s: &mut TcpStream, limit: Duration) -> io::Result<Option<Vec<u8>>> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        match tokio::time::timeout(limit, s.read_exact(&mut buf)).await {
            Ok(read) => read.map(|_| Some(buf.to_vec())),
            Err(_elapsed) => Ok(None),
        }
    }

    /// Reads exactly `buf.len()` bytes within `limit`.
    async fn read_within(s: &mut TcpStream, buf: &mut [u8], limit: Duration) -> io::Result<()> {
        tokio::time::timeout(limit, s.read_exact(buf))
            .await
            .map_err(io::Error::other)?
            .map(drop)
    }

    #[tokio::test]
    async fn forwards_stalls_heals_and_resets() -> io::Result<()> {
        let proxy = Proxy::start(echo().await?).await?;
        let mut s = TcpStream::connect(proxy.addr()).await?;
        let long = Duration::from_secs(5);
        assert_eq!(
            round_trip(&mut s, long).await?.as_deref(),
            Some(&b"ping"[..])
        );

        proxy.set_fault(Fault::Partition);
        assert_eq!(round_trip(&mut s, Duration::from_millis(200)).await?, None);
        proxy.set_fault(Fault::None);
        // The stalled ping arrives once healed, as TCP would retransmit it.
        let mut buf = [0u8; 4];
        read_within(&mut s, &mut buf, long).await?;
        assert_eq!(&buf, b"ping");

        // A vanished host: the open connection stalls, a new one is closed at once.
        proxy.set_fault(Fault::Vanished);
        assert_eq!(round_trip(&mut s, Duration::from_millis(200)).await?, None);
        let mut turned_away = TcpStream::connect(proxy.addr()).await?;
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(long, turned_away.read(&mut byte))
            .await
            .map_err(io::Error::other)?;
        assert!(matches!(n, Ok(0) | Err(_)), "a new connection is closed");
        proxy.set_fault(Fault::None);
        read_within(&mut s, &mut buf, long).await?;

        proxy.set_fault(Fault::Downstream);
        assert_eq!(round_trip(&mut s, Duration::from_millis(200)).await?, None);
        proxy.set_fault(Fault::None);
        read_within(&mut s, &mut buf, long).await?;

        proxy.set_fault(Fault::DelayReplies(Duration::from_millis(300)));
        let started = tokio::time::Instant::now();
        assert!(round_trip(&mut s, long).await?.is_some());
        assert!(started.elapsed() >= Duration::from_millis(300));
        proxy.set_fault(Fault::None);

        assert_eq!(proxy.open_connections(), 1);
        proxy.reset();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(long, s.read(&mut buf))
            .await
            .map_err(io::Error::other)?;
        assert!(
            matches!(&n, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
            "a reset connection ends with a TCP reset, not an orderly close: {n:?}"
        );
        let mut again = TcpStream::connect(proxy.addr()).await?;
        assert!(round_trip(&mut again, long).await?.is_some());
        assert_eq!(proxy.accepted_connections(), 3);
        Ok(())
    }
}
