//! Which members the provider's calls go to. etcd-client spreads its calls over every endpoint
//! it was given, and keeps sending some to a member that refuses connections (a member that
//! died) or accepts them and stays silent (a host gone behind a middlebox): those calls fail,
//! or wait for their time limit, although other members answer. A task per provider asks each
//! member for its status on a connection of its own, every [`LOOK_EVERY`], and takes a member
//! that does not answer within [`ANSWER_WITHIN`], or has no leader, out of the client's
//! balance until it answers again; never the last one (then calls fail and are retried as
//! before). etcd's Go client skips such members the same way (gRPC's health of its
//! sub-connections).

use std::collections::BTreeSet;
use std::sync::Weak;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::time::{MissedTickBehavior, interval, timeout};

use crate::session::Session;

/// How often each member is asked.
pub(crate) const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long a member may take to answer a look.
pub(crate) const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Starts the task that keeps `client`'s balance to the members of `endpoints` that answer
/// (each `host:port`, reached with `scheme`, `http://` or `https://`, and `options`); it ends
/// with the session. Nothing to do for one endpoint.
pub(crate) fn watch(
    session: Weak<Session>,
    client: Client,
    endpoints: Vec<String>,
    scheme: &'static str,
    options: ConnectOptions,
) {
    if endpoints.len() < 2 {
        return;
    }
    let options = options
        .with_timeout(ANSWER_WITHIN)
        .with_connect_timeout(ANSWER_WITHIN)
        .with_require_leader(false);
    tokio::spawn(async move {
        let mut members: Vec<Member> = endpoints
            .into_iter()
            .map(|endpoint| Member {
                uri: format!("{scheme}{endpoint}"),
                endpoint,
                probe: None,
            })
            .collect();
        let mut out: BTreeSet<String> = BTreeSet::new();
        let mut tick = interval(LOOK_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(s) = session.upgrade() else { return };
            drop(s);
            let mut answering = Vec::with_capacity(members.len());
            for m in &mut members {
                answering.push(m.answers(&options).await);
            }
            if !answering.iter().any(|a| *a) {
                // None answers (this host is cut off, or the whole cluster is down): every
                // member stays, or goes back, in the balance.
                for m in &members {
                    if out.remove(&m.uri) {
                        let _ = client.add_endpoint(&m.uri).await;
                    }
                }
                continue;
            }
            for (m, answers) in members.iter().zip(answering) {
                let moved = match (answers, out.contains(&m.uri)) {
                    (false, false) => client.remove_endpoint(&m.uri).await.is_ok(),
                    (true, true) => client.add_endpoint(&m.uri).await.is_ok(),
                    _ => false,
                };
                if !moved {
                    continue;
                }
                if answers {
                    tracing::info!(member = %m.endpoint, "etcd: a member answers again");
                    out.remove(&m.uri);
                } else {
                    tracing::warn!(
                        member = %m.endpoint,
                        "etcd: a member does not answer; its calls go to the others until it does"
                    );
                    out.insert(m.uri.clone());
                }
            }
        }
    });
}

/// One member, and the client that asks it (opened at its first look, and again after a
/// look that failed).
struct Member {
    endpoint: String,
    /// The endpoint as the client's balance names it.
    uri: String,
    probe: Option<Client>,
}

impl Member {
    /// Whether the member answers a status request within [`ANSWER_WITHIN`] with a leader.
    async fn answers(&mut self, options: &ConnectOptions) -> bool {
        let probe = match self.probe.take() {
            Some(p) => p,
            None => {
                let connect = Client::connect([self.endpoint.as_str()], Some(options.clone()));
                match timeout(ANSWER_WITHIN, connect).await {
                    Ok(Ok(p)) => p,
                    _ => return false,
                }
            }
        };
        let mut probe = probe;
        let answered = timeout(ANSWER_WITHIN, probe.status()).await;
        let led = matches!(&answered, Ok(Ok(status)) if status.leader() != 0);
        if led {
            self.probe = Some(probe);
        }
        led
    }
}
