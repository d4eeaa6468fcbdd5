-- Shared prelude of Relay's ledger scripts (prepended to each script at load, after
-- the constants the adapter generates from relay.domain: EXHAUSTED_REASON,
-- EXPIRED_DETAIL, NO_RESULT_DETAIL, CLASS_FIELD, MALFORMED_FIELD).
--
-- These scripts carry out relay.domain.ledger_rules, the one specification of what
-- each ledger call does; tests/contract/test_ledger_rules_vs_lua.py runs random
-- sequences through both and requires identical results. Change both together.
--
-- Marker encoding (relay.domain.invocation):
--   ok | running:<deadline_ms>#<attempt>#<token> | next_attempt_at:<deadline_ms>#<attempt>
--   | exhausted:<attempt> | exhausted:<attempt>:dlq ; absent or unparsable = eligible.
-- Reserved message-level fields start with '@' (function names cannot):
--   @class  the once-only classification, '<classification>#<token>'
--   @dlq    the placeholder DLQ entry id of a malformed message
--   @err:<function>/<handler>  the last error: a retry's while it backs off, then the
--                              DLQ reason of an exhausted invocation
--   @dlq:<function>/<handler>  the id of its DLQ entry, once written
--   @at:<function>/<handler>   '<ms>#<token>': when its current or last attempt was
--                              claimed (server clock) and by which token
pcall(redis.replicate_commands)

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Split on a one-byte separator (the adapter packs arguments with \31 between
-- fields and \30 between records; names never contain either).
local function split(s, sep)
  local out = {}
  if s == nil or s == '' then return out end
  local start = 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then
      table.insert(out, string.sub(s, start))
      return out
    end
    table.insert(out, string.sub(s, start, i - 1))
    start = i + 1
  end
end

local FS, RS = '\31', '\30'

local function fmt(n)
  return string.format('%d', n)
end

-- A marker's number (relay.domain.invocation.parse_int): 1 to 15 ASCII digits.
local function int(s)
  if s and #s > 0 and #s <= 15 and not string.find(s, '%D') then return tonumber(s) end
  return nil
end

-- The part after the first '#' of a stamp ('' or none: nil).
local function stamp_token(v)
  if not v then return nil end
  local i = string.find(v, '#', 1, true)
  if not i or i == #v then return nil end
  return string.sub(v, i + 1)
end

-- kind, deadline, attempt, token_or_dlq (relay.domain.invocation.parse_marker)
local function parse(m)
  if not m then return nil end
  if m == 'ok' then return 'ok', 0, 0, nil end
  local n = int(string.match(m, '^exhausted:(%d+)$'))
  if n then return 'exhausted', 0, n, false end
  n = int(string.match(m, '^exhausted:(%d+):dlq$'))
  if n then return 'exhausted', 0, n, true end
  local d, a, tok = string.match(m, '^running:(%d+)#(%d+)#([^#]+)$')
  d, a = int(d), int(a)
  if d and a and a >= 1 then return 'running', d, a, tok end
  d, a = string.match(m, '^next_attempt_at:(%d+)#(%d+)$')
  d, a = int(d), int(a)
  if d and a and a >= 1 then return 'backoff', d, a, nil end
  return nil
end

-- The message's ledger hash as a table; every write below goes to both.
local function load_hash(key)
  local flat = redis.call('HGETALL', key)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h
end

local function hset(c, h, f, v)
  h[f] = v
  redis.call('HSET', c.ledger, f, v)
end

-- Two fields in one HSET: one command fewer inside the script on the hot path.
local function hset2(c, h, f1, v1, f2, v2)
  h[f1], h[f2] = v1, v2
  redis.call('HSET', c.ledger, f1, v1, f2, v2)
end

local function hdel(c, h, f)
  if h[f] ~= nil then
    h[f] = nil
    redis.call('HDEL', c.ledger, f)
  end
end

local function is_invocation(f)
  return string.sub(f, 1, 1) ~= '@'
end

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

-- KEYS[1..3] and ARGV[1] of every script: ledger, stream, dlq; header =
-- group FS consumer FS id FS timestamp FS ttl_s FS blocked.
local function context(keys, packed)
  local h = split(packed, FS)
  return {ledger = keys[1], stream = keys[2], dlq = keys[3], group = h[1], consumer = h[2],
    id = h[3], stamp = h[4], ttl = h[5], blocked = h[6]}
end

local function deliveries(c)
  local ok, p = pcall(redis.call, 'XPENDING', c.stream, c.group, c.id, c.id, 1)
  if ok and p and p[1] then return p[1][4] end
  return 1
end

local function event_of(c)
  local r = redis.call('XRANGE', c.stream, c.id, c.id)
  if r[1] then
    local f = r[1][2]
    for i = 1, #f, 2 do
      if f[i] == 'event' then return f[i + 1] end
    end
  end
  return ''
end

local function acknowledge(c)
  redis.call('XACK', c.stream, c.group, c.id)
  redis.call('EXPIRE', c.ledger, c.ttl)
end

