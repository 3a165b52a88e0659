//! The Lua scripts and the key layout, which follow Redisson's so that Java `RLock`,
//! `RFencedLock`, `RReadWriteLock` and `RPermitExpirableSemaphore` holders and dlock holders
//! exclude and wake each other.
//!
//! Replies: acquisitions return `{-1, token}` when granted and `{pttl, -1}` when not (Redisson's
//! fenced-lock convention); unlocks return nil (not the owner), 0 (still held) or 1 (released);
//! renewals return 1 (renewed) or 0 (not held).
//!
//! Kinds on one name exclude each other. A mutex hold (a hash without a `mode` field, dlock's
//! or a Java `RLock`'s) and a read-write hold (a hash with `mode`) share the key: a read or
//! write acquire treats a hash without `mode` as held, and the mutex acquire treats any hash
//! as held. A semaphore's counter is a string at the same key, which no lock script can wait
//! on: an acquire that finds the other kind's key type answers `{-6, type}` before it changes
//! anything, and the caller refuses the request. Release, renewal and check scripts that find
//! a key of another type answer "not held" (the hold is gone: the other kind could only create
//! its key once ours had ended).

use std::sync::LazyLock;

use redis::Script;

/// Redisson's `prefixName`: `prefix:{name}`, or `prefix:name` when the name has a `{` already
/// (its own hash tag then decides the cluster slot).
pub(crate) fn prefix_name(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// Redisson's `suffixName`: `{name}:suffix`, or `name:suffix` when the name has a `{`.
pub(crate) fn suffix_name(name: &str, suffix: &str) -> String {
    if name.contains('{') {
        format!("{name}:{suffix}")
    } else {
        format!("{{{name}}}:{suffix}")
    }
}

/// What a key name is in Redisson's layout when it is not a lock's own key: a fencing token,
/// a fair queue or its timeouts, a semaphore's permits, or a read hold's timeout key of some
/// other name (review L10). A lock of that name would share the key with the other name's
/// bookkeeping, and both would fail (WRONGTYPE) or worse.
pub(crate) fn bookkeeping_key(name: &str) -> Option<&'static str> {
    const PREFIXES: [(&str, &str); 3] = [
        ("redisson_lock_token:", "another lock's fencing token"),
        ("redisson_lock_queue:", "another lock's fair queue"),
        (
            "redisson_lock_timeout:",
            "another lock's fair queue timeouts",
        ),
    ];
    if let Some((_, whose)) = PREFIXES.iter().find(|(p, _)| name.starts_with(p)) {
        return Some(whose);
    }
    if name.contains(":rwlock_timeout") {
        return Some("a read hold's timeout of another read-write lock");
    }
    if name.contains('{') {
        if name.ends_with(":timeout") {
            return Some("another semaphore's permits");
        }
        if name.ends_with(":permits") {
            return Some("another semaphore's permit count");
        }
    }
    None
}

/// The hash tag Redis Cluster hashes a key by: the text between the first `{` and the next
/// `}`, if non-empty; `None` when the whole key is hashed.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

/// All keys of one lock (the hash, and the Redisson keys derived from it).
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) name: String,
    pub(crate) channel: String,
    pub(crate) token: String,
    pub(crate) queue: String,
    pub(crate) timeouts: String,
    pub(crate) rw_channel: String,
    pub(crate) rw_prefix: String,
    pub(crate) sem_channel: String,
    pub(crate) sem_timeouts: String,
    pub(crate) sem_size: String,
}

impl Keys {
    pub(crate) fn new(name: &str) -> Self {
        let rw_prefix = if name.contains('{') {
            name.to_owned()
        } else {
            format!("{{{name}}}")
        };
        Self {
            name: name.to_owned(),
            channel: prefix_name("redisson_lock__channel", name),
            token: prefix_name("redisson_lock_token", name),
            queue: prefix_name("redisson_lock_queue", name),
            timeouts: prefix_name("redisson_lock_timeout", name),
            rw_channel: prefix_name("redisson_rwlock", name),
            rw_prefix,
            sem_channel: prefix_name("redisson_sc", name),
            sem_timeouts: suffix_name(name, "timeout"),
            sem_size: suffix_name(name, "permits"),
        }
    }

