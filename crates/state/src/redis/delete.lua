-- Delete (common.lua first): removes an entry and its bytes; 1 if it was
-- live (present, and not stopped counting by `now`), else 0.
--
-- KEYS[3]: the entry. ARGV[1]: now (ms).
local key, now = KEYS[3], ARGV[1]
local live = redis.call('EXISTS', key) == 1 and not dead(key, now)
if redis.call('ZSCORE', index, key) then untrack(key) end
redis.call('DEL', key)
settle()
if live then return 1 end
return 0
