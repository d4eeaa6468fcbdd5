-- finish: apply each fenced attempt report, then settle.
-- KEYS: ledger, stream, dlq
-- ARGV: group, consumer, id, timestamp, ttl_s, blocked, token,
--       nreports, (field, attempt, kind, arg, reason) * nreports, gate fields...
-- kind: ok | retry (arg = backoff ms) | exhaust (arg unused; reason kept) |
--       release (arg = the marker the claim replaced, '' = absent)
local ledger, stream, dlq = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, id, stamp, ttl, blocked = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local token = ARGV[7]
local nreports = tonumber(ARGV[8])
local now = now_ms()
local rejected = {}
for i = 0, nreports - 1 do
  local f = ARGV[9 + 5 * i]
  local attempt = tonumber(ARGV[10 + 5 * i])
  local kind, arg, reason = ARGV[11 + 5 * i], ARGV[12 + 5 * i], ARGV[13 + 5 * i]
  local mkind, _, mattempt, mtoken = parse(redis.call('HGET', ledger, f))
  if mkind == 'running' and mattempt == attempt and mtoken == token then
    if kind == 'ok' then
      redis.call('HSET', ledger, f, 'ok')
    elseif kind == 'retry' then
      redis.call('HSET', ledger, f,
        'next_attempt_at:' .. fmt(now + tonumber(arg)) .. '#' .. fmt(attempt))
    elseif kind == 'exhaust' then
      redis.call('HSET', ledger, f, 'exhausted:' .. fmt(attempt))
      redis.call('HSET', ledger, '@err:' .. f, reason)
    elseif arg == '' then
      redis.call('HDEL', ledger, f)
    else
      redis.call('HSET', ledger, f, arg)
    end
  else
    table.insert(rejected, f)
  end
end
local gates = {}
for i = 9 + 5 * nreports, #ARGV do table.insert(gates, ARGV[i]) end
local settled = settle(ledger, stream, dlq, group, consumer, id, stamp, ttl, blocked, gates)
return {settled, rejected}
