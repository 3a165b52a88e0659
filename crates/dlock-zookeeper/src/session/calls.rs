//! The server calls of the recipes, counted by kind, each telling the session's horizon how it
//! ended.
//!
//! Each call takes the send time just before calling the client, which sends the request then
//! (not when the future is polled).

use tokio::time::Instant;
use zookeeper_client as zk;

use super::Session;

type ZkResult<T> = std::result::Result<T, zk::Error>;

/// Server calls made by one provider, by kind; see [`ZkProvider::stats`](crate::ZkProvider::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkStats {
    /// `create` calls (lock, lease and parent nodes).
    pub creates: u64,
    /// `delete` calls.
    pub deletes: u64,
    /// `getChildren` calls (with or without a watch).
    pub get_children: u64,
    /// `getData` calls (the waiters' watches on their predecessors).
    pub get_data: u64,
    /// `exists` calls (`extend`, and lease renewals on a server before 3.6).
    pub exists: u64,
    /// `setData` calls (an election's leader proclaiming).
    pub set_data: u64,
    /// Multi-reads: the watchdog's renewals of up to 5,000 holds in one call.
    pub multi_reads: u64,
    /// Waiters woken by a watch: with no herd, one per handoff.
    pub wakeups: u64,
    /// Sessions opened: one at connect, and one after each expiry.
    pub sessions: u64,
    /// Round trips: requests sent together and then awaited (a create with the listings sent
    /// behind it, a batch of reads) count once; `sync` counts too. Not part of
    /// [`calls`](Self::calls), which counts requests.
    pub round_trips: u64,
    /// Probes: `exists("/")` calls that keep the session's horizon moving while holds are live
    /// and nothing else was heard from the server for a quarter of the session timeout. Not
    /// part of [`calls`](Self::calls), which counts the recipes' own calls.
    pub probes: u64,
}

impl ZkStats {
    /// All server calls of the recipes (wake-ups and probes are not counted).
    pub fn calls(&self) -> u64 {
        self.creates
            + self.deletes
            + self.get_children
            + self.get_data
            + self.exists
            + self.set_data
            + self.multi_reads
    }
}

/// One call on the way: the client it went through and when it was sent.
pub(super) struct Call<'s> {
    session: &'s Session,
    pub(super) client: zk::Client,
    sent: Instant,
}

impl Call<'_> {
    /// Records how the call ended (see [`Session::heard`]) and passes its result on.
    pub(super) fn ended<T>(&self, result: ZkResult<T>) -> ZkResult<T> {
        self.session.heard(&self.client, self.sent, &result);
        result
    }

    /// Sends one request per item of `items` (`send` makes it: the client sends it when it is
    /// called), none awaited yet.
    fn send_each<I, F>(&self, items: &[I], send: impl Fn(&I) -> F) -> Vec<F> {
        items.iter().map(send).collect()
    }

    /// The answers of `sent`, in the order they were sent, each recorded as it ends.
    async fn answers<T>(&self, sent: Vec<impl Future<Output = ZkResult<T>>>) -> Vec<ZkResult<T>> {
        let mut answers = Vec::with_capacity(sent.len());
        for answer in sent {
            answers.push(self.ended(answer.await));
        }
        answers
    }
}

