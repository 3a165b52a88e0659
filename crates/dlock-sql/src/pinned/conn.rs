//! The pinned connection: a pool connection that holds a lock (a row lock's transaction, an
//! advisory lock's session), closed rather than given back to the pool unless it is clean.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_core::backend::{Deadline, Later, Mutex, Owner, from_now, spawn_at};
use dlock_core::{Error, LockName, Result};
use tokio::time::Instant;

use super::server_seconds;
use crate::db::{Conn, Row, query};

/// A connection that must not go back to the pool with a lock or an open transaction: dropped
/// while it still holds its connection, it closes it (the server then rolls back and
/// releases). It goes back to the pool only when the session is clean: after a
/// [`free`](Self::free), an [`unlock`](Self::unlock) or [`unlock_batch`](Self::unlock_batch)
/// that released, or
/// [`busy`](Self::busy) at the deadline.
#[derive(Debug)]
pub(crate) struct Pinned {
    /// `None` once given back or closed.
    conn: Option<Conn>,
    /// It was closed (broken, or not to be trusted), not given back clean.
    closed: bool,
    /// The holds' watcher ([`watch`](super::session::watch)), until it starts (dropped with the connection before then, it
    /// never does).
    watcher: Option<Later>,
    /// The backend, for errors.
    backend: &'static str,
    /// Its entry among the pool's pinned connections, until it goes back or closes.
    pinner: Option<Pinner>,
}

impl Pinned {
    /// A connection of the lock pool, pinned to one waiting lock of `name` of the current
    /// task (counted in `pinners` until it goes back or closes; `bounded`: the wait has a
    /// deadline).
    pub(crate) fn new(
        conn: Conn,
        backend: &'static str,
        pinners: &Arc<Pinners>,
        name: &LockName,
        bounded: bool,
    ) -> Self {
        Self {
            conn: Some(conn),
            closed: false,
            watcher: None,
            backend,
            pinner: Some(pinners.pin(name, bounded)),
        }
    }

