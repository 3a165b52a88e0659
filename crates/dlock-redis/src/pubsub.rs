//! One subscription connection per provider, shared by every waiter of that provider.
//!
//! Redisson opens a subscription per waiting lock and wakes every waiter of a lock on each
//! release. Here all waiters of a provider share one RESP3 connection; a message is routed to
//! the waiters registered for its channel, and an unlock message wakes exactly one of them
//! (a read-unlock message wakes them all, since readers can share). A waiter that was woken but
//! gave up before trying passes the wake-up on, so no release is lost.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use dlock_core::Result;
use dlock_core::backend::{Backoff, Mutex, cleanup};
use redis::{PushInfo, PushKind};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use crate::call::text;
use crate::config::RedisConfig;
use crate::conn::Conn;

/// Redisson's unlock message: wakes one waiter.
pub(crate) const UNLOCK: &str = "0";
/// Redisson's read-unlock message (sent when a write hold ends): wakes every waiter.
pub(crate) const READ_UNLOCK: &str = "1";

#[derive(Debug)]
struct Waiter {
    id: u64,
    notify: Arc<Notify>,
    /// Woken and not yet done trying.
    signalled: Arc<AtomicBool>,
}

impl Waiter {
    fn wake(&self) {
        self.signalled.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

/// What a channel's messages mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ChannelKind {
    /// Lock channels: `0` wakes one waiter, `1` (a write unlock) wakes all.
    #[default]
    Lock,
    /// Semaphore channels: the message is the number of available permits; that many
    /// waiters are woken.
    Semaphore,
}

#[derive(Debug, Default)]
struct Channel {
    kind: ChannelKind,
    waiters: Vec<Waiter>,
    /// Serializes this channel's SUBSCRIBE and UNSUBSCRIBE, so that its flags match the
    /// server; other channels' go on meanwhile. The entry outlives every operation on it: it
    /// is removed only under this lock, with no waiter, after its UNSUBSCRIBE.
    ops: Arc<tokio::sync::Mutex<()>>,
    subscribed: bool,
    /// Bumped whenever the server may have ended the subscription (a disconnection, an
    /// unsubscription it pushed): a SUBSCRIBE answered after such an event, but sent before
    /// it, proves nothing.
    epoch: u64,
    /// A SUBSCRIBE was sent and not answered (in time, or before its waiter was cancelled):
    /// the server may be subscribed all the same, so the last waiter to leave unsubscribes.
    maybe: bool,
}

#[derive(Debug, Default)]
struct Registry {
    channels: Mutex<HashMap<String, Channel>>,
    ids: AtomicU64,
    /// Messages routed, for tests and the benchmark.
    delivered: AtomicU64,
    /// Told of every disconnection: the provider then checks its holds.
    disconnects: Arc<Notify>,
}

impl Registry {
    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock()
    }

    /// Called by the connection for every pushed message.
    fn dispatch(&self, info: PushInfo) {
        match info.kind {
            PushKind::Message | PushKind::SMessage => {
                let mut data = info.data.into_iter();
                let (Some(channel), Some(payload)) = (data.next(), data.next()) else {
                    return;
                };
                let (Some(channel), Some(payload)) = (text(&channel), text(&payload)) else {
                    return;
                };
                self.delivered.fetch_add(1, Ordering::Relaxed);
                let channels = self.channels();
                let Some(chan) = channels.get(&channel) else {
                    return;
                };
                match chan.kind {
                    ChannelKind::Lock if payload == READ_UNLOCK => {
                        chan.waiters.iter().for_each(Waiter::wake);
                    }
                    ChannelKind::Lock => wake_unsignalled(&chan.waiters, 1),
                    ChannelKind::Semaphore => {
                        let free = payload.parse::<usize>().unwrap_or(1).max(1);
                        wake_unsignalled(&chan.waiters, free);
                    }
                }
            }
            // Messages may have been missed while disconnected: everyone tries again, and
            // every channel is subscribed anew by its next waiter (which also makes the
            // connection reconnect, instead of trusting a subscription that died with it).
            // A channel that was subscribed may be subscribed anew by the client after the
            // reconnect (it resubscribes what it tracks): it stays `maybe`, so that an
            // UNSUBSCRIBE is still sent when its last waiter leaves (or, for one nobody waits
            // on, by the task trying its failed UNSUBSCRIBE again).
            PushKind::Disconnection => {
                self.disconnects.notify_one();
                for chan in self.channels().values_mut() {
                    chan.maybe = chan.subscribed || chan.maybe;
                    chan.subscribed = false;
                    chan.epoch = chan.epoch.wrapping_add(1);
                    chan.waiters.iter().for_each(Waiter::wake);
                }
            }
            // The server ended a subscription: a cluster node that lost the channel's slot
            // (a resharding, a manual failover) unsubscribes its shard channels over a
            // connection that stays up. The waiters subscribe again (at the slot's new owner)
            // on their next round, which they start now. The confirmation of this provider's
            // own UNSUBSCRIBE says the same; one of an UNSUBSCRIBE given up on lets its
            // channel be forgotten.
            PushKind::Unsubscribe | PushKind::SUnsubscribe => {
                let Some(channel) = info.data.first().and_then(text) else {
                    return;
                };
                let mut channels = self.channels();
                if let Some(chan) = channels.get_mut(&channel) {
                    chan.subscribed = false;
                    chan.maybe = false;
                    chan.epoch = chan.epoch.wrapping_add(1);
                    chan.waiters.iter().for_each(Waiter::wake);
                }
            }
            _ => {}
        }
    }
}

