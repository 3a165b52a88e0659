//! The election's scripts: the leader's proposal lives in a hash beside the lock
//! (`dlock_election:{name}`, fields `term` and `proposal`), written only by the holder of the
//! lock in the term it was granted, and read only together with the lock and its token, so a
//! proposal outlived by its term is never taken for the leader's.

use std::sync::LazyLock;

use redis::Script;

/// Posts a proposal. KEYS: name, token, proposal hash. ARGV: term, proposal. Returns 1 if the
/// lock is held in that term (its last token), else 0 and nothing changes. The holder's
/// field of the lock's hash goes with it: a reader takes the proposal only while that field
/// holds (a Java `RLock` taking the name does not move the token).
pub(crate) static POST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('type', KEYS[1])['ok'] ~= 'hash' then
  return 0
end
if tonumber(redis.call('get', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then
  return 0
end
local holder = redis.call('hkeys', KEYS[1])[1]
redis.call('hset', KEYS[3], 'term', ARGV[1], 'proposal', ARGV[2], 'holder', holder)
return 1
",
    )
});

/// Who leads. KEYS: name, token, proposal hash. Returns nil when the lock is free, else
/// `{token, term of the proposal or nil, proposal or nil}`: the proposal only while the field
/// that posted it still holds the lock.
pub(crate) static LEADER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('type', KEYS[1])['ok'] ~= 'hash' then
  return nil
end
local note = redis.call('hmget', KEYS[3], 'term', 'proposal', 'holder')
if not note[3] or redis.call('hexists', KEYS[1], note[3]) == 0 then
  return {redis.call('get', KEYS[2]), false, false}
end
return {redis.call('get', KEYS[2]), note[1], note[2]}
",
    )
});