    /// The fair lock's per-waiter channel.
    pub(crate) fn waiter_channel(&self, field: &str) -> String {
        format!("{}:{field}", self.channel)
    }

    /// The base of a reader's per-hold timeout keys: `{name}:<field>:rwlock_timeout`.
    pub(crate) fn read_timeouts(&self, field: &str) -> String {
        format!("{}:{field}:rwlock_timeout", self.rw_prefix)
    }
}

/// Mutex acquire. KEYS: name, token. ARGV: lease ms, field.
///
/// Every acquire script is idempotent: each acquisition has a field (or permit id) of its own,
/// so finding it already there means the script ran before for this very acquisition (a
/// client library re-sent it after a timeout): the reply is `{-5, -1}` and nothing changes.
/// The caller then gives the hold back and tries again, since the first run's token is lost.
pub(crate) static LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
  local token = redis.call('incr', KEYS[2])
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-1, token}
end
if kind ~= 'hash' then
  return {-6, kind}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  return {-5, -1}
end
return {redis.call('pttl', KEYS[1]), -1}
",
    )
});

/// Mutex (and write lock) unlock. KEYS: name, channel. ARGV: message, lease ms, field,
/// publish command.
pub(crate) static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('type', KEYS[1])['ok'] ~= 'hash' or redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return nil
end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[1])
return 1
",
    )
});

/// Renewal of a mutex, fair lock or write hold. KEYS: name. ARGV: lease ms, field.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('type', KEYS[1])['ok'] == 'hash' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
return 0
",
    )
});

/// The server's clock in epoch milliseconds, as a Lua expression. Every deadline in the fair
/// queue and the semaphore's timeouts set is computed with it, not with the client's clock,
/// so a client whose clock runs ahead cannot reclaim a live permit or sweep a live waiter
/// (review M7). Scripts may read TIME since Redis 5 (effects replication).
const SERVER_NOW: &str = "(function() local t = redis.call('TIME') \
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) end)()";

/// The fair lock's stale-head sweep, shared by its scripts: waiters whose deadline (score,
/// epoch ms) passed, or that have no deadline at all (the queue and the set disagree, e.g.
/// after an eviction), are dropped from the head of the queue. Uses ARGV[4] as now (set from
/// the server's clock by each script).
const FAIR_SWEEP: &str = r"
while true do
  local head = redis.call('lindex', KEYS[2], 0)
  if head == false then break end
  local deadline = redis.call('zscore', KEYS[3], head)
  if deadline == false or tonumber(deadline) <= tonumber(ARGV[4]) then
    redis.call('zrem', KEYS[3], head)
    redis.call('lpop', KEYS[2])
  else
    break
  end
end
";

/// The fair lock's check of the key's type, first in its acquire scripts (before the sweep
/// changes anything): a semaphore's counter (or any key but a hash) at the name is another
/// kind in use.
const FAIR_KIND: &str = r"
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return {-6, kind}
end
";

/// The fair lock's grant when the lock is free and the queue empty or headed by us; shared
/// by both acquire scripts. Uses ARGV[3] as the per-waiter wait.
const FAIR_GRANT: &str = r"
if redis.call('exists', KEYS[1]) == 0
   and (redis.call('exists', KEYS[2]) == 0 or redis.call('lindex', KEYS[2], 0) == ARGV[2]) then
  redis.call('lpop', KEYS[2])
  redis.call('zrem', KEYS[3], ARGV[2])
  local waiting = redis.call('zrange', KEYS[3], 0, -1)
  for i = 1, #waiting do
    redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), waiting[i])
  end
  local token = redis.call('incr', KEYS[4])
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-1, token}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  return {-5, -1}
end
";

