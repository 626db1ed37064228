-- The reputation breaker of one member (src/reputation/window.rs restated for Redis, so that
-- every process sharing the store counts into one window and sees one open flag).
-- KEYS[1]: the member's hash. KEYS[2]: the ids of the events it counted (a sorted set).
-- ARGV: op ('record', 'standing', 'reset'), window_sends, buckets,
--       hard bounces' warn, throttle, open (ppm), minimum sends,
--       complaints' warn, throttle, open (ppm), minimum sends,
--       sends, how many ids to keep, how long to keep them (ms),
--       then each event heard as a pair: signal ('b' or 'c'), id.
-- Reply: {tier before, tier after, window sends, window hard bounces, window complaints,
--         events new}.
local op = ARGV[1]
local window_sends = tonumber(ARGV[2])
local buckets = math.max(1, tonumber(ARGV[3]))
local limits = {
  b = {tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])},
  c = {tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])},
}
local sends = tonumber(ARGV[12])
local keep_ids = tonumber(ARGV[13])
local keep_ms = tonumber(ARGV[14])
local size = math.max(1, math.floor(window_sends / buckets))

local raw = redis.call('HGETALL', KEYS[1])
local st = {}
for i = 1, #raw, 2 do st[raw[i]] = tonumber(raw[i + 1]) end
local total = st.total or 0
local open = st.open or 0
local tier = st.tier or 0
local seq = st.seq or 0
local from = tier

-- Bucket n lives at slot n % buckets as {n, sends, hard bounces, complaints}.
local ring = {}
local fits = st.size == size and st.buckets == buckets
local function empty_ring()
  for i = 0, buckets - 1 do ring[i] = {i, 0, 0, 0} end
end
if fits then
  for i = 0, buckets - 1 do
    ring[i] = {st['n' .. i] or i, st['s' .. i] or 0, st['b' .. i] or 0, st['c' .. i] or 0}
  end
else
  empty_ring()
end

local function bucket(n)
  local r = ring[n % buckets]
  if r[1] ~= n then
    r[1] = n; r[2] = 0; r[3] = 0; r[4] = 0
  end
  return r
end

local function window()
  local current = math.floor(total / size)
  local w = {0, 0, 0}
  for i = 0, buckets - 1 do
    local r = ring[i]
    if r[1] <= current and r[1] + buckets > current then
      w[1] = w[1] + r[2]; w[2] = w[2] + r[3]; w[3] = w[3] + r[4]
    end
  end
  return w
end

-- The tier one rate reaches: none below its minimum volume, else the highest threshold the
-- rate is at or above (events / sends >= ppm / 1e6, without division).
local function level(l, events, n)
  if n == 0 or n < l[4] then return 0 end
  local e = events * 1000000
  if e >= l[3] * n then return 3 end
  if e >= l[2] * n then return 2 end
  if e >= l[1] * n then return 1 end
  return 0
end

local function reply(new)
  local w = window()
  return {from, tier, w[1], w[2], w[3], new}
end

if op == 'standing' then
  return reply(0)
end

if op == 'reset' then
  total = 0; open = 0; tier = 0
  empty_ring()
else
  if not fits then total = 0 end
  -- Sends past a whole window fill buckets that roll out before this call ends.
  local left = sends
  local whole = size * buckets
  if left > whole then
    total = total + (left - whole)
    left = whole
  end
  while left > 0 do
    local room = size - (total % size)
    local take = math.min(left, room)
    local r = bucket(math.floor(total / size))
    r[2] = r[2] + take
    total = total + take
    left = left - take
  end
  local r = bucket(math.floor(total / size))
  local new = 0
  for i = 15, #ARGV - 1, 2 do
    seq = seq + 1
    if redis.call('ZADD', KEYS[2], 'NX', seq, ARGV[i + 1]) == 1 then
      new = new + 1
      if ARGV[i] == 'b' then r[3] = r[3] + 1 else r[4] = r[4] + 1 end
    end
  end
  if #ARGV >= 15 then
    redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(keep_ids + 1))
    redis.call('PEXPIRE', KEYS[2], keep_ms)
  end
  if open == 1 then
    tier = 3
  else
    local w = window()
    local before = tier
    tier = math.max(level(limits.b, w[2], w[1]), level(limits.c, w[3], w[1]))
    -- A throttle lasts until the rates fall below warn.
    if tier == 1 and before == 2 then tier = 2 end
    if tier == 3 then open = 1 end
  end
  st.new = new
end

local fields = {'size', size, 'buckets', buckets, 'total', total, 'open', open, 'tier', tier, 'seq', seq}
for i = 0, buckets - 1 do
  local r = ring[i]
  table.insert(fields, 'n' .. i); table.insert(fields, r[1])
  table.insert(fields, 's' .. i); table.insert(fields, r[2])
  table.insert(fields, 'b' .. i); table.insert(fields, r[3])
  table.insert(fields, 'c' .. i); table.insert(fields, r[4])
end
redis.call('HSET', KEYS[1], unpack(fields))
return reply(st.new or 0)
