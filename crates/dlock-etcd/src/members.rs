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
            // The members that come back come first (see `moves`): if one could not, none
            // leaves in this look, so the balance is never left empty.
            let mut kept_out = false;
            for (uri, back) in moves(&members, &out) {
                if kept_out && !back {
                    break;
                }
                if !change(&client, &uri, back).await {
                    kept_out |= back;
                    continue;
                }
                let member = members.iter().find(|m| m.uri == uri);
                let endpoint = member.map_or(uri.as_str(), |m| m.endpoint.as_str());
                if back {
                    tracing::info!(member = %endpoint, "etcd: a member answers again");
                    out.remove(&uri);
                } else {
                    tracing::warn!(
                        member = %endpoint,
                        "etcd: a member does not answer; its calls go to the others until it does"
                    );
                    out.insert(uri);
                }
            }
        }
    });
}

/// What the balance should change after a look, given the `members` and the ones `out` of it:
/// each `(uri, back)` puts a member back (`true`) or takes it out. A member leaves after
/// [`MISSES_TO_LEAVE`] missed looks and returns after [`ANSWERS_TO_RETURN`] answers; while
/// none answers, every member goes back; and the balance never ends up empty. The returns
/// come first.
fn moves(members: &[Member], out: &BTreeSet<String>) -> Vec<(String, bool)> {
    if members.iter().all(|m| m.misses > 0) {
        // None answers (this host is cut off, or the whole cluster is down).
        return members
            .iter()
            .filter(|m| out.contains(&m.uri))
            .map(|m| (m.uri.clone(), true))
            .collect();
    }
    let mut plan = Vec::new();
    for m in members.iter().filter(|m| out.contains(&m.uri)) {
        if m.answers >= ANSWERS_TO_RETURN {
            plan.push((m.uri.clone(), true));
        }
    }
    let returning = plan.len();
    let staying = members.iter().filter(|m| !out.contains(&m.uri));
    let (mut leaving, keeping): (Vec<&Member>, Vec<&Member>) =
        staying.partition(|m| m.misses >= MISSES_TO_LEAVE);
    // At least one member stays in: the one with the fewest misses, if all would leave.
    if keeping.is_empty() && returning == 0 {
        leaving.sort_by_key(|m| m.misses);
        if !leaving.is_empty() {
            leaving.remove(0);
        }
    }
    plan.extend(leaving.into_iter().map(|m| (m.uri.clone(), false)));
    plan
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

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, misses: u32, answers: u32) -> Member {
        Member {
            endpoint: name.to_owned(),
            uri: format!("http://{name}"),
            probe: None,
            misses,
            answers,
        }
    }

    fn out(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| format!("http://{n}")).collect()
    }

    fn plan(members: &[Member], left: &[&str]) -> Vec<(String, bool)> {
        moves(members, &out(left))
    }

    #[test]
    fn a_member_leaves_after_two_misses_and_returns_after_two_answers() {
        let one_miss = [member("a", 1, 0), member("b", 0, 5), member("c", 0, 5)];
        assert_eq!(plan(&one_miss, &[]), []);
        let two = [member("a", 2, 0), member("b", 0, 5), member("c", 0, 5)];
        assert_eq!(plan(&two, &[]), [("http://a".to_owned(), false)]);
        let one_answer = [member("a", 0, 1), member("b", 0, 5), member("c", 0, 5)];
        assert_eq!(plan(&one_answer, &["a"]), []);
        let back = [member("a", 0, 2), member("b", 0, 5), member("c", 0, 5)];
        assert_eq!(plan(&back, &["a"]), [("http://a".to_owned(), true)]);
    }

    #[test]
    fn when_none_answers_every_member_goes_back() {
        let none = [member("a", 9, 0), member("b", 1, 0), member("c", 3, 0)];
        let mut back = plan(&none, &["a", "c"]);
        back.sort();
        assert_eq!(
            back,
            [("http://a".to_owned(), true), ("http://c".to_owned(), true)]
        );
    }

    /// The last member in the balance stays even when it misses while one left out has
    /// answered once (not yet enough to come back): calls need an endpoint.
    #[test]
    fn the_balance_never_ends_up_empty() {
        let last = [member("a", 0, 1), member("b", 4, 0), member("c", 2, 0)];
        assert_eq!(plan(&last, &["a", "b"]), []);
        let both = [member("a", 0, 1), member("b", 3, 0), member("c", 2, 0)];
        assert_eq!(plan(&both, &["a"]), [("http://b".to_owned(), false)]);
    }
}
