-- A rate limiter shared by a fleet: GCRA with a burst, and an adaptive rate, timed by the
-- Redis server's clock. The same rules as src/rate/gcra.rs and src/rate/adaptive.rs, in the
-- same arithmetic step for step (whole µs; the interval ceil(1e6 / rate), capped; what is
-- owed counted again at a new interval), so that both answer a sequence alike.
--
-- KEYS[1]  the limiter's hash: tat (µs), interval (µs, the one tat was counted in), base
--          (sends per second after the last throttle), since (µs, the last halving)
-- ARGV[1]  "take" (reserve the next slot) or "throttle" (the provider throttled: halve)
-- ARGV[2]  the configured rate, sends per second
-- ARGV[3]  the burst
-- ARGV[4]  the longest wait, µs
-- ARGV[5]  the lowest rate, sends per second
-- ARGV[6]  how long the hash stays after its last write, ms
-- ARGV[7]  the calling process's name in the fleet (the store's member name)
-- ARGV[8]  how many slots the send costs (one per recipient when counted so; at least 1)
-- ARGV[9]  (tests only) the time, µs, instead of the server's clock; empty: the server's
-- ARGV[10] what the rate is multiplied by for this send (a reputation breaker's throttle:
--          0.5), in (0, 1]; absent: 1. The adaptive state is kept without it.
--
-- Replies {granted, wait_or_retry_after_us, rate_in_millis_per_second, members} (the rate
-- before ARGV[10]): granted 1
-- with the wait before the reserved slot, 0 with how long past the longest wait the slot
-- would come (nothing reserved); "throttle" replies {2, 0, the new rate, members}. `members`
-- is how many processes called within the last ten minutes, this one included: while Redis
-- is down, each takes that share of the rate and the burst.

local key = KEYS[1]
local op = ARGV[1]
local configured = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local floor_rate = math.min(tonumber(ARGV[5]), configured)
local expiry = tonumber(ARGV[6])
local member = ARGV[7] or ''
local cost = math.max(tonumber(ARGV[8]) or 1, 1)
local factor = tonumber(ARGV[10]) or 1
if not (factor > 0 and factor <= 1) then
    factor = 1
end
local now = tonumber(ARGV[9] or '')
if now == nil then
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- Intervals, tolerances and waits stay below 2^50 µs, so that every sum is exact.
local CAP = 1125899906842624
local OWED_CAP = 3 * CAP

-- The processes sharing the limiter: a field `member:<name>` each, the time last seen; those
-- not seen for ten minutes are forgotten.
local SEEN_WITHIN = 600000000
redis.call('HSET', key, 'member:' .. member, string.format('%.0f', now))
redis.call('PEXPIRE', key, expiry)
local members = 0
local fields = redis.call('HGETALL', key)
for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 7) == 'member:' then
        if now - (tonumber(fields[i + 1]) or 0) < SEEN_WITHIN then
            members = members + 1
        else
            redis.call('HDEL', key, name)
        end
    end
end

local state = redis.call('HMGET', key, 'tat', 'base', 'since', 'interval')
local tat = tonumber(state[1])
local base = tonumber(state[2]) or configured
-- A hash without `since` was never halved: 0 is decades before any clock's now.
local since = tonumber(state[3]) or 0

-- Each whole second without a throttle gives back 5 % of the configured rate.
local quiet = math.floor(math.max(now - since, 0) / 1000000)
local rate = math.min(configured, base + 0.05 * configured * quiet)

if op == 'throttle' then
    -- Throttles within a second of a halving answer sends made before it: no new signal.
    if now - since < 1000000 then
        return {2, 0, math.floor(rate * 1000), members}
    end
    local halved = math.max(rate * 0.5, floor_rate)
    -- 17 digits: the very number, read back as it was written.
    redis.call('HSET', key, 'base', string.format('%.17g', halved),
        'since', string.format('%.0f', now))
    redis.call('PEXPIRE', key, expiry)
    return {2, 0, math.floor(halved * 1000), members}
end

-- The interval, rounded up: never faster than the rate (times the factor, the same product
-- as src/rate/local.rs's).
local interval = math.ceil(1000000 / (rate * factor))
if interval ~= interval or interval < 1 then
    interval = 1
elseif interval >= CAP then
    interval = CAP
end
local tolerance = math.min(interval * math.max(burst - 1, 0), CAP)
local longest = math.min(max_wait, CAP)
if tat == nil or tat <= now then
    tat = now
else
    -- What is owed was counted at another rate: as many sends, at this interval, rounded up.
    local counted_in = tonumber(state[4]) or interval
    if counted_in ~= interval then
        local owed = math.ceil((tat - now) * interval / counted_in)
        if owed >= OWED_CAP then
            owed = OWED_CAP
        end
        tat = now + owed
    end
end
-- A send of several slots goes once min(cost, burst) are free, and owes them all.
local ahead = math.min(interval * (math.min(cost, math.max(burst, 1)) - 1), CAP)
local charge = math.min(interval * cost, CAP)
local slot = math.max(tat + ahead - tolerance, now)
local wait = slot - now
if wait > longest then
    return {0, wait - longest, math.floor(rate * 1000), members}
end
redis.call('HSET', key, 'tat', string.format('%.0f', tat + charge),
    'interval', string.format('%.0f', interval))
redis.call('PEXPIRE', key, expiry)
return {1, wait, math.floor(rate * 1000), members}
