//! The mutex's scripts: Redisson's `RLock` / `RFencedLock` (a hash at the name, one field per
//! holder) and `RFairLock` (the same hash, a queue and a timeouts set of waiters' deadlines).

use std::sync::LazyLock;

use redis::Script;

use super::{HASH_KIND, RELEASE_ONE, SERVER_NOW, latched};

/// Mutex acquire. KEYS: name, token. ARGV: lease ms, field.
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

/// Mutex unlock ([`latched`]). KEYS: name, channel, latch. ARGV: message, lease ms, field,
/// publish command, latch ms.
pub(crate) static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&latched(
        2,
        &format!(
            r"
if redis.call('type', KEYS[1])['ok'] ~= 'hash' or redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return nil
end
{RELEASE_ONE}redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[1])
return 1
"
        ),
    ))
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

/// The fair lock's stale-head sweep, shared by its scripts: waiters whose deadline (score,
/// epoch ms) passed, or that have no deadline at all (the queue and the set disagree, e.g.
/// after an eviction), are dropped from the head of the queue. Uses `ARGV[4]` as now (set from
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

/// The fair lock's grant when the lock is free and the queue empty or headed by us; shared
/// by both acquire scripts. Uses `ARGV[3]` as the per-waiter wait.
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
///
/// A queued waiter that runs it again (dlock's look again every third of the wait) moves its
/// own deadline to at least `i` waits from now, `i` its place in the queue (1 at the head),
/// and a wait past the deadline of the waiter before it: a live waiter keeps its place
/// however long the holder holds, and as each grant or leave takes one wait off every
/// deadline and one place off every waiter behind it, a live waiter's deadline stays a wait
/// past its last look. A waiter that died without leaving is skipped a wait after its last
/// look once it heads the queue. (Redisson's
/// waiters never move their deadline: one whose holder holds past it is swept and queues
/// again at the back.)
pub(crate) static FAIR_LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"ARGV[4] = tostring({SERVER_NOW})
{HASH_KIND}{FAIR_SWEEP}{FAIR_GRANT}
local queued = redis.call('zscore', KEYS[3], ARGV[2])
if queued ~= false then
  local wait = tonumber(ARGV[3])
  local floor = tonumber(ARGV[4]) + wait
  local queue = redis.call('lrange', KEYS[2], 0, -1)
  for i = 1, #queue do
    if queue[i] == ARGV[2] then
      floor = tonumber(ARGV[4]) + i * wait
      if i > 1 then
        local before = redis.call('zscore', KEYS[3], queue[i - 1])
        if before ~= false and tonumber(before) + wait > floor then
          floor = tonumber(before) + wait
        end
      end
      break
    end
  end
  if floor > tonumber(queued) then
    redis.call('zadd', KEYS[3], floor, ARGV[2])
  end
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
{HASH_KIND}{FAIR_SWEEP}{FAIR_GRANT}
return {{math.max(0, redis.call('pttl', KEYS[1])), -1}}
"
    ))
});

/// A fair waiter leaves the queue; the waiters behind it get its wait back, and if the lock is
/// free the new head is woken (it may have been told to wait for the one that left). KEYS:
/// queue, timeouts, name, channel. ARGV: field, wait ms, message, publish command.
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

/// Fair unlock ([`latched`]): wakes only the head of the queue, on its own channel. KEYS:
/// name, queue, timeouts, channel, latch. ARGV: message, lease ms, field, (now: from the
/// server's clock), publish command, latch ms.
pub(crate) static FAIR_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&latched(
        4,
        &format!(
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
{RELEASE_ONE}redis.call('del', KEYS[1])
local next = redis.call('lindex', KEYS[2], 0)
if next ~= false then
  redis.call(ARGV[5], KEYS[4] .. ':' .. next, ARGV[1])
end
return 1
"
        ),
    ))
});