/// Fair acquire that queues when it cannot take the lock (Redisson's algorithm: the score is
/// the deadline by which the waiter must take its turn). KEYS: name, queue, timeouts, token.
/// ARGV: lease ms, field, wait ms, (now: set from the server's clock). A queued waiter is told how long to wait: the
/// holder's PTTL (-1: no expiry, wait for a message), or, when the lock is free but another
/// waiter is at the head, the time until the head's turn ends (Redisson answers 0 there, and
/// its waiters poll in a loop until a dead head is swept).
pub(crate) static FAIR_LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"ARGV[4] = tostring({SERVER_NOW})
{FAIR_KIND}{FAIR_SWEEP}{FAIR_GRANT}
if redis.call('zscore', KEYS[3], ARGV[2]) ~= false then
  local pttl = redis.call('pttl', KEYS[1])
  if pttl ~= -2 then
    return {{pttl, -1}}
  end
  local head = redis.call('lindex', KEYS[2], 0)
  local due = head and redis.call('zscore', KEYS[3], head)
  if due then
    return {{math.max(1, tonumber(due) - tonumber(ARGV[4])), -1}}
  end
  return {{1, -1}}
end
local last = redis.call('lindex', KEYS[2], -1)
local ttl
if last ~= false and last ~= ARGV[2] and redis.call('zscore', KEYS[3], last) ~= false then
  ttl = tonumber(redis.call('zscore', KEYS[3], last)) - tonumber(ARGV[4])
else
  ttl = redis.call('pttl', KEYS[1])
end
if redis.call('zadd', KEYS[3], ttl + tonumber(ARGV[3]) + tonumber(ARGV[4]), ARGV[2]) == 1 then
  redis.call('rpush', KEYS[2], ARGV[2])
end
return {{ttl, -1}}
"
    ))
});

/// Fair try-acquire that never queues. Same KEYS and ARGV as [`FAIR_LOCK`].
pub(crate) static FAIR_TRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"ARGV[4] = tostring({SERVER_NOW})
{FAIR_KIND}{FAIR_SWEEP}{FAIR_GRANT}
return {{math.max(0, redis.call('pttl', KEYS[1])), -1}}
"
    ))
});

/// A fair waiter leaves the queue; the waiters behind it get its wait back, and if the lock is
/// free the new head is woken (it may have been told to wait for the one that left: review
/// M4). KEYS: queue, timeouts, name, channel. ARGV: field, wait ms, message, publish command.
pub(crate) static FAIR_LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local queue = redis.call('lrange', KEYS[1], 0, -1)
local i = 1
while i <= #queue and queue[i] ~= ARGV[1] do i = i + 1 end
i = i + 1
while i <= #queue do
  redis.call('zincrby', KEYS[2], -tonumber(ARGV[2]), queue[i])
  i = i + 1
end
redis.call('zrem', KEYS[2], ARGV[1])
redis.call('lrem', KEYS[1], 0, ARGV[1])
if redis.call('exists', KEYS[3]) == 0 then
  local head = redis.call('lindex', KEYS[1], 0)
  if head ~= false then
    redis.call(ARGV[4], KEYS[4] .. ':' .. head, ARGV[3])
  end
end
return 1
",
    )
});

/// Fair unlock: wakes only the head of the queue, on its own channel. KEYS: name, queue,
/// timeouts, channel. ARGV: message, lease ms, field, (now: from the server's clock), publish
/// command.
pub(crate) static FAIR_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"ARGV[4] = tostring({SERVER_NOW})
{FAIR_SWEEP}
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'hash' or redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  if kind == 'none' then
    local head = redis.call('lindex', KEYS[2], 0)
    if head ~= false then
      redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1])
    end
  end
  return nil
end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
local next = redis.call('lindex', KEYS[2], 0)
if next ~= false then
  redis.call(ARGV[5], KEYS[4] .. ':' .. next, ARGV[1])
end
return 1
"
    ))
});

/// Read acquire. KEYS: name, read-timeouts base, token. ARGV: lease ms, read field, write
/// field of this owner's write hold (downgrade), or an empty string. A hash without `mode` is
/// a mutex hold, exclusive like a write hold.
pub(crate) static READ_LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return {-6, kind}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  return {-5, -1}
end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false and kind == 'hash' then
  return {redis.call('pttl', KEYS[1]), -1}
