//! The semaphore's scripts: Redisson's `RPermitExpirableSemaphore` (a counter of free permits
//! at the name, a timeouts set of held permits' expiries), plus dlock's record of the size.

use std::sync::LazyLock;

use redis::Script;

use super::{SERVER_NOW, latched};

/// The permit-expirable semaphore's reclaim of expired permits, shared by its scripts.
/// `KEYS[1]` counter, `KEYS[2]` timeouts, `KEYS[3]` channel; `ARGV[3]` now, `ARGV[5]` publish command.
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

/// Permit release ([`latched`]); publishes the number of available permits. KEYS: counter,
/// channel, timeouts, latch. ARGV: permit id, (now: from the server's clock), publish command,
/// latch ms. Returns 1, or nil if the permit was not held (expired or never granted).
pub(crate) static SEM_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&latched(
        3,
        &format!(
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
        ),
    ))
});