    /// A holding connection, watched from `period` on by `watcher`, made with a weak
    /// reference to the connection (it must not keep it alive).
    pub(crate) fn watched<W, F>(mut self, period: Duration, watcher: W) -> HoldingConnection
    where
        W: FnOnce(Weak<tokio::sync::Mutex<Self>>) -> F + Send + 'static,
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if let Some(p) = &self.pinner {
            p.holds();
        }
        Arc::new_cyclic(|me| {
            let me = Weak::clone(me);
            self.watcher = Some(spawn_at(from_now(period), move || watcher(me)));
            tokio::sync::Mutex::new(self)
        })
    }

    pub(crate) fn get(&mut self) -> Result<&mut Conn> {
        // A connection closed after a failed ROLLBACK (a reset): the database could not be
        // asked on it, and a new attempt gets another.
        self.conn.as_mut().ok_or_else(|| {
            Error::connection_failed(self.backend, "the connection of this acquisition broke")
        })
    }

    pub(crate) async fn rollback(&mut self) {
        if let Some(c) = self.conn.as_mut()
            && query("ROLLBACK").execute(c).await.is_err()
        {
            self.close();
        }
    }

    /// Rolls back, puts the server's default idle timeout back (`reset`, in the same round
    /// trip) and returns the connection to the pool; closes it if that fails.
    pub(crate) async fn end(&mut self, reset: Option<&str>) {
        let Some(c) = self.conn.as_mut() else {
            return;
        };
        let ended = match reset {
            Some(reset) => c.batch(&format!("ROLLBACK; {reset}")).await.map(drop),
            None => query("ROLLBACK").execute(&mut *c).await.map(drop),
        };
        match ended {
            Ok(()) => self.return_to_pool(),
            Err(_) => self.close(),
        }
    }

    /// Puts the server's default idle timeout back on a connection going back to the pool
    /// (closes it if that fails).
    pub(crate) async fn reset_lease(&mut self, reset: &str) {
        if let Some(c) = self.conn.as_mut()
            && query(reset).execute(c).await.is_err()
        {
            self.close();
        }
    }

    /// After a busy try of a pinned lock: at the deadline, puts the session back (`reset`, if
    /// a waiting try set its server-side lease), returns it to the pool and says so (`true`);
    /// with less than a second left, pauses briefly before the next try (which does not wait
    /// on the server).
    pub(crate) async fn busy(&mut self, deadline: Deadline, reset: Option<&str>) -> bool {
        let now = Instant::now();
        match deadline.instant() {
            Some(d) if now >= d => {
                if let Some(reset) = reset {
                    self.reset_lease(reset).await;
                }
                self.return_to_pool();
                true
            }
            Some(d) if d.saturating_duration_since(now) < Duration::from_secs(1) => {
                let left = d.saturating_duration_since(now);
                tokio::time::sleep(left.min(Duration::from_millis(20))).await;
                false
            }
            _ => false,
        }
    }

    /// Returns a clean connection (no transaction open, no lock held) to the pool, where it
    /// may stay warm for the next lock.
    pub(crate) fn return_to_pool(&mut self) {
        if let Some(c) = self.conn.take() {
            self.pinner = None;
            if tokio::runtime::Handle::try_current().is_ok() {
                c.done();
            } else {
                c.detach();
            }
        }
    }

    /// Ends the hold's transaction, which frees the row, and returns the connection to the
    /// pool with the server's default idle timeout: `reset` puts it back just before, in the
    /// same round trip (MySQL), or the end of the transaction does (PostgreSQL, whose lease
    /// is local to it). The transaction changed nothing, so it ends with ROLLBACK: PostgreSQL
    /// answers a COMMIT of a transaction that locked a row only once its write-ahead log is
    /// on disk (the row lock gave it a transaction id), a flush that keeps nothing and costs
    /// more than the rest of the cycle. An error means the ROLLBACK did not run (the server
    /// stops a request at its first failed statement) or its answer was lost; the
    /// connection is closed, and the server rolls back.
    pub(crate) async fn free(
        &mut self,
        reset: Option<&str>,
    ) -> std::result::Result<(), sqlx::Error> {
        let Some(c) = self.conn.as_mut() else {
            return Err(sqlx::Error::PoolClosed);
        };
        let ended = match reset {
            Some(reset) => c.batch(&format!("{reset}; ROLLBACK")).await.map(drop),
            None => query("ROLLBACK").execute(&mut *c).await.map(drop),
        };
        match ended {
            Ok(()) => {
                self.return_to_pool();
                Ok(())
            }
            Err(e) => {
                self.close();
                Err(e)
            }
        }
    }

    /// Releases an advisory lock (the statement also resets the session) and returns the
    /// connection to the pool; whether this session held the lock. A session that did not,
    /// or that fails, is closed (which frees whatever it holds).
    pub(crate) async fn unlock(&mut self, unlock: &str, key: i32) -> bool {
        let Some(c) = self.conn.as_mut() else {
            return false;
        };
        let answer = query(unlock).bind(i64::from(key)).fetch_one(&mut *c).await;
        self.released_if(answer.ok().as_ref())
    }

    /// Runs `release`, statements not prepared whose first row answers 1 when the session
    /// held the lock it gives back (they also reset the session), and returns the connection
    /// to the pool; whether the session held the lock. A session that did not, or that
    /// fails, is closed (which frees whatever it holds).
    pub(crate) async fn unlock_batch(&mut self, release: &str) -> bool {
        let Some(c) = self.conn.as_mut() else {
            return false;
        };
        let answer = c.batch(release).await;
        self.released_if(answer.ok().as_ref().and_then(|rows| rows.first()))
    }

    /// Whether `answer`, the first row of a release (none if it failed), says the session
    /// held the lock (1): the connection then goes back to the pool, and is closed otherwise.
    fn released_if(&mut self, answer: Option<&Row>) -> bool {
        let released = answer.is_some_and(|row| row.int(0).is_ok_and(|held| held == 1));
        if released {
            self.return_to_pool();
        } else {
            self.close();
        }
        released
    }

    /// Releases one advisory lock of a session that keeps others (a write whose downgraded
    /// read lives on), and keeps the session: whether this session held the lock. A session
    /// that fails is closed (which frees whatever it holds).
    pub(crate) async fn unlock_one(&mut self, unlock: &str, key: i32) -> bool {
        let Some(c) = self.conn.as_mut() else {
            return false;
        };
        match query(unlock).bind(i64::from(key)).fetch_one(&mut *c).await {
            Ok(row) => row.int(0).is_ok_and(|held| held == 1),
            Err(_) => {
                self.close();
                false
            }
        }
    }

    /// Renews the hold: sets the server-side lease again (which also proves the connection,
    /// and so the row lock, is alive).
    pub(crate) async fn renew(
        &mut self,
        statement: &str,
        ttl: Duration,
    ) -> std::result::Result<(), sqlx::Error> {
        let Some(c) = self.conn.as_mut() else {
            return Err(sqlx::Error::PoolClosed);
        };
        match query(statement).bind(server_seconds(ttl)).execute(c).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.close();
                Err(e)
            }
        }
    }

    /// [`renew`](Self::renew) to `ttl`, as a check of the connection like [`ping`](Self::ping):
    /// bounded by `limit` and cancel safe (a connection that does not answer in time is
    /// closed). `None`: the connection is gone already.
    pub(crate) async fn renew_within(
        &mut self,
        statement: &str,
        ttl: Duration,
        limit: Duration,
    ) -> Option<bool> {
        let mut flight = ClosedUnlessReturned(Some(self.conn.take()?));
        let answered = match flight.0.as_mut() {
            Some(c) => {
                let q = query(statement).bind(server_seconds(ttl));
                tokio::time::timeout(limit, q.execute(c)).await
            }
            None => return None,
        };
        match answered {
            Ok(Ok(_)) => {
                self.conn = flight.0.take();
                Some(true)
            }
            Ok(Err(_)) | Err(_) => Some(false),
        }
    }

    /// Whether the connection still answers (`None`: it is gone already, released or closed).
    /// A connection that does not answer is closed.
    ///
    /// Bounded by `limit`: a connection that does not answer in time (a partition) is closed
    /// too, so nothing waits on the hold's mutex for longer. Cancel safe: the connection is
    /// out of `self` while the ping is in flight and is closed, not reused, if the ping is
    /// dropped (a ping's unread answer would otherwise be read by the next statement).
    pub(crate) async fn ping(&mut self, limit: Duration) -> Option<bool> {
        let mut flight = ClosedUnlessReturned(Some(self.conn.take()?));
        let answered = match flight.0.as_mut() {
            Some(c) => tokio::time::timeout(limit, c.ping()).await,
            None => return None,
        };
        match answered {
            Ok(Ok(())) => {
                self.conn = flight.0.take();
                Some(true)
            }
            // Dropping `flight` closes the connection.
            Ok(Err(_)) | Err(_) => Some(false),
        }
    }

    pub(crate) fn close(&mut self) {
        if let Some(c) = self.conn.take() {
            self.pinner = None;
            self.closed = true;
            close_connection(c);
        }
    }

    /// Whether the connection was closed (broken, or not to be trusted), rather than given
    /// back clean (released) or not taken yet.
    pub(crate) fn was_closed(&self) -> bool {
        self.closed
    }

    /// The connection, unless it was given back or closed.
    pub(crate) fn conn_mut(&mut self) -> Option<&mut Conn> {
        self.conn.as_mut()
    }

    /// Whether the connection was given back or closed.
    pub(crate) fn is_gone(&self) -> bool {
        self.conn.is_none()
    }
}