fn wake_unsignalled(waiters: &[Waiter], count: usize) {
    waiters
        .iter()
        .filter(|w| !w.signalled.load(Ordering::SeqCst))
        .take(count)
        .for_each(Waiter::wake);
}

/// The shared subscription connection and its waiter registry.
#[derive(Debug)]
pub(crate) struct Subscriptions {
    conn: Conn,
    registry: Arc<Registry>,
}

impl Subscriptions {
    pub(crate) async fn connect(config: &RedisConfig) -> Result<Arc<Self>> {
        let registry = Arc::new(Registry::default());
        let sink = Arc::clone(&registry);
        let push = move |info: PushInfo| {
            sink.dispatch(info);
            Ok::<(), std::convert::Infallible>(())
        };
        let push = Arc::new(push);
        let conn = Conn::connect(config, Some(push)).await?;
        Ok(Arc::new(Self { conn, registry }))
    }

    /// Notified after every disconnection of the subscription connection (a restart, a
    /// failover, a network cut): holds may be gone.
    pub(crate) fn disconnects(&self) -> Arc<Notify> {
        Arc::clone(&self.registry.disconnects)
    }

    /// Pings the subscription connection (which reconnects it if it broke).
    pub(crate) async fn ping(&self) -> Result<()> {
        self.conn.ping().await
    }

    /// Messages delivered to this provider so far.
    pub(crate) fn delivered(&self) -> u64 {
        self.registry.delivered.load(Ordering::Relaxed)
    }

    /// Channels this provider is subscribed to.
    pub(crate) fn subscribed(&self) -> usize {
        self.registry
            .channels()
            .values()
            .filter(|c| c.subscribed)
            .count()
    }

    /// Registers a waiter on `channel`, subscribing first if nobody of this provider is.
    /// When this returns, every message published from now on reaches the listener, unless
    /// the SUBSCRIBE failed (the server is away): then the waiter still waits, bounded by its
    /// capped wake-up time, and [`Listener::resubscribe`] tries again on its next round.
    ///
    /// Cancel safe: a dropped future leaves the registry as it found it, and a SUBSCRIBE it
    /// may have sent is undone by the listener's drop (an UNSUBSCRIBE behind it on the same
    /// connection, so the server ends unsubscribed whichever of the two it saw first).
    pub(crate) async fn listen(
        self: &Arc<Self>,
        channel: &str,
        kind: ChannelKind,
    ) -> Result<Listener> {
        let listener = {
            let mut channels = self.registry.channels();
            let id = self.registry.ids.fetch_add(1, Ordering::Relaxed);
            let waiter = Waiter {
                id,
                notify: Arc::new(Notify::new()),
                signalled: Arc::new(AtomicBool::new(false)),
            };
            let listener = Listener {
                subs: Arc::clone(self),
                channel: channel.to_owned(),
                id,
                notify: Arc::clone(&waiter.notify),
                signalled: Arc::clone(&waiter.signalled),
            };
            let chan = channels.entry(channel.to_owned()).or_default();
            chan.kind = kind;
            chan.waiters.push(waiter);
            listener
        };
        self.ensure_subscribed(channel).await;
        Ok(listener)
    }

