-- The start of every script that writes a scope's keys (reserve, set,
-- delete): the scope's index, which the plugin's caps are checked against.
--
-- KEYS[1], `sluice:{ns/plugin}:idx`: a sorted set; member = a key of the
-- scope (a counter's bucket or an entry), score = when it stops counting,
-- in Unix ms by the gateway's clock (never Redis's: replicas and tests
-- name the time).
-- KEYS[2], `sluice:{ns/plugin}:size`: a hash; member = the same key, value
-- = the bytes it counts against the plugin (the plugin's key and value, or
-- 8 for a counter's value, as the in-process store counts them); field
-- `total` = their sum. No key of the layout is named `total`.
--
-- Every key here is the scope's (one hash tag, so one Cluster slot); the
-- index's members are too, so deleting them touches nothing else.
local index, sizes = KEYS[1], KEYS[2]
-- Counts and limits are kept at most 2^53 - 1: Lua's numbers are doubles.
local MAX = 9007199254740991
-- Dead members dropped per call when the caps are not in question: a
-- bounded cost; all of them are dropped before a call is refused.
local BATCH = 64

-- An integer as Redis reads one (tostring gives 14 significant digits).
local function int(n)
  if n == 0 then return '0' end
  return string.format('%.0f', n)
end

-- Drops members whose key stopped counting by `now`, and those keys: up
-- to BATCH of them, or all with `all`.
local function prune(now, all)
  repeat
    local dead = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, BATCH)
    if #dead == 0 then return end
    local freed = 0
    for _, key in ipairs(dead) do
      freed = freed + (tonumber(redis.call('HGET', sizes, key)) or 0)
    end
    redis.call('ZREM', index, unpack(dead))
    redis.call('HDEL', sizes, unpack(dead))
    redis.call('DEL', unpack(dead))
    if freed ~= 0 then redis.call('HINCRBY', sizes, 'total', int(-freed)) end
  until not all or #dead < BATCH
end

-- The keys and bytes the scope holds.
local function held()
  return redis.call('ZCARD', index), tonumber(redis.call('HGET', sizes, 'total')) or 0
end

-- Nil if the scope may hold what `after(keys, bytes)` says it would hold
-- once the call is done; else the refusal: {2} past the key cap, {3,
-- bytes} past the byte cap. Only growth is refused (a lowered cap leaves
-- what is held alone), and only once every dead member is dropped.
local function over_caps(now, max_keys, max_bytes, after)
  local function over()
    local keys, bytes = held()
    local new_keys, new_bytes = after(keys, bytes)
    if new_keys > keys and new_keys > max_keys then return {2} end
    if new_bytes > bytes and new_bytes > max_bytes then return {3, new_bytes} end
    return nil
  end
  local refusal = over()
  if refusal then
    prune(now, true)
    refusal = over()
  end
  return refusal
end

-- Counts `key` in the index: it stops counting at `expires` (a string, as
-- given) and counts `bytes`.
local function track(key, expires, bytes)
  local old = tonumber(redis.call('HGET', sizes, key)) or 0
  redis.call('ZADD', index, expires, key)
  redis.call('HSET', sizes, key, bytes)
  local grown = tonumber(bytes) - old
  if grown ~= 0 then redis.call('HINCRBY', sizes, 'total', int(grown)) end
end

-- Takes `key` out of the index.
local function untrack(key)
  local old = tonumber(redis.call('HGET', sizes, key)) or 0
  redis.call('ZREM', index, key)
  redis.call('HDEL', sizes, key)
  if old ~= 0 then redis.call('HINCRBY', sizes, 'total', int(-old)) end
end

-- Gives the index the expiry of its last member, or deletes it once empty,
-- so that an idle scope leaves nothing behind.
local function settle()
  local last = redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', index, sizes)
    return
  end
  redis.call('PEXPIREAT', index, last[2])
  redis.call('PEXPIREAT', sizes, last[2])
end

-- Whether the index says `key` stopped counting by `now` (a key it does
-- not hold is left to Redis's own expiry).
local function dead(key, now)
  local score = redis.call('ZSCORE', index, key)
  return score and tonumber(score) <= tonumber(now)
end
