-- Shared prelude of Relay's ledger scripts (prepended to each script at load).
-- Marker encoding (see relay.domain.invocation):
--   ok | running:<deadline_ms>#<attempt>#<token> | next_attempt_at:<deadline_ms>#<attempt>
--   | exhausted:<attempt> | exhausted:<attempt>:dlq ; absent or unparsable = eligible.
-- Reserved message-level fields start with '@' (function names cannot):
--   @class  the once-only classification (HSETNX)
--   @dlq    the placeholder DLQ entry id of a malformed message
--   @err:<function>/<handler>  the DLQ reason of an exhausted invocation
--   @at:<function>/<handler>   server time (ms) its current or last attempt was claimed
--                              (written with the claim; removed when a claim is released)
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

-- ARGV[1] of every script: group, consumer, id, timestamp, ttl_s, blocked.
local function header(packed)
  local h = split(packed, FS)
  return h[1], h[2], h[3], h[4], h[5], h[6]
end

local function fmt(n)
  return string.format('%d', n)
end

-- kind, deadline, attempt, token_or_dlq
local function parse(m)
  if not m then return nil end
  if m == 'ok' then return 'ok', 0, 0, nil end
  local n, suffix = string.match(m, '^exhausted:(%d+)(.*)$')
  if n then
    if suffix == '' then return 'exhausted', 0, tonumber(n), false end
    if suffix == ':dlq' then return 'exhausted', 0, tonumber(n), true end
    return nil
  end
  local d, a, tok = string.match(m, '^running:(%d+)#(%d+)#([^#]+)$')
  if d and tonumber(a) >= 1 then return 'running', tonumber(d), tonumber(a), tok end
  d, a = string.match(m, '^next_attempt_at:(%d+)#(%d+)$')
  if d and tonumber(a) >= 1 then return 'backoff', tonumber(d), tonumber(a), nil end
  return nil
end

local function deliveries(stream, group, id)
  local ok, p = pcall(redis.call, 'XPENDING', stream, group, id, id, 1)
  if ok and p and p[1] then return p[1][4] end
  return 1
end

local function event_of(stream, id)
  local r = redis.call('XRANGE', stream, id, id)
  if r[1] then
    local f = r[1][2]
    for i = 1, #f, 2 do
      if f[i] == 'event' then return f[i + 1] end
    end
  end
  return ''
end

-- Settle the message if every gate is terminal: write the missing DLQ entries
-- (each with its ':dlq' marker in this same script), then XACK and set the TTL.
-- known: optional {field = marker, or false once deleted} this same script just
-- wrote, so those markers are not read back (one HGET fewer per handled event).
-- Returns {acked, written, dlq_error}; written = {{field, attempt, id, reason}...}
local function settle(ledger, stream, dlq, group, consumer, id, stamp, ttl, blocked, gates,
    known)
  local written = {}
  if blocked == '1' then return {0, written, ''} end
  local missing = {}
  for _, f in ipairs(gates) do
    local marker = known and known[f]
    if marker == nil then marker = redis.call('HGET', ledger, f) end
    local kind, _, attempt, dl = parse(marker)
    if kind ~= 'ok' then
      if kind ~= 'exhausted' then return {0, written, ''} end
      if not dl then table.insert(missing, {f, attempt}) end
    end
  end
  if #missing > 0 then
    local event = event_of(stream, id)
    local count = deliveries(stream, group, id)
    for _, m in ipairs(missing) do
      local f, attempt = m[1], m[2]
      local slash = string.find(f, '/', 1, true)
      local fn, handler = string.sub(f, 1, slash - 1), string.sub(f, slash + 1)
      local reason = redis.call('HGET', ledger, '@err:' .. f)
      if not reason then
        reason = 'retries exhausted after ' .. fmt(attempt) .. ' attempt(s): no result recorded'
      end
      local res = redis.pcall('XADD', dlq, '*',
        'original_stream', stream, 'original_id', id, 'group', group,
        'consumer', consumer, 'event', event, 'reason', reason,
        'function', fn, 'handler', handler, 'deliveries', fmt(count),
        'handler_attempts', fmt(attempt), 'timestamp', stamp)
      if type(res) == 'table' and res.err then return {0, written, res.err} end
      redis.call('HSET', ledger, f, 'exhausted:' .. fmt(attempt) .. ':dlq')
      table.insert(written, {f, attempt, res, reason})
    end
  end
  redis.call('XACK', stream, group, id)
  redis.call('EXPIRE', ledger, ttl)
  return {1, written, ''}
end
