//! Which members the provider's calls go to. etcd-client spreads its calls over every endpoint
//! it was given, and keeps sending some to a member that refuses connections (a member that
//! died) or accepts them and stays silent (a host gone behind a middlebox): those calls fail,
//! or wait for their time limit, although other members answer. A task per provider asks each
//! member for its status every [`LOOK_EVERY`], all at once, each on a connection of its own
//! without credentials, and takes a member out of the client's balance once it has missed
//! [`MISSES_TO_LEAVE`] looks in a row, until it has answered [`ANSWERS_TO_RETURN`] in a row;
//! never the last one (then calls fail and are retried as before). A member answers a look
//! when a status comes back within [`ANSWER_WITHIN`] naming a leader, or when it refuses the
//! request itself (a cluster with authentication may keep its status from a client that did
//! not log in): only a connection that fails or stays silent, or a member with no leader,
//! misses. etcd's Go client skips such members the same way (gRPC's health of its
//! sub-connections).

use std::collections::BTreeSet;
use std::sync::Weak;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::task::JoinSet;
use tokio::time::{MissedTickBehavior, interval, timeout};
use tonic::Code;

use crate::session::Session;

/// How often each member is asked.
pub(crate) const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long a member may take to answer a look, and the balance to take a change.
pub(crate) const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Looks in a row a member misses before its calls go to the others.
pub(crate) const MISSES_TO_LEAVE: u32 = 2;

/// Looks in a row a member left out answers before it takes calls again.
pub(crate) const ANSWERS_TO_RETURN: u32 = 2;

/// Starts the task that keeps `client`'s balance to the members of `endpoints` that answer
/// (each `host:port`, reached with `scheme`, `http://` or `https://`, unless it names its
/// own; `probe` the options of the connections that ask them); it ends with the session.
/// Nothing to do for one endpoint.
pub(crate) fn watch(
    session: Weak<Session>,
    client: Client,
    endpoints: Vec<String>,
    scheme: &'static str,
    probe: ConnectOptions,
) {
    if endpoints.len() < 2 {
        return;
    }
    let mut members = Vec::with_capacity(endpoints.len());
    for endpoint in endpoints {
        let named = endpoint.starts_with("http://") || endpoint.starts_with("https://");
        let uri = if named {
            endpoint.clone()
        } else {
            format!("{scheme}{endpoint}")
        };
        members.push(Member {
            endpoint,
            uri,
            probe: None,
            misses: 0,
            answers: 0,
        });
    }
    tokio::spawn(async move {
        let mut out: BTreeSet<String> = BTreeSet::new();
        let mut tick = interval(LOOK_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if session.strong_count() == 0 {
                return;
            }
            look_at_all(&mut members, &probe).await;
            if session.strong_count() == 0 {
                return;
            }
            if members.iter().all(|m| m.misses > 0) {
                // None answers (this host is cut off, or the whole cluster is down): every
                // member stays, or goes back, in the balance.
                for m in &members {
                    if out.contains(&m.uri) && change(&client, &m.uri, true).await {
                        out.remove(&m.uri);
                    }
                }
                continue;
            }
            for m in &members {
                let left = out.contains(&m.uri);
                if !left && m.misses >= MISSES_TO_LEAVE && change(&client, &m.uri, false).await {
                    tracing::warn!(
                        member = %m.endpoint,
                        "etcd: a member does not answer; its calls go to the others until it does"
                    );
                    out.insert(m.uri.clone());
                } else if left
                    && m.answers >= ANSWERS_TO_RETURN
                    && change(&client, &m.uri, true).await
                {
                    tracing::info!(member = %m.endpoint, "etcd: a member answers again");
                    out.remove(&m.uri);
                }
            }
        }
    });
}

/// Puts `uri` back in `client`'s balance (`back`) or takes it out: whether the balance took
/// the change within [`ANSWER_WITHIN`]. (The balance reads its changes only when a call is
/// made: a change that waits is given up, and tried again at the next look.)
async fn change(client: &Client, uri: &str, back: bool) -> bool {
    let changed = if back {
        timeout(ANSWER_WITHIN, client.add_endpoint(uri)).await
    } else {
        timeout(ANSWER_WITHIN, client.remove_endpoint(uri)).await
    };
    matches!(changed, Ok(Ok(())))
}

/// Asks every member at once, and counts its answers and misses in a row.
async fn look_at_all(members: &mut [Member], options: &ConnectOptions) {
    let mut looks = JoinSet::new();
    for (i, m) in members.iter_mut().enumerate() {
        let probe = match &m.probe {
            Some(p) => p.clone(),
            // Opened once and kept: the client connects (and connects again) by itself.
            None => match Client::connect([m.endpoint.as_str()], Some(options.clone())).await {
                Ok(p) => {
                    m.probe = Some(p.clone());
                    p
                }
                Err(_) => {
                    m.missed();
                    continue;
                }
            },
        };
        looks.spawn(async move { (i, answers(probe).await) });
    }
    while let Some(done) = looks.join_next().await {
        let Ok((i, answered)) = done else { continue };
        if let Some(m) = members.get_mut(i) {
            if answered {
                m.answered();
            } else {
                m.missed();
            }
        }
    }
}

/// Whether the member behind `probe` answers a status request within [`ANSWER_WITHIN`]: with a
/// leader, or with a refusal of its own.
async fn answers(mut probe: Client) -> bool {
    match timeout(ANSWER_WITHIN, probe.status()).await {
        Ok(Ok(status)) => status.leader() != 0,
        Ok(Err(etcd_client::Error::GRpcStatus(s))) => !matches!(
            s.code(),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
        ),
        Ok(Err(_)) | Err(_) => false,
    }
}

/// One member, the client that asks it, and how its looks went.
struct Member {
    endpoint: String,
    /// The endpoint as the client's balance names it.
    uri: String,
    probe: Option<Client>,
    /// Looks missed in a row.
    misses: u32,
    /// Looks answered in a row.
    answers: u32,
}

impl Member {
    fn missed(&mut self) {
        self.misses = self.misses.saturating_add(1);
        self.answers = 0;
    }

    fn answered(&mut self) {
        self.answers = self.answers.saturating_add(1);
        self.misses = 0;
    }
}
