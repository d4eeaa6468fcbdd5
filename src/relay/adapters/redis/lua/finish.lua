-- finish: apply each fenced attempt report, then settle.
-- KEYS: ledger, stream, dlq
-- ARGV: header, token, reports (records "field FS attempt FS kind FS arg" joined by RS),
--       gates (joined by RS), then one reason per report (free text, kept as the DLQ
--       reason when it exhausts)
-- kind: ok | retry (arg = backoff ms) | exhaust | release (arg = the marker the claim
--       replaced, '' = absent)
local ledger, stream, dlq = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, id, stamp, ttl, blocked = header(ARGV[1])
local token = ARGV[2]
local now = now_ms()
local rejected = {}
for i, record in ipairs(split(ARGV[3], RS)) do
  local r = split(record, FS)
  local f, attempt, kind, arg = r[1], tonumber(r[2]), r[3], r[4] or ''
  local mkind, _, mattempt, mtoken = parse(redis.call('HGET', ledger, f))
  if mkind == 'running' and mattempt == attempt and mtoken == token then
    if kind == 'ok' then
      redis.call('HSET', ledger, f, 'ok')
    elseif kind == 'retry' then
      redis.call('HSET', ledger, f,
        'next_attempt_at:' .. fmt(now + tonumber(arg)) .. '#' .. fmt(attempt))
    elseif kind == 'exhaust' then
      redis.call('HSET', ledger, f, 'exhausted:' .. fmt(attempt))
      redis.call('HSET', ledger, '@err:' .. f, ARGV[4 + i])
    elseif arg == '' then
      redis.call('HDEL', ledger, f)
    else
      redis.call('HSET', ledger, f, arg)
    end
  else
    table.insert(rejected, f)
  end
end
local settled = settle(ledger, stream, dlq, group, consumer, id, stamp, ttl, blocked,
  split(ARGV[4], RS))
return {settled, rejected}
