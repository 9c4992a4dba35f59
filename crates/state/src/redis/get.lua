-- Get: an entry's value, unless absent or, by the index, stopped counting
-- by `now` (Redis expires it by its own clock too). Writes nothing.
--
-- KEYS[1]: the scope's index (common.lua), KEYS[2]: the entry.
-- ARGV[1]: now (ms).
local score = redis.call('ZSCORE', KEYS[1], KEYS[2])
if score and tonumber(score) <= tonumber(ARGV[1]) then return false end
return redis.call('GET', KEYS[2])
