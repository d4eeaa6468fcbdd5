-- finish (ledger_rules.finish): apply each fenced attempt report, then settle.
-- KEYS: ledger, stream, dlq
-- ARGV: header, token, reports (records "field FS attempt FS kind FS arg" joined by RS),
--       gates (joined by RS), released (joined by RS), then one reason per report
--       (free text: kept as @err:<field> by a retry and an exhaust, the DLQ reason then)
-- kind: ok | retry (arg = backoff ms) | exhaust | release (arg = the marker the claim
--       replaced, '' = absent)
local c = context(KEYS, ARGV[1])
local token = ARGV[2]
local h = load_hash(c.ledger)
local now = nil -- the server clock, read only when a retry needs a deadline
local rejected, replayed = {}, {}

-- Whether this report was applied by an earlier send of this same call.
local function applied_before(f, kind, attempt, arg, err, mkind, mattempt)
  if kind == 'release' then return h['@at:' .. f] == nil and (h[f] or '') == arg end
  if stamp_token(h['@at:' .. f]) ~= token then return false end
  if kind == 'ok' then return mkind == 'ok' end
  if kind == 'retry' then return mkind == 'backoff' and mattempt == attempt end
  if kind == 'exhaust' then
    return mkind == 'exhausted' and mattempt == attempt and h['@err:' .. f] == err
  end
  return false
end

for i, record in ipairs(split(ARGV[3], RS)) do
  local r = split(record, FS)
  local f, attempt, kind, arg = r[1], tonumber(r[2]), r[3], r[4] or ''
  local err = ARGV[5 + i]
  local mkind, _, mattempt, mlast = parse(h[f]) -- mlast: the token, or the :dlq flag
  if mkind == 'running' and mattempt == attempt and mlast == token then
    if kind == 'ok' then
      hset(c, h, f, 'ok')
    elseif kind == 'retry' then
      now = now or now_ms()
      -- the error too, so it can be read while the invocation backs off
      hset2(c, h, f, 'next_attempt_at:' .. fmt(now + tonumber(arg)) .. '#' .. fmt(attempt),
        '@err:' .. f, err)
    elseif kind == 'exhaust' then
      hset2(c, h, f, 'exhausted:' .. fmt(attempt), '@err:' .. f, err)
    else -- release: what the claim replaced comes back as it was
      if arg == '' then hdel(c, h, f) else hset(c, h, f, arg) end
      hdel(c, h, '@at:' .. f)
    end
  elseif applied_before(f, kind, attempt, arg, err, mkind, mattempt) then
    local entry = h['@dlq:' .. f]
    if mkind == 'exhausted' and mlast and entry and entry ~= '' then
      table.insert(replayed, {f, mattempt, entry, h['@err:' .. f] or ''})
    end
  else
    table.insert(rejected, f)
  end
end
local settled = settle(c, h, split(ARGV[4], RS), split(ARGV[5], RS))
return {settled, rejected, replayed}
