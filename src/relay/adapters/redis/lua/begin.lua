-- begin: classify once, claim every eligible invocation, settle if nothing was claimed.
-- KEYS: ledger, stream, dlq
-- ARGV: header, classification, token,
--       claims (records "field FS max_attempts FS lease_ms" joined by RS), gates (joined by RS)
local ledger, stream, dlq = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, id, stamp, ttl, blocked = header(ARGV[1])
local token = ARGV[3]
local classified = redis.call('HSETNX', ledger, '@class', ARGV[2])
local now = now_ms()
local statuses = {}
local claimed = 0
for _, record in ipairs(split(ARGV[4], RS)) do
  local c = split(record, FS)
  local f, max_attempts, lease = c[1], math.max(1, tonumber(c[2])), tonumber(c[3])
  local prev = redis.call('HGET', ledger, f)
  local kind, deadline, attempt = parse(prev)
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
      'running:' .. fmt(now + lease) .. '#' .. fmt(next_attempt) .. '#' .. token,
      '@at:' .. f, fmt(now))
    table.insert(statuses, {f, 'claimed', next_attempt, fmt(now + lease), prev or '', 0})
    claimed = claimed + 1
  end
end
local settled = {0, {}, ''}
if claimed == 0 then
  settled = settle(ledger, stream, dlq, group, consumer, id, stamp, ttl, blocked,
    split(ARGV[5], RS))
end
return {classified, statuses, settled}