impl Session {
    /// Takes the client and the send time for a call about to be made.
    pub(super) fn call(&self) -> Call<'_> {
        self.call_on(self.client())
    }

    /// Takes the send time for a call about to be made through `client`.
    fn call_on(&self, client: zk::Client) -> Call<'_> {
        self.counters.count(|s| &mut s.round_trips);
        Call {
            session: self,
            client,
            sent: Instant::now(),
        }
    }

    /// Takes the client and the send time for a call made for a waiter's node, through the
    /// session `owner` that owns the node: `None` if the current session is another. The
    /// node went with `owner`, and what a later session reads (the node still listed until
    /// the server expires it, or not at all) must not place the waiter, nor may a watch set
    /// there keep it waiting with no place in the queue.
    fn call_as(&self, owner: i64) -> Option<Call<'_>> {
        let client = self.client();
        (client.session_id().0 == owner).then(|| self.call_on(client))
    }

    /// The calls made so far.
    pub(crate) fn stats(&self) -> ZkStats {
        self.counters.get()
    }

    /// A waiter was woken by its watch.
    pub(crate) fn woken(&self) {
        self.counters.count(|s| &mut s.wakeups);
    }

    /// Creates `path` with no data, with the open ACL.
    pub(crate) async fn create(
        &self,
        path: &str,
        mode: zk::CreateMode,
    ) -> ZkResult<(zk::Stat, zk::CreateSequence)> {
        self.create_with(path, &[], mode).await
    }

    /// Creates `path` holding `data`, with the open ACL.
    pub(crate) async fn create_with(
        &self,
        path: &str,
        data: &[u8],
        mode: zk::CreateMode,
    ) -> ZkResult<(zk::Stat, zk::CreateSequence)> {
        let options = mode.with_acls(zk::Acls::anyone_all());
        self.counters.count(|s| &mut s.creates);
        let call = self.call();
        call.ended(call.client.create(path, data, &options).await)
    }

    /// Creates `path` and lists the children of each of `dirs` in one round trip: every
    /// request is sent before any answer is read (the client sends a request when the call is
    /// made, not when its future is polled), and the server answers a session's requests in
    /// the order they were sent, so each listing sees what the create made, and sees it after
    /// the listings before it.
    pub(crate) async fn create_and_list(
        &self,
        path: &str,
        data: &[u8],
        mode: zk::CreateMode,
        dirs: &[&str],
    ) -> (
        ZkResult<(zk::Stat, zk::CreateSequence)>,
        Vec<ZkResult<Vec<String>>>,
    ) {
        let options = mode.with_acls(zk::Acls::anyone_all());
        self.counters.count(|s| &mut s.creates);
        let call = self.call();
        let created = call.client.create(path, data, &options);
        let listings = call.send_each(dirs, |dir| {
            self.counters.count(|s| &mut s.get_children);
            call.client.list_children(dir)
        });
        let created = call.ended(created.await);
        (created, call.answers(listings).await)
    }

    /// The data of each of `paths`, read in one round trip: every request is sent before any
    /// answer is read.
    pub(crate) async fn data_of_each(&self, paths: &[String]) -> Vec<ZkResult<Vec<u8>>> {
        let call = self.call();
        let reads = call.send_each(paths, |path| {
            self.counters.count(|s| &mut s.get_data);
            call.client.get_data(path)
        });
        let answers = call.answers(reads).await;
        answers
            .into_iter()
            .map(|r| r.map(|(data, _)| data))
            .collect()
    }

    /// The data of `path`.
    pub(crate) async fn data(&self, path: &str) -> ZkResult<Vec<u8>> {
        self.counters.count(|s| &mut s.get_data);
        let call = self.call();
        Ok(call.ended(call.client.get_data(path).await)?.0)
    }

    /// The data of `path` and its stat.
    pub(crate) async fn data_and_stat(&self, path: &str) -> ZkResult<(Vec<u8>, zk::Stat)> {
        self.counters.count(|s| &mut s.get_data);
        let call = self.call();
        call.ended(call.client.get_data(path).await)
    }

    /// Sets the data of `path` if its version is still `version`.
    pub(crate) async fn set_data(&self, path: &str, data: &[u8], version: i32) -> ZkResult<()> {
        self.counters.count(|s| &mut s.set_data);
        let call = self.call();
        call.ended(call.client.set_data(path, data, Some(version)).await)?;
        Ok(())
    }

    /// Deletes `path`, whatever its version.
    pub(crate) async fn delete(&self, path: &str) -> ZkResult<()> {
        self.counters.count(|s| &mut s.deletes);
        let call = self.call();
        call.ended(call.client.delete(path, None).await)
    }

    /// Brings the server this client talks to up to date with the leader (ZooKeeper's
    /// `sync`), before a read that must see our own earlier writes. Not counted: it reads
    /// and writes nothing.
    pub(crate) async fn sync(&self, path: &str) -> ZkResult<()> {
        let call = self.call();
        call.ended(call.client.sync(path).await)
    }

    /// The children of `path`.
    pub(crate) async fn children(&self, path: &str) -> ZkResult<Vec<String>> {
        self.counters.count(|s| &mut s.get_children);
        let call = self.call();
        call.ended(call.client.list_children(path).await)
    }

    /// The children of `path`, read through the session `owner` of the caller's node; `None`
    /// if the current session is another (see [`call_as`](Self::call_as)).
    pub(crate) async fn children_as(
        &self,
        owner: i64,
        path: &str,
    ) -> ZkResult<Option<Vec<String>>> {
        let Some(call) = self.call_as(owner) else {
            return Ok(None);
        };
        self.counters.count(|s| &mut s.get_children);
        call.ended(call.client.list_children(path).await).map(Some)
    }

    /// The children of `path`, and a watch that fires when they change.
    pub(crate) async fn children_watch(
        &self,
        path: &str,
    ) -> ZkResult<(Vec<String>, zk::OneshotWatcher)> {
        self.counters.count(|s| &mut s.get_children);
        let call = self.call();
        call.ended(call.client.list_and_watch_children(path).await)
    }

    /// [`children_watch`](Self::children_watch) through the session `owner` of the caller's
    /// node; `None` if the current session is another (see [`call_as`](Self::call_as)).
    pub(crate) async fn children_watch_as(
        &self,
        owner: i64,
        path: &str,
    ) -> ZkResult<Option<(Vec<String>, zk::OneshotWatcher)>> {
        let Some(call) = self.call_as(owner) else {
            return Ok(None);
        };
        self.counters.count(|s| &mut s.get_children);
        call.ended(call.client.list_and_watch_children(path).await)
            .map(Some)
    }

    /// The data and stat of `path`, and a watch that fires when it changes or goes.
    pub(crate) async fn data_and_watch(
        &self,
        path: &str,
    ) -> ZkResult<(Vec<u8>, zk::Stat, zk::OneshotWatcher)> {
        self.counters.count(|s| &mut s.get_data);
        let call = self.call();
        call.ended(call.client.get_and_watch_data(path).await)
    }

    /// A watch that fires when `path` changes or goes, set through the session `owner` of the
    /// caller's node; `None` if the current session is another (see [`call_as`](Self::call_as)).
    pub(crate) async fn data_watch(
        &self,
        owner: i64,
        path: &str,
    ) -> ZkResult<Option<zk::OneshotWatcher>> {
        #[cfg(test)]
        let _passed = self.watch_gate.pass().await;
        let Some(call) = self.call_as(owner) else {
            return Ok(None);
        };
        self.counters.count(|s| &mut s.get_data);
        let (_, _, watcher) = call.ended(call.client.get_and_watch_data(path).await)?;
        Ok(Some(watcher))
    }

    /// The stat of `path`, `None` if there is no such node.
    pub(crate) async fn exists(&self, path: &str) -> ZkResult<Option<zk::Stat>> {
        self.counters.count(|s| &mut s.exists);
        let call = self.call();
        call.ended(call.client.check_stat(path).await)
    }
}
