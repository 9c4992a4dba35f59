-- Commit: adds to each charged counter what the call used beyond its
-- reservation (negative: gives the rest back), in the bucket it was
-- charged to. A counter that is gone (its bucket stopped counting, and
-- Redis or a prune dropped it) stays gone; none goes below 0 or past
-- 2^53 - 1. Counters count no bytes of their value, so the index is left
-- as it is.
--
-- KEYS: the counters, all of one scope. ARGV: for each, what to add.
local MAX = 9007199254740991
for i, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  if value then
    local count = tonumber(value) or 0
    local new = math.min(math.max(count + tonumber(ARGV[i]), 0), MAX)
    -- INCRBY keeps the counter's expiry.
    if new ~= count then redis.call('INCRBY', key, string.format('%.0f', new - count)) end
  end
end
return 0