/// A connection taken out of a [`Pinned`] for one call: closed when dropped, unless the call
/// finished and put it back.
pub(crate) struct ClosedUnlessReturned(pub(crate) Option<Conn>);

impl Drop for ClosedUnlessReturned {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            close_connection(c);
        }
    }
}

/// Closes a pool connection rather than give it back. sqlx closes in a task, which needs a
/// tokio runtime; without one the connection is taken out of the pool instead, closed at
/// once, and its slot is free (the server frees what it held when the socket closes).
fn close_connection(mut c: Conn) {
    if tokio::runtime::Handle::try_current().is_ok() {
        c.close_on_drop();
        drop(c);
    } else {
        c.detach();
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.close();
    }
}

/// The connections of one lock pool pinned right now: by which task (the thread, outside a
/// task), for which name, whether they hold it or wait for it, and whether the wait has a
/// deadline. A task that waits for a connection while every one is pinned, by itself or by
/// waiters that wait for ever on names it holds, waits for itself: see
/// [`waits_for_itself`](Self::waits_for_itself).
#[derive(Debug, Default)]
pub(crate) struct Pinners {
    pins: Mutex<HashMap<u64, Pin>>,
    next: AtomicU64,
}

/// One pinned connection, as [`Pinners`] sees it.
#[derive(Debug, Clone)]
struct Pin {
    owner: Owner,
    name: LockName,
    held: bool,
    bounded: bool,
}

