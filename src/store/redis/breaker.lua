-- One breaker's rules (src/breaker/machine.rs and policy.rs) restated for Redis, so that
-- every process sharing the breaker decides on one state, atomically, by the server's clock.
--
-- KEYS[1]  the breaker's hash (see key_name in mod.rs)
-- ARGV[1]  the call: acquire | record | release
-- ARGV[2..12]  the rules: counting (0 consecutive, 1 error rate), failure threshold,
--          threshold percent, minimum requests, window (us), buckets, reset timeout (us),
--          probe timeout (us), half-open successes, idle expiry (ms)
-- ARGV[12..14]  record and release: the permit's period and probe (0 for none), and for
--          record the outcome (1 failure, 0 success)
--
-- Reply: { sent (1|0), period, probe (0 for none), retry_after (us), state,
--          from, to, from, to, ... } with states as 0 closed, 1 open, 2 half-open.
-- The changes of state are those this call made, so exactly one caller reports each.

local CLOSED, OPEN, HALF_OPEN = 0, 1, 2

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local key = KEYS[1]
local call = ARGV[1]
local rules = {
  error_rate = tonumber(ARGV[2]) == 1,
  threshold = tonumber(ARGV[3]),
  percent = tonumber(ARGV[4]),
  minimum = tonumber(ARGV[5]),
  window = tonumber(ARGV[6]),
  buckets = tonumber(ARGV[7]),
  reset = tonumber(ARGV[8]),
  probe_timeout = tonumber(ARGV[9]),
  successes = tonumber(ARGV[10]),
  expiry = tonumber(ARGV[11]),
}

local FIELDS = { 'phase', 'period', 'until', 'probe', 'deadline', 'successes', 'probes',
                 'failures', 'origin' }

local stored = redis.call('HMGET', key, unpack(FIELDS))
local exists = stored[1] ~= false
local m = {}
for i, field in ipairs(FIELDS) do
  m[field] = tonumber(stored[i]) or 0
end
if not exists then
  m.origin = now -- a breaker that was never written is closed, in period 0, counting from now
end

local changed = false
local transitions = {}

-- Redis turns a number argument into text with 14 significant digits; times in
-- microseconds have 16, so each number written is formatted exactly.
local function int(x)
  return string.format('%.0f', x)
end

local function enter(phase)
  table.insert(transitions, m.phase)
  table.insert(transitions, phase)
  m.phase = phase
  m.period = m.period + 1
  m.probe = 0
  m.successes = 0
  if phase == CLOSED then
    -- Failures counted before the breaker opened say nothing about the provider now.
    m.failures = 0
    m.origin = now
    if rules.error_rate then
      for slot = 0, rules.buckets - 1 do
        redis.call('HDEL', key, 'slice' .. slot, 'total' .. slot, 'failed' .. slot)
      end
    end
  end
  changed = true
end

local function open_until(time_opened)
  enter(OPEN)
  m['until'] = time_opened + rules.reset
end

-- What time alone does: a probe past its deadline fails and reopens from that deadline.
local function expire()
  if m.phase == HALF_OPEN and m.probe > 0 and now >= m.deadline then
    open_until(m.deadline)
  end
end

local function bucket_width()
  return math.max(math.floor(rules.window / rules.buckets), 1)
end

local function slice_at(time)
  return math.floor(math.max(time - m.origin, 0) / bucket_width()) + 1
end

-- Counts one result of a closed breaker; true when it should open.
local function count(failed)
  if not rules.error_rate then
    if not failed and m.failures == 0 then
      return false -- nothing to write
    end
    changed = true
    if failed then m.failures = m.failures + 1 else m.failures = 0 end
    return m.failures >= rules.threshold
  end
  changed = true
  local current = slice_at(now)
  local slot = current % rules.buckets
  local names = { 'slice' .. slot, 'total' .. slot, 'failed' .. slot }
  local bucket = redis.call('HMGET', key, unpack(names))
  local total, failures = 0, 0
  if tonumber(bucket[1]) == current then
    total, failures = tonumber(bucket[2]) or 0, tonumber(bucket[3]) or 0
  end
  total = total + 1
  if failed then failures = failures + 1 end
  redis.call('HSET', key, names[1], int(current), names[2], int(total), names[3], int(failures))

  local oldest = current - (rules.buckets - 1)
  local in_window, failed_in_window = 0, 0
  for other = 0, rules.buckets - 1 do
    local b = redis.call('HMGET', key, 'slice' .. other, 'total' .. other, 'failed' .. other)
    local at = tonumber(b[1]) or 0
    if at >= oldest and at <= current and at ~= 0 then
      in_window = in_window + (tonumber(b[2]) or 0)
      failed_in_window = failed_in_window + (tonumber(b[3]) or 0)
    end
  end
  return in_window >= rules.minimum and failed_in_window * 100 >= rules.percent * in_window
end

local sent, period, probe, retry_after = 0, 0, 0, 0

if call == 'acquire' then
  expire()
  if m.phase == OPEN and now >= m['until'] then
    enter(HALF_OPEN)
  end
  period = m.period
  if m.phase == CLOSED then
    sent = 1
  elseif m.phase == OPEN then
    retry_after = m['until'] - now
  elseif m.probe > 0 then
    retry_after = m.deadline - now
  else
    m.probes = m.probes + 1
    m.probe = m.probes
    m.deadline = now + rules.probe_timeout
    changed = true
    sent, probe = 1, m.probe
  end
elseif call == 'record' then
  local permit_period, permit_probe = tonumber(ARGV[12]), tonumber(ARGV[13])
  local failed = tonumber(ARGV[14]) == 1
  expire()
  -- A result sent in an earlier period decides nothing.
  if permit_period == m.period then
    if m.phase == CLOSED and permit_probe == 0 then
      if count(failed) then
        open_until(now)
      end
    elseif m.phase == HALF_OPEN and m.probe > 0 and permit_probe == m.probe then
      if failed then
        open_until(now)
      else
        m.successes = m.successes + 1
        m.probe = 0
        changed = true
        if m.successes >= rules.successes then
          enter(CLOSED)
        end
      end
    end
  end
elseif call == 'release' then
  local permit_period, permit_probe = tonumber(ARGV[12]), tonumber(ARGV[13])
  -- A probe given back after its deadline failed: it reopens the breaker, as time says.
  expire()
  if exists and permit_period == m.period and m.phase == HALF_OPEN and m.probe > 0
      and permit_probe == m.probe then
    m.probe = 0
    changed = true
  end
else
  return redis.error_reply('mail-breaker: unknown call ' .. tostring(call))
end

if changed then
  local values = {}
  for _, field in ipairs(FIELDS) do
    table.insert(values, field)
    table.insert(values, int(m[field]))
  end
  redis.call('HSET', key, unpack(values))
  redis.call('PEXPIRE', key, int(rules.expiry))
end

local reply = { sent, period, probe, retry_after, m.phase }
for _, state in ipairs(transitions) do
  table.insert(reply, state)
end
return reply
