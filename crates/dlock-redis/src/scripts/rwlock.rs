//! The read-write lock's scripts: Redisson's `RReadWriteLock` (a hash at the name with a
//! `mode` field, one field per holder, and a timeout key per read hold).

use std::sync::LazyLock;

use redis::Script;

use super::{HASH_KIND, RAN_BEFORE, RELEASE_ONE, latched};

/// Read acquire. KEYS: name, read-timeouts base, token. ARGV: lease ms, read field, write
/// field of this owner's write hold (downgrade), or an empty string. A hash without `mode` is
/// a mutex hold, exclusive like a write hold.
pub(crate) static READ_LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{HASH_KIND}{RAN_BEFORE}local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false and kind == 'hash' then
  return {{redis.call('pttl', KEYS[1]), -1}}
end
if mode == false then
  local token = redis.call('incr', KEYS[3])
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1)
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {{-1, token}}
end
if mode == 'read' or (mode == 'write' and ARGV[3] ~= '' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local token = redis.call('incr', KEYS[3])
  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local key = KEYS[2] .. ':' .. n
  redis.call('set', key, 1)
  redis.call('pexpire', key, ARGV[1])
  local left = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(left, tonumber(ARGV[1])))
  return {{-1, token}}
end
return {{redis.call('pttl', KEYS[1]), -1}}
"
    ))
});

/// The opening of both unlock scripts: a key of another type is not held (nil); a hash
/// without `mode` (a mutex hold) means ours is gone, and the waiters on the rw channel
/// (`KEYS[2]`) are woken with the message `ARGV[1]`, sent by the publish command `publish` (an
/// ARGV), before the answer nil. Leaves the hash's mode in `mode`.
fn unlock_opening(publish: &str) -> String {
    format!(
        r"
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return nil
end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call({publish}, KEYS[2], ARGV[1])
  return nil
end
"
    )
}

/// Read unlock ([`latched`]): the hash lives as long as its longest read hold. KEYS: name, rw
/// channel, read-timeouts base, key prefix, latch. ARGV: message, read field, publish command,
/// latch ms.
pub(crate) static READ_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    let opening = unlock_opening("ARGV[3]");
    Script::new(&latched(
        4,
        &format!(
            r"{opening}if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
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
"
        ),
    ))
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
    Script::new(&format!(
        r"{HASH_KIND}{RAN_BEFORE}if kind == 'none' then
  local token = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {{-1, token}}
end
return {{redis.call('pttl', KEYS[1]), -1}}
"
    ))
});

/// Write unlock: a writer that also reads (downgraded) leaves the lock in read mode; otherwise
/// every waiter is woken (message 1: readers may all proceed); [`latched`]. KEYS: name, rw
/// channel, latch. ARGV: message, lease ms, write field, publish command, latch ms.
pub(crate) static WRITE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    let opening = unlock_opening("ARGV[4]");
    Script::new(&latched(
        2,
        &format!(
            r"{opening}if mode ~= 'write' or redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return nil
end
{RELEASE_ONE}redis.call('hdel', KEYS[1], ARGV[3])
if redis.call('hlen', KEYS[1]) == 1 then
  redis.call('del', KEYS[1])
  redis.call(ARGV[4], KEYS[2], ARGV[1])
else
  redis.call('hset', KEYS[1], 'mode', 'read')
end
return 1
"
        ),
    ))
});
