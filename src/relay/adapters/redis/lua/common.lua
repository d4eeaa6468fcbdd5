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
--   @err:<function>/<handler>  the DLQ reason of an exhausted invocation
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