end
if mode == false then
  local token = redis.call('incr', KEYS[3])
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1)
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-1, token}
end
if mode == 'read' or (mode == 'write' and ARGV[3] ~= '' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local token = redis.call('incr', KEYS[3])
  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local key = KEYS[2] .. ':' .. n
  redis.call('set', key, 1)
  redis.call('pexpire', key, ARGV[1])
  local left = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(left, tonumber(ARGV[1])))
  return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
",
    )
});

/// Read unlock: the hash lives as long as its longest read hold. KEYS: name, rw channel,
/// read-timeouts base, key prefix. ARGV: message, read field, publish command.
pub(crate) static READ_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return nil
end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call(ARGV[3], KEYS[2], ARGV[1])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return nil
end
local left = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if left == 0 then
  redis.call('hdel', KEYS[1], ARGV[2])
end
redis.call('del', KEYS[3] .. ':' .. (left + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local longest = -3
  for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    local n = tonumber(redis.call('hget', KEYS[1], field))
    if type(n) == 'number' then
      for i = n, 1, -1 do
        longest = math.max(longest, redis.call('pttl', KEYS[4] .. ':' .. field .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
    return 0
  end
  if mode == 'write' then
    return 0
  end
end
redis.call('del', KEYS[1])
redis.call(ARGV[3], KEYS[2], ARGV[1])
return 1
",
    )
});

/// Read renewal. KEYS: name, key prefix. ARGV: lease ms, read field.
pub(crate) static READ_RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('type', KEYS[1])['ok'] ~= 'hash' then
  return 0
end
local n = redis.call('hget', KEYS[1], ARGV[2])
if n == false then
  return 0
end
for i = tonumber(n), 1, -1 do
  redis.call('pexpire', KEYS[2] .. ':' .. ARGV[2] .. ':rwlock_timeout:' .. i, ARGV[1])
end
local left = redis.call('pttl', KEYS[1])
redis.call('pexpire', KEYS[1], math.max(left, tonumber(ARGV[1])))
return 1
",
    )
});

/// Write acquire. KEYS: name, token. ARGV: lease ms, write field. Any hash there is a hold:
/// read, write, or a mutex (no `mode` field).
pub(crate) static WRITE_LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return {-6, kind}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  return {-5, -1}
end
if kind == 'none' then
  local token = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
",
    )
});

/// Write unlock: a writer that also reads (downgraded) leaves the lock in read mode; otherwise
/// every waiter is woken (message 1: readers may all proceed). KEYS: name, rw channel.
/// ARGV: message, lease ms, write field, publish command.
pub(crate) static WRITE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return nil
end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call(ARGV[4], KEYS[2], ARGV[1])
  return nil
end
if mode ~= 'write' or redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return nil
end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('hdel', KEYS[1], ARGV[3])
if redis.call('hlen', KEYS[1]) == 1 then
  redis.call('del', KEYS[1])
  redis.call(ARGV[4], KEYS[2], ARGV[1])
else
  redis.call('hset', KEYS[1], 'mode', 'read')
end
return 1
",
    )
});