    /// Subscribes `channel` unless it is. A failure is logged, not returned: the caller waits
    /// with a short timer and tries again.
    ///
    /// The SUBSCRIBE waits at most [`SUBSCRIBE_WAIT`]: right after a restart its answer can
    /// be lost in the client (a SUBSCRIBE on the reconnected connection may be answered only
    /// by the response timeout), and every release meanwhile would go unheard.
    async fn ensure_subscribed(&self, channel: &str) -> Subscribed {
        // Always under the channel's lock: an UNSUBSCRIBE of it may be in flight (its last
        // waiter just left), and its flag is only cleared when it completes. Checking the flag
        // outside would let this waiter trust a subscription that is about to end, and sleep
        // until the holder's PTTL instead of being woken. The caller is a registered waiter,
        // so the entry is there.
        let Some(ops) = self.ops_of(channel) else {
            return Subscribed::Failed;
        };
        let _ops = ops.lock().await;
        let subscribed = self
            .registry
            .channels()
            .get(channel)
            .is_some_and(|c| c.subscribed);
        if subscribed {
            return Subscribed::Already;
        }
        // From the moment the SUBSCRIBE may be sent the server may be subscribed, whatever
        // becomes of this future: dropped before the answer (its acquisition cancelled), it
        // leaves `maybe` set, so the last waiter to leave unsubscribes.
        let (was_maybe, epoch) = match self.registry.channels().get_mut(channel) {
            Some(c) => (std::mem::replace(&mut c.maybe, true), c.epoch),
            None => (false, 0),
        };
        match tokio::time::timeout(SUBSCRIBE_WAIT, self.conn.subscribe(channel)).await {
            Ok(Ok(())) => {
                let mut channels = self.registry.channels();
                match channels.get_mut(channel) {
                    // Still the subscription the server confirmed.
                    Some(c) if c.epoch == epoch => {
                        c.subscribed = true;
                        c.maybe = false;
                    }
                    // Ended since (the server may still keep it): tried again next round.
                    Some(c) => c.maybe = true,
                    None => {}
                }
                Subscribed::Now
            }
            Ok(Err(e)) => {
                tracing::debug!(channel, error = %e, "subscribe failed; waiting on a timer until it works");
                // Refused, or failed with the connection: this SUBSCRIBE subscribed nothing.
                if let Some(c) = self.registry.channels().get_mut(channel) {
                    c.maybe = was_maybe;
                }
                Subscribed::Failed
            }
            Err(_) => {
                tracing::debug!(
                    channel,
                    "subscribe unanswered; waiting on a timer until it works"
                );
                Subscribed::Failed
            }
        }
    }

    /// The lock that serializes `channel`'s SUBSCRIBE and UNSUBSCRIBE, if it has an entry.
    fn ops_of(&self, channel: &str) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.registry
            .channels()
            .get(channel)
            .map(|c| Arc::clone(&c.ops))
    }

    /// Unsubscribes `channel` once its last waiter left, and forgets it. A failed UNSUBSCRIBE
    /// (the server away or slow) is tried again, with a growing pause, for as long as the
    /// channel stays idle and the provider lives: each fair acquisition has a channel of its
    /// own, so a channel left subscribed would never be used again.
    async fn unsubscribe_if_idle(self: Arc<Self>, channel: String) {
        let mut pause = Backoff::new(Duration::from_millis(100), UNSUBSCRIBE_PAUSE_MAX);
        let subs = Arc::downgrade(&self);
        let mut this = self;
        while !this.try_unsubscribe_if_idle(&channel).await {
            drop(this);
            tokio::time::sleep(pause.next_pause()).await;
            let Some(again) = subs.upgrade() else {
                return;
            };
            this = again;
        }
    }

    /// One try of [`unsubscribe_if_idle`](Self::unsubscribe_if_idle): whether nothing is
    /// left to do (the channel is gone, has waiters again, or was unsubscribed).
    async fn try_unsubscribe_if_idle(&self, channel: &str) -> bool {
        let Some(ops) = self.ops_of(channel) else {
            return true;
        };
        let _ops = ops.lock().await;
        {
            let mut channels = self.registry.channels();
            // Gone, or replaced by a new entry (with a lock of its own) since this was
            // spawned: that entry's last waiter unsubscribes it.
            let Some(c) = channels.get(channel).filter(|c| Arc::ptr_eq(&c.ops, &ops)) else {
                return true;
            };
            if !c.waiters.is_empty() {
                return true;
            }
            if !c.subscribed && !c.maybe {
                // Never subscribed (the server was away): nothing to undo on the server.
                channels.remove(channel);
                return true;
            }
        }
        // On failure the flags stay set: the connection may still deliver, and a waiter that
        // comes meanwhile reuses the subscription. Messages for a channel without waiters
        // are dropped.
        if self.conn.unsubscribe(channel).await.is_err() {
            return false;
        }
        let mut channels = self.registry.channels();
        if channels.get(channel).is_some_and(|c| c.waiters.is_empty()) {
            channels.remove(channel);
        } else if let Some(c) = channels.get_mut(channel) {
            c.subscribed = false;
            c.maybe = false;
        }
        true
    }
}

