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
local now = nil -- the server clock, read only when a retry needs a deadline
local rejected = {}
local known = {} -- markers this script wrote (false = deleted), for settle
for i, record in ipairs(split(ARGV[3], RS)) do
  local r = split(record, FS)
  local f, attempt, kind, arg = r[1], tonumber(r[2]), r[3], r[4] or ''
  local marker = redis.call('HGET', ledger, f)
  local mkind, _, mattempt, mtoken = parse(marker)
  if mkind == 'running' and mattempt == attempt and mtoken == token then
    if kind == 'ok' then
      marker = 'ok'
    elseif kind == 'retry' then
      now = now or now_ms()
      marker = 'next_attempt_at:' .. fmt(now + tonumber(arg)) .. '#' .. fmt(attempt)
    elseif kind == 'exhaust' then
      marker = 'exhausted:' .. fmt(attempt)
      redis.call('HSET', ledger, '@err:' .. f, ARGV[4 + i])
    elseif arg == '' then
      marker = false
    else
      marker = arg
    end
    if not marker then -- a released claim that replaced nothing: as if never claimed
      redis.call('HDEL', ledger, f, '@at:' .. f)
    else
      redis.call('HSET', ledger, f, marker)
      if kind == 'release' then redis.call('HDEL', ledger, '@at:' .. f) end
    end
  else
    table.insert(rejected, f)
  end
  known[f] = marker
end
local settled = settle(ledger, stream, dlq, group, consumer, id, stamp, ttl, blocked,
  split(ARGV[4], RS), known)
return {settled, rejected}
