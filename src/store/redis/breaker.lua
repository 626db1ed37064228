-- One breaker's rules (src/breaker/machine.rs and policy.rs) restated for Redis, so that
-- every process sharing the breaker decides on one state, atomically, by the server's clock.
--
-- KEYS[1]  the breaker's hash (see key_name in script.rs)
-- KEYS[2]  the sorted set of the members whose failures are in the current count (score:
--          the slice of the member's last failure under error-rate counting, else 0), under
--          the same hash tag
-- KEYS[3]  acquire only, optional: the flag that isolates the whole breaker the key belongs
--          to (see isolation_name in script.rs); while it exists every key is refused as
--          isolated, also one never written, and nothing else is read or written
-- ARGV[1]  the call: acquire | record | release | isolate | reset | snapshot
-- ARGV[2]  the calling member's name in the fleet
-- ARGV[3..13]  the rules: counting (0 consecutive, 1 error rate), failure threshold,
--          threshold percent, minimum requests, window (us), buckets, reset timeout (us),
--          probe timeout (us), half-open successes, idle expiry (ms), longest reset
--          timeout (us; 0 when the open time does not grow)
-- ARGV[14] the quorum: how many distinct members' failures it takes to open (1: any)
-- ARGV[15..17]  record and release: the permit's period and probe (0 for none), and for
--          record the outcome (1 failure, 0 success)
-- One more ARGV after the call's own, for tests only: the time in microseconds, read instead
--          of the server's clock so that a test can step the breaker through time (the store
--          passes it only when built with its hidden with_clock_for_tests).
--
-- Reply: { sent (1|0), period, probe (0 for none), retry_after (us; -1 while isolated),
--          state, from, to, from, to, ... } with states as 0 closed, 1 open, 2 half-open.
-- snapshot replies { state, isolated (1|0), failures, calls, retry_after (us; -1 for
--          none), open streak, from, to, ... } instead.
-- The changes of state are those this call made, so exactly one caller reports each.

-- ISOLATED is open until reset: callers see it as OPEN.
local CLOSED, OPEN, HALF_OPEN, ISOLATED = 0, 1, 2, 3

local function visible(phase)
  if phase == ISOLATED then return OPEN end
  return phase
end

local key = KEYS[1]
local members_key = KEYS[2]
local call = ARGV[1]
local member = ARGV[2]
local rules = {
  error_rate = tonumber(ARGV[3]) == 1,
  threshold = tonumber(ARGV[4]),
  percent = tonumber(ARGV[5]),
  minimum = tonumber(ARGV[6]),
  window = tonumber(ARGV[7]),
  buckets = tonumber(ARGV[8]),
  reset = tonumber(ARGV[9]),
  probe_timeout = tonumber(ARGV[10]),
  successes = tonumber(ARGV[11]),
  expiry = tonumber(ARGV[12]),
  max_reset = tonumber(ARGV[13]),
  quorum = tonumber(ARGV[14]),
}

-- How many arguments the call takes: the clock of a test may follow them.
local OWN_ARGUMENTS = { record = 17, release = 16 }
local told_now = ARGV[(OWN_ARGUMENTS[call] or 14) + 1]
local now
if told_now then
  now = tonumber(told_now)
else
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local FIELDS = { 'phase', 'period', 'until', 'probe', 'deadline', 'successes', 'probes',
                 'failures', 'origin', 'streak', 'calls' }

-- A breaker that was never written is closed, in period 0, with nothing counted.
local stored = redis.call('HMGET', key, unpack(FIELDS))
local exists = stored[1] ~= false
local m = {}
for i, field in ipairs(FIELDS) do
  m[field] = tonumber(stored[i]) or 0
end

local changed = false
local transitions = {}

-- Redis turns a number argument into text with 14 significant digits; times in
-- microseconds have 16, so each number written is formatted exactly.
local function int(x)
  return string.format('%.0f', x)
end

-- Forgets which members failed: their failures are no longer counted.
local function forget_members()
  redis.call('DEL', members_key)
end

-- Notes that this call's member failed, in slice `slice` (0 when counting in a row).
-- With a quorum of 1 any member opens the breaker, so nobody is noted.
local function note_member(slice)
  if rules.quorum > 1 then
    redis.call('ZADD', members_key, slice, member)
    redis.call('PEXPIRE', members_key, int(rules.expiry))
  end
end

-- Whether enough distinct members failed for the rule to open the shared breaker; under
-- error-rate counting, members whose last failure left the window are forgotten first.
local function quorum_reached(oldest_slice)
  if rules.quorum <= 1 then return true end
  if oldest_slice then
    redis.call('ZREMRANGEBYSCORE', members_key, '-inf', '(' .. int(oldest_slice))
  end
  return redis.call('ZCARD', members_key) >= rules.quorum
end

-- Forgets every counted result.
local function clear_counts()
  forget_members()
  m.failures = 0
  m.calls = 0
  m.origin = 0 -- the window's slices start again at the next result counted
  if rules.error_rate then
    for slot = 0, rules.buckets - 1 do
      redis.call('HDEL', key, 'slice' .. slot, 'total' .. slot, 'failed' .. slot)
    end
  end
