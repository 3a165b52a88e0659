//! A private 3-member cluster of a test's own whose members talk to each other through a
//! switchboard of the test's: a relay in front of each member's peer port that can sever one
//! member's raft traffic, both ways, while it answers its clients as before.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use dlock_conformance::eventually;
use dlock_conformance::tls::free_port;
use dlock_etcd::etcd_client::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The member cut off, if any: its index, and its member id as etcd's peers name it in the
/// `X-Server-From` header of their raft requests (hexadecimal).
type Cut = Option<(usize, String)>;

/// A relay in front of each member's peer port: the port each member advertises to its
/// peers. Every peer connection passes through it, whichever member dialed.
///
/// Cutting a member off severs every connection to it (so nothing reaches it: raft messages
/// to a member travel on connections it dialed, or on ones dialed to it) and every
/// connection whose first request names it in `X-Server-From` (its raft streams and
/// messages), and refuses new ones. A connection it opened with a request that names
/// nobody (a health probe, a forwarded lease renewal) is left alone: what comes back on it
/// is no raft state.
struct Switchboard {
    ports: Vec<u16>,
    cut: watch::Sender<Cut>,
    relays: Vec<JoinHandle<()>>,
}

impl Switchboard {
    async fn start(upstreams: &[u16]) -> Self {
        let (cut, _) = watch::channel(None);
        let mut ports = Vec::new();
        let mut relays = Vec::new();
        for (index, &up) in upstreams.iter().enumerate() {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            ports.push(listener.local_addr().unwrap().port());
            let upstream = SocketAddr::from(([127, 0, 0, 1], up));
            relays.push(tokio::spawn(front(
                listener,
                index,
                upstream,
                cut.subscribe(),
            )));
        }
        Self { ports, cut, relays }
    }

    /// Cuts member `index` (id `id`) off, as the type's docs say.
    fn cut_off(&self, index: usize, id: String) {
        self.cut.send_replace(Some((index, id)));
    }
}

impl Drop for Switchboard {
    fn drop(&mut self) {
        for r in &self.relays {
            r.abort();
        }
    }
}

async fn front(
    listener: TcpListener,
    index: usize,
    upstream: SocketAddr,
    cut: watch::Receiver<Cut>,
) {
    while let Ok((conn, _)) = listener.accept().await {
        tokio::spawn(relay(conn, index, upstream, cut.clone()));
    }
}

/// The member id in the `X-Server-From` header of an HTTP request head.
fn dialed_by(head: &[u8]) -> Option<String> {
    String::from_utf8_lossy(head).lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("x-server-from")
            .then(|| value.trim().to_ascii_lowercase())
    })
}

/// Relays one peer connection to member `index`. The head of its first request names the
/// member that dialed: every later request on it comes from the same process.
async fn relay(
    mut conn: TcpStream,
    index: usize,
    upstream: SocketAddr,
    mut cut: watch::Receiver<Cut>,
) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 * 1024 {
            return;
        }
    }
    let from = dialed_by(&head);
    let severed =
        |c: &Cut| matches!(c, Some((i, id)) if *i == index || from.as_deref() == Some(id.as_str()));
    if severed(&cut.borrow()) {
        return;
    }
    let Ok(mut up) = TcpStream::connect(upstream).await else {
        return;
    };
    if up.write_all(&head).await.is_err() {
        return;
    }
    // The cut first: once it is made, not one more byte goes through.
    tokio::select! {
        biased;
        _ = cut.wait_for(severed) => {}
        _ = tokio::io::copy_bidirectional(&mut conn, &mut up) => {}
    }
}

/// A private 3-member cluster on loopback ports nobody uses, its peers talking through a
/// [`Switchboard`]; killed and deleted when dropped.
pub(crate) struct PrivateCluster {
    dir: PathBuf,
    clients: Vec<u16>,
    board: Switchboard,
    members: Vec<Child>,
    /// Keep the data and logs when dropped (a start that failed).
    keep: bool,
}

impl PrivateCluster {
    /// Starts the members and waits until each serves. A member that exits first (a port
    /// taken between the test's choice and the member's bind) makes it start over with other
    /// ports, at most three times.
    pub(crate) async fn start() -> Self {
        let mut why = String::new();
        for attempt in 1..=3 {
            let mut cluster = Self::spawn(attempt).await;
            match cluster.await_serving().await {
                Ok(()) => return cluster,
                Err(e) => {
                    eprintln!(
                        "the private cluster did not start (attempt {attempt}): {e}; its data \
                         and logs are kept in {}",
                        cluster.dir.display()
                    );
                    cluster.keep = true;
                    why = e;
                }
            }
        }
        panic!("the private cluster did not start in three attempts; the last: {why}");
    }

