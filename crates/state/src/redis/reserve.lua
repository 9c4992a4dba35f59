-- Reserve: checks every check against its limit and, only if all pass and
-- the caps allow the new counters, adds every amount (common.lua first).
--
-- KEYS[3..]: two per check, its current bucket's counter and its previous
-- bucket's (the current one again when the window has none).
-- ARGV[1] now (ms), ARGV[2] the scope's key cap, ARGV[3] its byte cap; then
-- five per check: amount, limit, the previous bucket's weight in ppm (0
-- when none), when the current bucket stops counting (ms), the bytes its
-- counter counts.
-- Returns {0, used...}: granted, the standings after; {1, used...,
-- refused...}: refused, the standings before and 1 for each refused check;
-- {2} or {3, bytes}: past a cap (over_caps). Nothing is written unless
-- granted, but dead members of the index.
local now = ARGV[1]
local n = (#KEYS - 2) / 2

local function arg(i, k) return ARGV[3 + (i - 1) * 5 + k] end
local function counter(i) return KEYS[1 + 2 * i] end
local function count(key) return tonumber(redis.call('GET', key)) or 0 end

-- ceil(previous * ppm / 10^6), split so that every product stays exact.
local function weighted(previous, ppm)
  local millions = math.floor(previous / 1000000)
  local rest = previous - millions * 1000000
  return millions * ppm + math.floor((rest * ppm + 999999) / 1000000)
end

-- What check i's window holds: Buckets::estimate (window.rs).
local function estimate(i)
  local used = count(counter(i)) + weighted(count(KEYS[2 + 2 * i]), tonumber(arg(i, 3)))
  if used > MAX then used = MAX end
  return used
end

-- Whether an earlier check names the same counter (key, window, bucket).
local function repeated(i)
  for j = 1, i - 1 do
    if counter(j) == counter(i) then return true end
  end
  return false
end

local function reserve()
  local reply, refused, any = {1}, {}, false
  for i = 1, n do
    local used = estimate(i)
    reply[i + 1] = used
    -- Earlier checks on the same counter would add to it first.
    local total = used + tonumber(arg(i, 1))
    for j = 1, i - 1 do
      if counter(j) == counter(i) then total = total + tonumber(arg(j, 1)) end
    end
    refused[i] = 0
    if total > tonumber(arg(i, 2)) then
      refused[i] = 1
      any = true
    end
  end
  if any then
    for i = 1, n do reply[n + 1 + i] = refused[i] end
    return reply
  end
  local refusal = over_caps(now, tonumber(ARGV[2]), tonumber(ARGV[3]), function(keys, bytes)
    for i = 1, n do
      if not repeated(i) and not redis.call('ZSCORE', index, counter(i)) then
        keys = keys + 1
        bytes = bytes + tonumber(arg(i, 5))
      end
    end
    return keys, bytes
  end)
  if refusal then return refusal end
  for i = 1, n do
    local key = counter(i)
    redis.call('INCRBY', key, arg(i, 1))
    redis.call('PEXPIREAT', key, arg(i, 4))
    if not redis.call('ZSCORE', index, key) then track(key, arg(i, 4), arg(i, 5)) end
  end
  reply = {0}
  for i = 1, n do reply[i + 1] = estimate(i) end
  return reply
end

prune(now, false)
local reply = reserve()
settle()
return reply
