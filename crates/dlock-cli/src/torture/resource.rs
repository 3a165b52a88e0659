//! The shared resource the workers write to while they hold a lock: a tiny TCP server of the
//! harness with a fenced counter per name (writes carrying a token not above the last accepted
//! one are refused) and an unfenced one (every write lands), so a run shows both what fencing
//! prevents and what the lock alone would have let through.
//!
//! Protocol, one line each way: `GET name` → `V value`; `PUT name token value` → `OK` or
//! `STALE last`; `UGET name` → `V value`; `UPUT name value` → `OK`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use dlock::backend::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::task::AbortOnDropHandle;

use super::history::{Accepted, now_ns};

#[derive(Debug, Default)]
struct Cell {
    value: u64,
    last_token: u64,
}

/// What the resource saw, for the checker.
#[derive(Debug, Default, Clone)]
pub(crate) struct Ledger {
    /// Every accepted fenced write, in order.
    pub(crate) accepted: Vec<Accepted>,
    /// Fenced writes refused as stale.
    pub(crate) refused: u64,
    /// Final fenced value per name.
    pub(crate) fenced: HashMap<String, u64>,
    /// Final unfenced value per name, and how many unfenced writes it got.
    pub(crate) unfenced: HashMap<String, (u64, u64)>,
}

#[derive(Debug, Default)]
struct State {
    fenced: HashMap<String, Cell>,
    unfenced: HashMap<String, (u64, u64)>,
    ledger: Ledger,
}

/// The running resource server.
pub(crate) struct Resource {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    _task: AbortOnDropHandle<()>,
}

impl Resource {
    /// Starts the server on an ephemeral loopback port.
    pub(crate) async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let accept_state = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, Arc::clone(&accept_state)));
            }
        });
        Ok(Self {
            addr,
            state,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// Where workers connect.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it saw so far.
    pub(crate) fn ledger(&self) -> Ledger {
        let state = self.state.lock();
        let mut ledger = state.ledger.clone();
        ledger.fenced = state
            .fenced
            .iter()
            .map(|(n, c)| (n.clone(), c.value))
            .collect();
        ledger.unfenced = state.unfenced.clone();
        ledger
    }
}

async fn serve(socket: TcpStream, state: Arc<Mutex<State>>) {
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = answer(&line, &state);
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn answer(line: &str, state: &Mutex<State>) -> String {
    let mut state = state.lock();
    let words: Vec<&str> = line.split(' ').collect();
    let number = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
    match (words.first().copied(), words.get(1)) {
        (Some("GET"), Some(name)) => {
            let v = state.fenced.get(*name).map_or(0, |c| c.value);
            format!("V {v}\n")
        }
        (Some("PUT"), Some(name)) => {
            let (Some(token), Some(value)) = (number(2), number(3)) else {
                return "ERR bad PUT\n".into();
            };
            let cell = state.fenced.entry((*name).to_owned()).or_default();
            if token <= cell.last_token {
                let last = cell.last_token;
                state.ledger.refused += 1;
                return format!("STALE {last}\n");
            }
            cell.last_token = token;
            cell.value = value;
            state.ledger.accepted.push(Accepted {
                t: now_ns(),
                name: (*name).to_owned(),
                token,
                value,
            });
            "OK\n".into()
        }
        (Some("UGET"), Some(name)) => {
            let v = state.unfenced.get(*name).map_or(0, |c| c.0);
            format!("V {v}\n")
        }
        (Some("UPUT"), Some(name)) => {
            let Some(value) = number(2) else {
                return "ERR bad UPUT\n".into();
            };
            let cell = state.unfenced.entry((*name).to_owned()).or_default();
            cell.0 = value;
            cell.1 += 1;
            "OK\n".into()
        }
        _ => "ERR unknown command\n".into(),
    }
}

/// A worker's connection to the resource.
pub(crate) struct Client {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Client {
    pub(crate) async fn connect(addr: &str) -> std::io::Result<Self> {
        let (read, write) = TcpStream::connect(addr).await?.into_split();
        Ok(Self {
            lines: BufReader::new(read).lines(),
            write,
        })
    }

    async fn ask(&mut self, line: String) -> std::io::Result<String> {
        self.write.write_all(line.as_bytes()).await?;
        self.lines.next_line().await?.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the resource went away")
        })
    }

    fn value(reply: &str) -> std::io::Result<u64> {
        reply
            .strip_prefix("V ")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("unexpected reply {reply:?}")))
    }

    /// Read-modify-write of the fenced counter: true if the write was accepted.
    pub(crate) async fn fenced_increment(
        &mut self,
        name: &str,
        token: u64,
    ) -> std::io::Result<bool> {
        let v = Self::value(&self.ask(format!("GET {name}\n")).await?)?;
        let reply = self
            .ask(format!("PUT {name} {token} {}\n", v.saturating_add(1)))
            .await?;
        Ok(reply == "OK")
    }

    /// Read-modify-write of the unfenced counter.
    pub(crate) async fn unfenced_increment(&mut self, name: &str) -> std::io::Result<()> {
        let v = Self::value(&self.ask(format!("UGET {name}\n")).await?)?;
        self.ask(format!("UPUT {name} {}\n", v.saturating_add(1)))
            .await
            .map(|_| ())
    }
}
