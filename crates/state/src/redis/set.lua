-- Set and compare-and-set (common.lua first).
--
-- KEYS[3]: the entry.
-- ARGV[1] now (ms), ARGV[2] the scope's key cap, ARGV[3] its byte cap,
-- ARGV[4] the mode: `set`; `absent`, only if there is no live entry;
-- `equal`, only if the live entry is ARGV[5]. ARGV[6] the value, ARGV[7]
-- its TTL (ms, for Redis), ARGV[8] when it stops counting (ms, for the
-- index), ARGV[9] the bytes it counts.
-- Returns {1} set, {0} not set (not as expected), {2} or {3, bytes} past a
-- cap (over_caps), nothing written.
local key, now, mode = KEYS[3], ARGV[1], ARGV[4]
local bytes = tonumber(ARGV[9])

local function set()
  if mode ~= 'set' then
    local current = false
    if dead(key, now) then
      -- Gone, as a read finds it: a new entry in its place is a new key.
      untrack(key)
      redis.call('DEL', key)
    else
      current = redis.call('GET', key)
    end
    if mode == 'absent' and current then return {0} end
    if mode == 'equal' and current ~= ARGV[5] then return {0} end
  end
  local refusal = over_caps(now, tonumber(ARGV[2]), tonumber(ARGV[3]), function(keys, total)
    if redis.call('ZSCORE', index, key) then
      return keys, total - (tonumber(redis.call('HGET', sizes, key)) or 0) + bytes
    end
    return keys + 1, total + bytes
  end)
  if refusal then return refusal end
  redis.call('SET', key, ARGV[6], 'PX', ARGV[7])
  track(key, ARGV[8], ARGV[9])
  return {1}
end

prune(now, false)
local reply = set()
settle()
return reply
