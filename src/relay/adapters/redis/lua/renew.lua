-- renew (ledger_rules.renew): extend a claim still held by this token and attempt to
-- at least now + lease; the new deadline, or 0 when the claim is no longer ours.
-- KEYS: ledger
-- ARGV: field, attempt, token, lease_ms
local f = ARGV[1]
local kind, deadline, attempt, tok = parse(redis.call('HGET', KEYS[1], f))
if kind == 'running' and tok == ARGV[3] and attempt == tonumber(ARGV[2]) then
  local until_ms = math.max(deadline, now_ms() + tonumber(ARGV[4]))
  redis.call('HSET', KEYS[1], f, 'running:' .. fmt(until_ms) .. '#' .. fmt(attempt) .. '#' .. tok)
  return until_ms
end
return 0
