-- move_due: move up to ARGV[1] delayed events that are due into the stream.
-- KEYS: stream, delayed set (relay:<stream>:delayed), delayed bodies
--       (relay:<stream>:delayed:events)
-- ARGV: the batch size
-- Reply: how many were moved.
-- Due means a score at or before the Redis server's clock (TIME), so workers'
-- clocks do not matter. The script is atomic, so of several workers running it
-- at once each due entry is moved by exactly one: the first removes it from the
-- set, the others no longer see it. Each entry is appended before it is
-- removed; an XADD that fails ends the script with that entry still waiting
-- (those before it moved, each once). The stream entry carries the delayed id
-- in a field `delayed`, which `relay trace <delayed id>` looks for, and the
-- producer's `traceparent` when it sent one (kept under '<id>:traceparent').
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local due = redis.call('ZRANGE', KEYS[2], '-inf', now_ms, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(due) do
  local body = redis.call('HGET', KEYS[3], id)
  local trace = redis.call('HGET', KEYS[3], id .. ':traceparent')
  if body and trace then
    redis.call('XADD', KEYS[1], '*', 'event', body, 'delayed', id, 'traceparent', trace)
  elseif body then
    redis.call('XADD', KEYS[1], '*', 'event', body, 'delayed', id)
  end
  redis.call('HDEL', KEYS[3], id, id .. ':traceparent')
  redis.call('ZREM', KEYS[2], id)
end
return #due