/// The permit-expirable semaphore's reclaim of expired permits, shared by its scripts.
/// KEYS[1] counter, KEYS[2] timeouts, KEYS[3] channel; ARGV[3] now, ARGV[5] publish command.
const SEM_RECLAIM: &str = r"
local expired = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3])
if #expired > 0 then
  redis.call('zrem', KEYS[2], unpack(expired))
  local value = redis.call('incrby', KEYS[1], #expired)
  if tonumber(value) > 0 then
    redis.call(ARGV[5], KEYS[3], value)
  end
end
";

/// Permit acquire. The counter (Redisson's key) holds the available permits. dlock records
/// the semaphore's size in its own key, `{name}:permits`:
/// - a missing counter is created with the handle's count less the permits still held in the
///   timeouts set (a deleted or evicted counter does not over-grant);
/// - while permits are held, a handle with another count gets `{-3, size}`;
/// - once none is held, a new count moves the counter by the difference, so permits taken
///   outside the timeouts set (a Java `RSemaphore`) stay taken.
///
/// A counter made by Java (`trySetPermits`) has no size key, and no opinion is enforced.
/// `{-4, -1}`: no permit free and none about to expire (another client holds them without
/// expiry), so only a release message can help. `{-6, type}`: the key is not a counter (a
/// lock's hash is there), answered before anything changes. KEYS: counter, timeouts, channel, token,
/// size. ARGV: permits, (expiry and now: from the server's clock), lease ms, publish command,
/// permit id (16 raw
/// bytes).
pub(crate) static SEM_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
ARGV[3] = tostring({SERVER_NOW})
ARGV[2] = tostring(tonumber(ARGV[3]) + tonumber(ARGV[4]))
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'string' then
  return {{-6, kind}}
end
if redis.call('zscore', KEYS[2], ARGV[6]) ~= false then
  return {{-5, -1}}
end
local permits = tonumber(ARGV[1])
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('set', KEYS[1], math.max(0, permits - redis.call('zcard', KEYS[2])))
  redis.call('set', KEYS[5], permits)
end
{SEM_RECLAIM}
local size = redis.call('get', KEYS[5])
if size ~= false and tonumber(size) ~= permits then
  if redis.call('zcard', KEYS[2]) > 0 then
    return {{-3, tonumber(size)}}
  end
  local moved = tonumber(redis.call('get', KEYS[1])) + permits - tonumber(size)
  redis.call('set', KEYS[1], math.max(0, moved))
  redis.call('set', KEYS[5], permits)
end
local value = redis.call('get', KEYS[1])
if value ~= false and tonumber(value) >= 1 then
  redis.call('decrby', KEYS[1], 1)
  redis.call('zadd', KEYS[2], ARGV[2], ARGV[6])
  return {{-1, redis.call('incr', KEYS[4])}}
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
if first[1] ~= nil then
  return {{math.max(0, tonumber(first[2]) - tonumber(ARGV[3])), -1}}
end
return {{-4, -1}}
"
    ))
});

/// Free permits (Redisson's `availablePermits`), read only: the counter plus the permits whose
/// lease ended that no acquire has reclaimed yet (the server's clock). KEYS: counter,
/// timeouts. ARGV: the handle's permits (what is free while the counter was never set).
/// `{-6, type}` when the key is not a counter (a lock's hash is there).
pub(crate) static SEM_AVAILABLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'string' then
  return {{-6, kind}}
end
local expired = redis.call('zcount', KEYS[2], 0, {SERVER_NOW})
local value = redis.call('get', KEYS[1])
if value == false then
  return math.max(0, tonumber(ARGV[1]) - redis.call('zcard', KEYS[2]) + expired)
end
return math.max(0, tonumber(value) + expired)
"
    ))
});

/// Permit renewal (Redisson's `updateLeaseTime`). KEYS: timeouts. ARGV: lease ms (the expiry
/// is the server's now plus it), permit id.
pub(crate) static SEM_RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
if redis.call('zscore', KEYS[1], ARGV[2]) == false then
  return 0
end
redis.call('zadd', KEYS[1], {SERVER_NOW} + tonumber(ARGV[1]), ARGV[2])
return 1
"
    ))
});

/// Permit release; publishes the number of available permits. KEYS: counter, channel,
/// timeouts. ARGV: permit id, (now: from the server's clock), publish command. Returns 1, or
/// nil if the permit was not
/// held (expired or never granted).
pub(crate) static SEM_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
ARGV[2] = tostring({SERVER_NOW})
local expiry = redis.call('zscore', KEYS[3], ARGV[1])
if expiry == false then
  return nil
end
redis.call('zrem', KEYS[3], ARGV[1])
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'string' then
  return nil
end
local value = redis.call('incrby', KEYS[1], 1)
redis.call(ARGV[3], KEYS[2], value)
if tonumber(expiry) <= tonumber(ARGV[2]) then
  return nil
end
return 1
"
    ))
});

/// Whether a hold is still in the store, after a disconnection. KEYS: the lock's hash (or a
/// semaphore's timeouts set). ARGV: the hold's field (or permit id), `zset` for a permit.
pub(crate) static HELD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if ARGV[2] == 'zset' then
  if redis.call('zscore', KEYS[1], ARGV[1]) == false then return 0 end
  return 1
end
if redis.call('type', KEYS[1])['ok'] ~= 'hash' then return 0 end
return redis.call('hexists', KEYS[1], ARGV[1])
",
    )
});

