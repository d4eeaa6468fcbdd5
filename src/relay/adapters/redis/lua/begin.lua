-- begin: classify once, claim every eligible invocation, settle if nothing was claimed.
-- KEYS: ledger, stream, dlq
-- ARGV: group, consumer, id, timestamp, ttl_s, blocked, classification, token,
--       nclaims, (field, max_attempts, lease_ms) * nclaims, gate fields...
local ledger, stream, dlq = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, id, stamp, ttl, blocked = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local token = ARGV[8]
local classified = redis.call('HSETNX', ledger, '@class', ARGV[7])
local now = now_ms()
local nclaims = tonumber(ARGV[9])
local statuses = {}
local claimed = 0
for i = 0, nclaims - 1 do
  local f = ARGV[10 + 3 * i]
  local max_attempts = math.max(1, tonumber(ARGV[11 + 3 * i]))
  local lease = tonumber(ARGV[12 + 3 * i])
  local prev = redis.call('HGET', ledger, f)
  local kind, deadline, attempt, extra = parse(prev)
  if kind == 'ok' then
    table.insert(statuses, {f, 'ok', 0, 0, '', 0})
  elseif kind == 'exhausted' then
    table.insert(statuses, {f, 'exhausted', attempt, 0, '', 0})
  elseif (kind == 'running' or kind == 'backoff') and now < deadline then
    table.insert(statuses, {f, kind, attempt, fmt(deadline), '', 0})
  elseif (kind == 'running' or kind == 'backoff') and attempt >= max_attempts then
    redis.call('HSET', ledger, f, 'exhausted:' .. fmt(attempt))
    redis.call('HSET', ledger, '@err:' .. f, 'retries exhausted after ' .. fmt(attempt) ..
      ' attempt(s): attempt ' .. fmt(attempt) .. ' did not finish before its deadline')
    table.insert(statuses, {f, 'exhausted', attempt, 0, '', 1})
  else
    local next_attempt = 1
    if kind == 'running' or kind == 'backoff' then next_attempt = attempt + 1 end
    redis.call('HSET', ledger, f,
      'running:' .. fmt(now + lease) .. '#' .. fmt(next_attempt) .. '#' .. token)
    table.insert(statuses, {f, 'claimed', next_attempt, fmt(now + lease), prev or '', 0})
    claimed = claimed + 1
  end
end
local settled = {0, {}, ''}
if claimed == 0 then
  local gates = {}
  for i = 10 + 3 * nclaims, #ARGV do table.insert(gates, ARGV[i]) end
  settled = settle(ledger, stream, dlq, group, consumer, id, stamp, ttl, blocked, gates)
end
return {classified, statuses, settled}