-- ledger_rules.settle: acknowledge if every gating invocation is terminal, writing
-- the missing DLQ entries first (each with its ':dlq' marker and '@dlq:' id).
-- Gating: the requested gates, then every recorded invocation (sorted), except
-- released ones that are not exhausted.
-- Returns {acked, written, dlq_error}; written = {{field, attempt, id, reason}...}
local function settle(c, h, gates, released)
  local written = {}
  if c.blocked == '1' then return {0, written, ''} end
  local gated, order = {}, {}
  for _, f in ipairs(gates) do
    if not gated[f] then
      gated[f] = true
      table.insert(order, f)
    end
  end
  local extra = {}
  for f, _ in pairs(h) do
    if is_invocation(f) and not gated[f] then table.insert(extra, f) end
  end
  table.sort(extra)
  for _, f in ipairs(extra) do table.insert(order, f) end
  local gone = {}
  for _, f in ipairs(released) do
    if not gated[f] then gone[f] = true end
  end
  local missing = {}
  for _, f in ipairs(order) do
    local kind, _, attempt, dl = parse(h[f])
    if kind == 'exhausted' then
      if not dl then table.insert(missing, {f, attempt}) end
    elseif kind ~= 'ok' and not gone[f] then
      return {0, written, ''}
    end
  end
  if #missing > 0 then
    local event = event_of(c)
    local count = deliveries(c)
    for _, m in ipairs(missing) do
      local f, attempt = m[1], m[2]
      local slash = string.find(f, '/', 1, true) or (#f + 1)
      local fn, handler = string.sub(f, 1, slash - 1), string.sub(f, slash + 1)
      local reason = h['@err:' .. f]
      if not reason or reason == '' then
        reason = string.format(EXHAUSTED_REASON, attempt, NO_RESULT_DETAIL)
      end
      local res = redis.pcall('XADD', c.dlq, '*',
        'original_stream', c.stream, 'original_id', c.id, 'group', c.group,
        'consumer', c.consumer, 'event', event, 'reason', reason,
        'function', fn, 'handler', handler, 'deliveries', fmt(count),
        'handler_attempts', fmt(attempt), 'timestamp', c.stamp)
      if type(res) == 'table' and res.err then return {0, written, res.err} end
      hset2(c, h, f, 'exhausted:' .. fmt(attempt) .. ':dlq', '@dlq:' .. f, res)
      table.insert(written, {f, attempt, res, reason})
    end
  end
  acknowledge(c)
  return {1, written, ''}
end

-- ledger_rules.begin for one message: classify once, claim every eligible
-- invocation, report the recorded invocations nobody asked about, settle if
-- nothing was claimed. ``clock`` reads the server clock (once per script).
-- a: classification, token, claims (records "field FS max_attempts FS lease_ms"
-- joined by RS), gates (joined by RS), released (joined by RS).
local function begin_step(c, clock, classification, token, claims_s, gates_s, released_s)
  local h = load_hash(c.ledger)
  local classified = 0
  if classification == '' then
    c.blocked = '1' -- a class not known yet keeps the message pending
  end
  if h[CLASS_FIELD] == nil then
    if classification ~= '' then -- '' is "not known yet": nothing recorded
      hset(c, h, CLASS_FIELD, classification .. '#' .. token)
      classified = 1
    end
  elseif stamp_token(h[CLASS_FIELD]) == token then
    classified = 1 -- this very call, re-sent
  end
  local now = clock()
  local statuses = {}
  local claimed = 0
  local asked = {}
  for _, record in ipairs(split(claims_s, RS)) do
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
  local gates, released = split(gates_s, RS), split(released_s, RS)
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
end

-- ledger_rules.finish for one message: apply each fenced attempt report, then
-- settle. reports: records "field FS attempt FS kind FS arg" joined by RS, with
-- errs[i] the free-text reason of report i (kept as the DLQ reason when it
-- exhausts). kind: ok | retry (arg = backoff ms) | exhaust | release (arg = the
-- marker the claim replaced, '' = absent). ``clock`` is read only when a retry
-- needs a deadline.
local function finish_step(c, clock, token, reports_s, gates_s, released_s, errs)
  local h = load_hash(c.ledger)
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

  for i, record in ipairs(split(reports_s, RS)) do
    local r = split(record, FS)
    local f, attempt, kind, arg = r[1], tonumber(r[2]), r[3], r[4] or ''
    local err = errs[i]
    local mkind, _, mattempt, mlast = parse(h[f]) -- mlast: the token, or the :dlq flag
    if mkind == 'running' and mattempt == attempt and mlast == token then
      if kind == 'ok' then
        hset(c, h, f, 'ok')
      elseif kind == 'retry' then
        -- the error too, so it can be read while the invocation backs off
        hset2(c, h, f, 'next_attempt_at:' .. fmt(clock() + tonumber(arg)) .. '#' .. fmt(attempt),
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
  local settled = settle(c, h, split(gates_s, RS), split(released_s, RS))
  return {settled, rejected, replayed}
end

-- The server clock, read at most once per script (every message of a batch sees
-- the same instant, as one call would).
local function once_clock()
  local now = nil
  return function()
    now = now or now_ms()
    return now
  end
end