/// The longest pause between two tries of a failed UNSUBSCRIBE.
const UNSUBSCRIBE_PAUSE_MAX: Duration = Duration::from_secs(5);

/// How long a SUBSCRIBE may take before the waiter falls back to a short timer (and tries
/// to subscribe again on its next round).
const SUBSCRIBE_WAIT: Duration = Duration::from_millis(500);

/// What [`Listener::resubscribe`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subscribed {
    /// Subscribed all along: every release since the last attempt wakes the waiter.
    Already,
    /// Subscribed just now: a release before this was not heard, so try again first.
    Now,
    /// Not subscribed (the server is away, or the SUBSCRIBE went unanswered): nothing wakes
    /// the waiter but its timer, which must be short.
    Failed,
}

/// One waiter's registration on a channel; dropping it leaves the channel (and unsubscribes
/// in the background when it was the last).
#[derive(Debug)]
pub(crate) struct Listener {
    subs: Arc<Subscriptions>,
    channel: String,
    id: u64,
    notify: Arc<Notify>,
    /// Woken and not yet acting on it: set by a message, cleared when an attempt begins.
    signalled: Arc<AtomicBool>,
}

impl Listener {
    /// Sleeps until woken by a message or until `until`, whichever comes first.
    pub(crate) async fn wait(&self, until: Option<Instant>) {
        if self.signalled.load(Ordering::SeqCst) {
            return;
        }
        match until {
            Some(at) => {
                tokio::select! {
                    () = self.notify.notified() => {}
                    () = sleep_until(at) => {}
                }
            }
            None => self.notify.notified().await,
        }
    }

    /// Subscribes the channel again if a disconnection (or a failed SUBSCRIBE) left it
    /// unsubscribed, and says how the subscription stands.
    pub(crate) async fn resubscribe(&self) -> Subscribed {
        self.subs.ensure_subscribed(&self.channel).await
    }

    /// Runs one attempt to take what the channel announces, with the wake-up that led to it
    /// used up as the attempt begins: a wake-up that comes during the attempt stays for the
    /// next [`wait`](Self::wait). If the attempt is dropped before it ends (the acquisition
    /// was cancelled), the wake-up it was acting on is given back, and the listener's drop
    /// passes it on to the next waiter.
    pub(crate) async fn attempt<F: Future>(&self, attempt: F) -> F::Output {
        let trying = Trying::begin(self);
        let output = attempt.await;
        trying.end();
        output
    }
}

/// One attempt of a [`Listener`] in progress, acting on the wake-up it used up; dropped before
/// [`end`](Self::end), it gives that wake-up back.
struct Trying<'a> {
    listener: &'a Listener,
    ended: bool,
}

impl<'a> Trying<'a> {
    fn begin(listener: &'a Listener) -> Self {
        listener.signalled.store(false, Ordering::SeqCst);
        Self {
            listener,
            ended: false,
        }
    }

    fn end(mut self) {
        self.ended = true;
    }
}

