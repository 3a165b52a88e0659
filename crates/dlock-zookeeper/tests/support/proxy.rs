//! A TCP proxy to a ZooKeeper server that a test can block: while blocked, every connection
//! through it is dropped and new ones are refused, so a client behind it cannot reconnect.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dlock_zookeeper::ZkConfig;
use tokio::task::JoinHandle;

/// A proxy to the first server of a config; see the module docs.
pub(crate) struct BlockingProxy {
    port: u16,
    blocked: Arc<AtomicBool>,
    /// Connections accepted, refused ones included: each is a client's attempt.
    attempts: Arc<AtomicUsize>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl BlockingProxy {
    /// A proxy to the first server of `config`, open.
    pub(crate) async fn start(config: &ZkConfig) -> Self {
        let upstream = config.hosts[0].clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let blocked = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let attempts: Arc<AtomicUsize> = Arc::default();
        let accept = {
            let (blocked, conns) = (Arc::clone(&blocked), Arc::clone(&conns));
            let attempts = Arc::clone(&attempts);
            tokio::spawn(async move {
                loop {
                    let Ok((mut down, _)) = listener.accept().await else {
                        return;
                    };
                    attempts.fetch_add(1, Ordering::SeqCst);
                    if blocked.load(Ordering::SeqCst) {
                        continue; // dropped: refused
                    }
                    let upstream = upstream.clone();
                    conns.lock().unwrap().push(tokio::spawn(async move {
                        if let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                        }
                    }));
                }
            })
        };
        Self {
            port,
            blocked,
            attempts,
            conns,
            accept,
        }
    }

    /// `host:port` of the proxy, for a URL.
    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Connections attempted through the proxy so far, refused ones included.
    pub(crate) fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    /// Drops every connection and refuses new ones.
    pub(crate) fn block(&self) {
        self.blocked.store(true, Ordering::SeqCst);
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
    }

    /// Accepts connections again.
    pub(crate) fn unblock(&self) {
        self.blocked.store(false, Ordering::SeqCst);
    }
}

impl Drop for BlockingProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.block();
    }
}
