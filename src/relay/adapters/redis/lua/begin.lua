-- begin (ledger_rules.begin): classify once, claim every eligible invocation, report
-- the recorded invocations nobody asked about, settle if nothing was claimed.
-- KEYS: ledger, stream, dlq
-- ARGV: header, classification, token,
--       claims (records "field FS max_attempts FS lease_ms" joined by RS),
--       gates (joined by RS), released (joined by RS)
local c = context(KEYS, ARGV[1])
local token = ARGV[3]
local h = load_hash(c.ledger)
local classified = 0
if h[CLASS_FIELD] == nil then
  hset(c, h, CLASS_FIELD, ARGV[2] .. '#' .. token)
  classified = 1
elseif stamp_token(h[CLASS_FIELD]) == token then
  classified = 1 -- this very call, re-sent
end
local now = now_ms()
local statuses = {}
local claimed = 0
local claims = split(ARGV[4], RS)
local asked = {}
for _, record in ipairs(claims) do
  local r = split(record, FS)
  local f, max_attempts, lease = r[1], math.max(1, tonumber(r[2])), tonumber(r[3])
  asked[f] = true
  local prev = h[f]
  local kind, deadline, attempt, tok = parse(prev)
  if kind == 'running' and tok == token and now < deadline then
    -- this very call, re-sent: the claim is ours already
    local previous = ''
    if attempt > 1 then
      local at = h['@at:' .. f]
      local i = at and string.find(at, '#', 1, true)
      local ms = int(at and (i and string.sub(at, 1, i - 1) or at))
      previous = 'next_attempt_at:' .. fmt(ms or 0) .. '#' .. fmt(attempt - 1)
    end
    table.insert(statuses, {f, 'claimed', attempt, fmt(deadline), previous, 0})
    claimed = claimed + 1
  elseif kind == 'ok' then
    table.insert(statuses, {f, 'ok', 0, 0, '', 0})
  elseif kind == 'exhausted' then
    table.insert(statuses, {f, 'exhausted', attempt, 0, '', 0})
  elseif (kind == 'running' or kind == 'backoff') and now < deadline then
    table.insert(statuses, {f, kind, attempt, fmt(deadline), '', 0})
  elseif (kind == 'running' or kind == 'backoff') and attempt >= max_attempts then
    hset2(c, h, f, 'exhausted:' .. fmt(attempt), '@err:' .. f,
      string.format(EXHAUSTED_REASON, attempt, string.format(EXPIRED_DETAIL, attempt)))
    table.insert(statuses, {f, 'exhausted', attempt, 0, '', 1})
  else
    local next_attempt = 1
    if kind == 'running' or kind == 'backoff' then next_attempt = attempt + 1 end
    hset2(c, h, f, 'running:' .. fmt(now + lease) .. '#' .. fmt(next_attempt) .. '#' .. token,
      '@at:' .. f, fmt(now) .. '#' .. token)
    table.insert(statuses, {f, 'claimed', next_attempt, fmt(now + lease), prev or '', 0})
    claimed = claimed + 1
  end
end
local gates, released = split(ARGV[5], RS), split(ARGV[6], RS)
for _, f in ipairs(gates) do asked[f] = true end
for _, f in ipairs(released) do asked[f] = true end
local unplanned = {}
for f, v in pairs(h) do
  if is_invocation(f) and not asked[f] then
    local kind = parse(v)
    if kind ~= 'ok' and kind ~= 'exhausted' then table.insert(unplanned, f) end
  end
end
table.sort(unplanned)
local settled = {0, {}, ''}
if claimed == 0 then settled = settle(c, h, gates, released) end
return {classified, statuses, settled, unplanned}