impl Drop for Trying<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.listener.signalled.store(true, Ordering::SeqCst);
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let idle = {
            let mut channels = self.subs.registry.channels();
            let Some(chan) = channels.get_mut(&self.channel) else {
                return;
            };
            chan.waiters.retain(|w| w.id != self.id);
            // A wake-up we received but did not act on (or were acting on when dropped, which
            // the attempt gave back) belongs to the next waiter; one too many costs that
            // waiter one try.
            if self.signalled.load(Ordering::SeqCst) {
                wake_unsignalled(&chan.waiters, 1);
            }
            chan.waiters.is_empty()
        };
        if idle && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // A clean-up of the provider: its close waits for the unsubscribe.
            runtime.spawn(cleanup(
                Arc::clone(&self.subs).unsubscribe_if_idle(self.channel.clone()),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::Value;

    use super::*;

    /// Two listeners on a fresh channel of the server at `DLOCK_REDIS_URL`, the first woken by
    /// an unlock message; `None` (skip) without a server.
    async fn first_woken() -> Option<(Arc<Subscriptions>, Listener, Listener)> {
        let url = dlock_conformance::service_url("DLOCK_REDIS_URL")?;
        let subs = Subscriptions::connect(&RedisConfig::from_url(&url).unwrap())
            .await
            .unwrap();
        let channel = format!("dlock-test-{}", uuid::Uuid::new_v4().simple());
        let first = subs.listen(&channel, ChannelKind::Lock).await.unwrap();
        let second = subs.listen(&channel, ChannelKind::Lock).await.unwrap();
        subs.registry.dispatch(PushInfo {
            kind: PushKind::Message,
            data: vec![
                Value::BulkString(channel.into_bytes()),
                Value::BulkString(UNLOCK.as_bytes().to_vec()),
            ],
        });
        Some((subs, first, second))
    }

    /// Whether `listener` is woken within a short while.
    async fn woken(listener: &Listener) -> bool {
        tokio::time::timeout(Duration::from_millis(200), listener.wait(None))
            .await
            .is_ok()
    }

    /// One channel's UNSUBSCRIBE in flight does not hold up another channel's SUBSCRIBE:
    /// with every reply 2 s late (through a proxy), the listener of the second channel is
    /// back (its SUBSCRIBE given up after its own wait) while the first channel's
    /// UNSUBSCRIBE still waits for its answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_channel_does_not_wait_for_another() {
        let Some(url) = dlock_conformance::service_url("DLOCK_REDIS_URL") else {
            return;
        };
        let server = RedisConfig::from_url(&url).unwrap();
        let target = server.url.expose();
        let host = target.host_str().unwrap().to_owned();
        let proxy = dlock_proxy::Proxy::start((host, target.port().unwrap_or(6379)))
            .await
            .unwrap();
        let config = RedisConfig::from_url(&format!("redis://{}", proxy.addr())).unwrap();
        let subs = Subscriptions::connect(&config).await.unwrap();
        let first = format!("dlock-test-{}", uuid::Uuid::new_v4().simple());
        let second = format!("dlock-test-{}", uuid::Uuid::new_v4().simple());
        let listener = subs.listen(&first, ChannelKind::Lock).await.unwrap();
        proxy.set_fault(dlock_proxy::Fault::DelayReplies(Duration::from_secs(2)));
        // The last waiter leaves: its channel's UNSUBSCRIBE goes out in the background, and
        // reaches the server (only replies are late) while its answer keeps it in flight.
        drop(listener);
        let direct = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        dlock_conformance::eventually(
            Duration::from_secs(10),
            "the UNSUBSCRIBE reached the server",
            || {
                let mut c = direct.clone();
                let first = first.clone();
                async move {
                    let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
                        .arg("NUMSUB")
                        .arg(&first)
                        .query_async(&mut c)
                        .await
                        .map_err(|e| e.to_string())?;
                    match n.first() {
                        Some((_, 0)) => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                }
            },
        )
        .await;
        let other = subs.listen(&second, ChannelKind::Lock).await.unwrap();
        assert!(
            subs.registry.channels().contains_key(&first),
            "the second channel waited for the first one's UNSUBSCRIBE to end"
        );
        proxy.set_fault(dlock_proxy::Fault::None);
        drop(other);
    }

    /// A waiter whose attempt is cancelled while it acts on a wake-up passes the wake-up on
    /// when it leaves: the release it was trying to take is not lost to the next waiter.
    #[tokio::test]
    async fn a_cancelled_attempt_passes_its_wake_up_on() {
        let Some((_subs, first, second)) = first_woken().await else {
            return;
        };
        let cancelled = first.attempt(std::future::pending::<()>());
        assert!(
            tokio::time::timeout(Duration::from_millis(20), cancelled)
                .await
                .is_err()
        );
        assert!(!woken(&second).await, "woken before the first one left");
        drop(first);
        assert!(woken(&second).await, "the wake-up was lost");
    }

    /// A waiter whose attempt ended has used its wake-up: when it leaves, the next waiter is
    /// not woken for nothing.
    #[tokio::test]
    async fn an_ended_attempt_uses_its_wake_up() {
        let Some((_subs, first, second)) = first_woken().await else {
            return;
        };
        first.attempt(async {}).await;
        drop(first);
        assert!(!woken(&second).await, "woken for nothing");
    }
}