end

local function enter(phase)
  table.insert(transitions, visible(m.phase))
  table.insert(transitions, visible(phase))
  m.phase = phase
  m.period = m.period + 1
  m.probe = 0
  m.successes = 0
  if phase == CLOSED then
    -- Failures counted before the breaker opened say nothing about the provider now.
    clear_counts()
    m.streak = 0
  end
  changed = true
end

-- Opens from time_opened for the open time of the streak: reset, doubled at each reopening
-- since the breaker last closed, up to the longest (Rules::open_time).
local function open_until(time_opened)
  if m.phase == CLOSED then m.streak = 1 else m.streak = m.streak + 1 end
  local open_time = rules.reset
  if rules.max_reset > 0 then
    open_time = math.max(math.min(rules.reset * 2 ^ (m.streak - 1), rules.max_reset), rules.reset)
  end
  enter(OPEN)
  m['until'] = time_opened + open_time
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

-- The results and failures in the window that ends in slice `current`.
local function window_sums(current)
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
  return in_window, failed_in_window
end

-- Counts one result of a closed breaker; true when it should open.
local function count(failed)
  if not rules.error_rate then
    if not failed and m.failures == 0 then
      return false -- nothing to write: a success while nothing is counted changes nothing
    end
    changed = true
    m.calls = m.calls + 1
    if failed then
      m.failures = m.failures + 1
      note_member(0)
    else
      -- A success starts the count again, and with it the set of members in it.
      m.failures = 0
      forget_members()
      return false
    end
    return m.failures >= rules.threshold and quorum_reached(nil)
  end
  changed = true
  if m.origin == 0 then
    -- The first result since the count was cleared starts the slices, so they do not
    -- depend on when the key was first written (policy.rs, Window::origin).
    m.origin = now
  end
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
  if failed then note_member(current) end

  local in_window, failed_in_window = window_sums(current)
  return in_window >= rules.minimum and failed_in_window * 100 >= rules.percent * in_window
    and quorum_reached(current - (rules.buckets - 1))
end

-- Writes the breaker back, renewing its expiry, if this call changed it.
local function save()
  if not changed then return end
  local values = {}
  for _, field in ipairs(FIELDS) do
    table.insert(values, field)
    table.insert(values, int(m[field]))
  end
  redis.call('HSET', key, unpack(values))
  redis.call('PEXPIRE', key, int(rules.expiry))
end

-- The reply, with the changes of state this call made after it.
local function with_transitions(reply)
  for _, state in ipairs(transitions) do
    table.insert(reply, state)
  end
  return reply
end

local sent, period, probe, retry_after = 0, 0, 0, 0

-- Isolated as a whole: refused as isolated, the key's own state left as it is (DESIGN §19).
if call == 'acquire' and KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then
  return { 0, m.period, 0, -1, visible(m.phase) }
end

if call == 'acquire' then
  expire()
  if m.phase == OPEN and now >= m['until'] then
    enter(HALF_OPEN)
  end
  period = m.period
  if m.phase == CLOSED then
    sent = 1
  elseif m.phase == ISOLATED then
    retry_after = -1
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
  local permit_period, permit_probe = tonumber(ARGV[15]), tonumber(ARGV[16])
  local failed = tonumber(ARGV[17]) == 1
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
  local permit_period, permit_probe = tonumber(ARGV[15]), tonumber(ARGV[16])
  -- A probe given back after its deadline failed: it reopens the breaker, as time says.
  expire()
  if exists and permit_period == m.period and m.phase == HALF_OPEN and m.probe > 0
      and permit_probe == m.probe then
    m.probe = 0
    changed = true
  end
elseif call == 'isolate' then
  if m.phase == OPEN then
    m.phase = ISOLATED -- open already: no change a listener could hear
    changed = true
  elseif m.phase ~= ISOLATED then
    enter(ISOLATED)
  end
  period = m.period
elseif call == 'reset' then
  if m.phase ~= CLOSED then
    enter(CLOSED)
  else
    -- A new period even for a key never written: a closed breaker gives permits without
    -- writing, and a result of a send made before the reset must count for nothing.
    clear_counts()
    m.period = m.period + 1
    changed = true
  end
  m.streak = 0
  period = m.period
elseif call == 'snapshot' then
  expire()
  local failures, calls = m.failures, m.calls
  if rules.error_rate then
    calls, failures = 0, 0 -- nothing counted since the count was cleared
    if m.origin ~= 0 then
      calls, failures = window_sums(slice_at(now))
    end
  end
  local after = -1
  if m.phase == OPEN then
    after = math.max(m['until'] - now, 0)
  elseif m.phase == HALF_OPEN and m.probe > 0 then
    after = math.max(m.deadline - now, 0)
  end
  local isolated = 0
  if m.phase == ISOLATED then isolated = 1 end
  save()
  return with_transitions({ visible(m.phase), isolated, failures, calls, after, m.streak })
else
  return redis.error_reply('mail-breaker: unknown call ' .. tostring(call))
end

save()
return with_transitions({ sent, period, probe, retry_after, visible(m.phase) })