impl Pinners {
    /// Whether the current task, asking for a connection of a pool of `pool_size` with every
    /// connection in use, waits for itself: it holds a lock on a connection of the pool, and
    /// every connection is pinned, by it or by a waiter with no deadline on a name it holds
    /// (a nested acquire, a MultiLock of several such locks, behind its own lock's waiters).
    /// Nothing can then free one. A connection pinned by anyone else may come free. (A hold
    /// counts as the task's that acquired it: a guard moved to another task is not seen, and
    /// that task waits as before.)
    pub(crate) fn waits_for_itself(&self, pool_size: u32) -> bool {
        let me = Owner::current();
        let pins = self.pins.lock();
        // A connection in use that is no pinned lock's (a statement's, one going back) frees
        // itself.
        if pins.len() < usize::try_from(pool_size).unwrap_or(usize::MAX) {
            return false;
        }
        let mine: Vec<&LockName> = pins
            .values()
            .filter(|p| p.owner == me && p.held)
            .map(|p| &p.name)
            .collect();
        !mine.is_empty()
            && pins
                .values()
                .all(|p| p.owner == me || (!p.held && !p.bounded && mine.contains(&&p.name)))
    }

    /// Counts a connection pinned by the current task for `name` (a wait with a deadline if
    /// `bounded`) until the returned pin is dropped.
    fn pin(self: &Arc<Self>, name: &LockName, bounded: bool) -> Pinner {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let pin = Pin {
            owner: Owner::current(),
            name: name.clone(),
            held: false,
            bounded,
        };
        self.pins.lock().insert(id, pin);
        Pinner {
            pinners: Arc::clone(self),
            id,
        }
    }
}

/// One pinned connection, counted in its [`Pinners`] while it lives.
#[derive(Debug)]
struct Pinner {
    pinners: Arc<Pinners>,
    id: u64,
}

impl Pinner {
    /// The connection now holds its lock.
    fn holds(&self) {
        if let Some(p) = self.pinners.pins.lock().get_mut(&self.id) {
            p.held = true;
        }
    }
}

impl Drop for Pinner {
    fn drop(&mut self) {
        self.pinners.pins.lock().remove(&self.id);
    }
}

/// The connection a pinned hold lives in, shared with its watcher ([`watch`](super::session::watch)).
pub(crate) type HoldingConnection = Arc<tokio::sync::Mutex<Pinned>>;