    async fn spawn(attempt: u32) -> Self {
        let dir =
            std::env::temp_dir().join(format!("dlock-etcd-cut-{}-{attempt}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let peers: Vec<u16> = (0..3)
            .map(|_| free_port().expect("a free loopback port"))
            .collect();
        let clients: Vec<u16> = (0..3)
            .map(|_| free_port().expect("a free loopback port"))
            .collect();
        let board = Switchboard::start(&peers).await;
        let initial = board
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{i}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for i in 0..3 {
            let log = std::fs::File::create(dir.join(format!("m{i}.log"))).unwrap();
            let child = Command::new("etcd")
                .arg(format!("--name=m{i}"))
                .arg(format!(
                    "--data-dir={}",
                    dir.join(format!("m{i}")).display()
                ))
                .arg(format!(
                    "--listen-client-urls=http://127.0.0.1:{}",
                    clients[i]
                ))
                .arg(format!(
                    "--advertise-client-urls=http://127.0.0.1:{}",
                    clients[i]
                ))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{}", peers[i]))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                    board.ports[i]
                ))
                .arg(format!("--initial-cluster={initial}"))
                .arg("--initial-cluster-state=new")
                // Slower elections than the defaults (100 ms, 1 s), so the leader stays put on
                // a loaded machine while the case runs.
                .args(["--heartbeat-interval=250", "--election-timeout=2500"])
                .arg(format!(
                    "--initial-cluster-token=dlock-cut-{}-{attempt}",
                    std::process::id()
                ))
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .expect("etcd runs");
            members.push(child);
        }
        Self {
            dir,
            clients,
            board,
            members,
            keep: false,
        }
    }

    /// Waits until every member answers a status call (polled for 30 s at most, then the
    /// case fails); an error at once if a member exits, so that `start` tries other ports.
    async fn await_serving(&mut self) -> Result<(), String> {
        let endpoints: Vec<String> = (0..3).map(|i| self.endpoint(i)).collect();
        let serving = eventually(
            Duration::from_secs(30),
            "every member of the private cluster serves",
            || async {
                for endpoint in &endpoints {
                    // A member without a quorum accepts a connection and never answers.
                    let status = tokio::time::timeout(Duration::from_secs(2), async {
                        Client::connect([endpoint.as_str()], None)
                            .await?
                            .status()
                            .await
                    })
                    .await;
                    match status {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Err(format!("{endpoint}: {e}")),
                        Err(_) => return Err(format!("{endpoint} did not answer within 2 s")),
                    }
                }
                Ok(())
            },
        );
        let [m0, m1, m2] = &mut self.members[..] else {
            return Err(format!("{} members, not 3", self.members.len()));
        };
        let (i, status) = tokio::select! {
            biased;
            s = m0.wait() => (0, s),
            s = m1.wait() => (1, s),
            s = m2.wait() => (2, s),
            () = serving => return Ok(()),
        };
        let log = std::fs::read_to_string(self.dir.join(format!("m{i}.log"))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        Err(format!("member m{i} exited ({status:?}): {tail:?}"))
    }

    /// Cuts member `index` (id `id`, in hexadecimal) off from the other two, as the
    /// [`Switchboard`]'s docs say.
    pub(crate) fn cut_off(&self, index: usize, id: String) {
        self.board.cut_off(index, id);
    }

    /// Member `i`'s client address.
    pub(crate) fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.clients[i])
    }

    /// Once every member serves and they agree on a leader: a follower's index and member id.
    pub(crate) async fn follower(&self) -> (usize, u64) {
        eventually(
            Duration::from_secs(30),
            "the private cluster serves, with a leader",
            || async {
                let mut ids = Vec::new();
                let mut leaders = Vec::new();
                for i in 0..3 {
                    let mut c = Client::connect([self.endpoint(i)], None)
                        .await
                        .map_err(|e| e.to_string())?;
                    let s = c.status().await.map_err(|e| e.to_string())?;
                    ids.push(s.header().map_or(0, |h| h.member_id()));
                    leaders.push(s.leader());
                }
                let leader = leaders[0];
                if leader == 0 || leaders.iter().any(|l| *l != leader) {
                    return Err(format!("leaders as seen by each member: {leaders:x?}"));
                }
                ids.iter()
                    .position(|id| *id != leader)
                    .map(|i| (i, ids[i]))
                    .ok_or_else(|| format!("no follower among {ids:x?}"))
            },
        )
        .await
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.start_kill();
        }
        // Gone before their files are: a member still writing would keep the directory. The
        // test's runtime has worker threads (a drop on it may block one for the wait).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let members = &mut self.members;
            tokio::task::block_in_place(|| {
                runtime.block_on(async {
                    let _ = tokio::time::timeout(Duration::from_secs(10), async {
                        for m in members.iter_mut() {
                            let _ = m.wait().await;
                        }
                    })
                    .await;
                });
            });
        }
        if self.keep || std::thread::panicking() {
            eprintln!(
                "the members' data and logs are kept in {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