/// What is stored for a lock, for inspection. KEYS: name, token. Returns
/// `{type, pttl, token or nil, hash fields, mode or nil}`.
pub(crate) static DESCRIBE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kind = redis.call('type', KEYS[1])['ok']
local fields = {}
local mode = false
if kind == 'hash' then
  fields = redis.call('hkeys', KEYS[1])
  mode = redis.call('hget', KEYS[1], 'mode')
end
return {kind, redis.call('pttl', KEYS[1]), redis.call('get', KEYS[2]), fields, mode}
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    /// The test's own connection, with the library's default patience (5 s) rather than
    /// redis-rs's (500 ms for an answer), which a loaded machine exceeds.
    async fn test_connection(url: &str) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(std::time::Duration::from_secs(5)))
            .set_connection_timeout(Some(std::time::Duration::from_secs(5)));
        redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    }

    #[test]
    fn layout_matches_redisson() {
        let k = Keys::new("orders/42");
        assert_eq!(k.name, "orders/42");
        assert_eq!(k.channel, "redisson_lock__channel:{orders/42}");
        assert_eq!(k.token, "redisson_lock_token:{orders/42}");
        assert_eq!(k.queue, "redisson_lock_queue:{orders/42}");
        assert_eq!(k.timeouts, "redisson_lock_timeout:{orders/42}");
        assert_eq!(k.rw_channel, "redisson_rwlock:{orders/42}");
        assert_eq!(k.rw_prefix, "{orders/42}");
        assert_eq!(k.sem_channel, "redisson_sc:{orders/42}");
        assert_eq!(k.sem_timeouts, "{orders/42}:timeout");
        assert_eq!(k.sem_size, "{orders/42}:permits");
        assert_eq!(
            k.waiter_channel("u:1"),
            "redisson_lock__channel:{orders/42}:u:1"
        );
        assert_eq!(k.read_timeouts("u:1"), "{orders/42}:u:1:rwlock_timeout");

        let k = Keys::new("a{x}b");
        assert_eq!(k.channel, "redisson_lock__channel:a{x}b");
        assert_eq!(k.sem_timeouts, "a{x}b:timeout");
        assert_eq!(k.rw_prefix, "a{x}b");
        assert_eq!(k.read_timeouts("u:1"), "a{x}b:u:1:rwlock_timeout");
    }

    #[test]
    fn hash_tags() {
        assert_eq!(hash_tag("{orders/42}:x"), Some("orders/42"));
        assert_eq!(hash_tag("a{x}b"), Some("x"));
        assert_eq!(hash_tag("a{}b"), None);
        assert_eq!(hash_tag("a{b"), None);
        assert_eq!(hash_tag("plain"), None);
    }

    /// Every acquire script run twice for one acquisition (as a client library re-sends it
    /// after a timeout) changes nothing the second time: no second hold count, no second
    /// permit (review H3). Against the server at `DLOCK_REDIS_URL`.
    #[tokio::test]
    async fn acquire_scripts_are_idempotent() {
        let Some(url) = dlock_conformance::service_url("DLOCK_REDIS_URL") else {
            return;
        };
        let mut c = test_connection(&url).await;
        let name = format!("idempotent-{}", uuid::Uuid::new_v4().simple());
        let k = Keys::new(&name);
        let conn = c.clone();
        let twice =
            move |script: &'static LazyLock<Script>, keys: Vec<String>, args: Vec<Vec<u8>>| {
                let mut c = conn.clone();
                async move {
                    let mut replies = Vec::new();
                    for _ in 0..2 {
                        let mut inv = script.prepare_invoke();
                        for key in &keys {
                            inv.key(key);
                        }
                        for arg in &args {
                            inv.arg(arg.as_slice());
                        }
                        let reply: Vec<i64> = inv.invoke_async(&mut c).await.unwrap();
                        replies.push(reply);
                    }
                    replies
                }
            };
        let field = b"client:1".to_vec();
        let lease = b"30000".to_vec();

        let r = twice(
            &LOCK,
            vec![k.name.clone(), k.token.clone()],
            vec![lease.clone(), field.clone()],
        )
        .await;
        assert_eq!(r[0][0], -1, "granted");
        assert_eq!(r[1], vec![-5, -1], "the second run finds the hold");
        let count: i64 = redis::cmd("HGET")
            .arg(&k.name)
            .arg("client:1")
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(count, 1, "one hold count");
        let _: () = redis::cmd("DEL")
            .arg(&k.name)
            .query_async(&mut c)
            .await
            .unwrap();

        let w = twice(
            &WRITE_LOCK,
            vec![k.name.clone(), k.token.clone()],
            vec![lease.clone(), field.clone()],
        )
        .await;
        assert_eq!((w[0][0], w[1].clone()), (-1, vec![-5, -1]));
        let _: () = redis::cmd("DEL")
            .arg(&k.name)
            .query_async(&mut c)
            .await
            .unwrap();

        let base = k.read_timeouts("client:1");
        let rd = twice(
            &READ_LOCK,
            vec![k.name.clone(), base, k.token.clone()],
            vec![lease.clone(), field.clone(), Vec::new()],
        )
        .await;
        assert_eq!((rd[0][0], rd[1].clone()), (-1, vec![-5, -1]));
        let count: i64 = redis::cmd("HGET")
            .arg(&k.name)
            .arg("client:1")
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(count, 1, "one read count");
        let _: () = redis::cmd("DEL")
            .arg(&k.name)
            .query_async(&mut c)
            .await
            .unwrap();

        let sem = twice(
            &SEM_ACQUIRE,
            vec![
                k.name.clone(),
                k.sem_timeouts.clone(),
                k.sem_channel.clone(),
                k.token.clone(),
                k.sem_size.clone(),
            ],
            vec![
                b"2".to_vec(),
                Vec::new(),
                Vec::new(),
                b"30000".to_vec(),
                b"publish".to_vec(),
                b"permit-id-000001".to_vec(),
            ],
        )
        .await;
        assert_eq!((sem[0][0], sem[1].clone()), (-1, vec![-5, -1]));
        let left: i64 = redis::cmd("GET")
            .arg(&k.name)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(left, 1, "one of two permits taken, not two");
        let _: () = redis::cmd("DEL")
            .arg(&k.name)
            .arg(&k.sem_timeouts)
            .arg(&k.sem_size)
            .arg(&k.token)
            .query_async(&mut c)
            .await
            .unwrap();
    }

    /// Review M7: a client whose clock runs an hour ahead cannot reclaim a live permit. The
    /// scripts take now from the server; the old ones trusted the `now` the client sent.
    #[tokio::test]
    async fn a_client_clock_ahead_cannot_reclaim_a_live_permit() {
        let Some(url) = dlock_conformance::service_url("DLOCK_REDIS_URL") else {
            return;
        };
        let mut c = test_connection(&url).await;
        let name = format!("skew-{}", uuid::Uuid::new_v4().simple());
        let k = Keys::new(&name);
        let ahead = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            + 3_600_000)
            .to_string();
        let mut replies = Vec::new();
        for id in [b"permit-id-00000a", b"permit-id-00000b"] {
            let mut inv = SEM_ACQUIRE.prepare_invoke();
            inv.key(&k.name)
                .key(&k.sem_timeouts)
                .key(&k.sem_channel)
                .key(&k.token)
                .key(&k.sem_size);
            // What a skewed client sends as expiry and now (the old layout), then the lease.
            inv.arg("1")
                .arg(ahead.as_str())
                .arg(ahead.as_str())
                .arg("30000")
                .arg("publish")
                .arg(id.as_slice());
            let reply: Vec<i64> = inv.invoke_async(&mut c).await.unwrap();
            replies.push(reply);
        }
        assert_eq!(replies[0][0], -1, "the first permit");
        assert_ne!(
            replies[1][0], -1,
            "a second permit of one, by a clock an hour ahead"
        );
        let _: () = redis::cmd("DEL")
            .arg(&k.name)
            .arg(&k.sem_timeouts)
            .arg(&k.sem_size)
            .arg(&k.token)
            .query_async(&mut c)
            .await
            .unwrap();
    }
}
