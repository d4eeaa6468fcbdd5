-- publish: append one event, delayed and/or under an idempotency key, one atomic step.
-- KEYS: stream, delayed set (relay:<stream>:delayed), delayed bodies
--       (relay:<stream>:delayed:events), delayed counter (relay:<stream>:delayed:seq),
--       [the key's record (relay:publish:<stream>:<key>)]
-- ARGV: the event, its due time in ms ('' = now), the dedup window in ms, the
--       producer's traceparent ('' = none; kept beside the event, as a plain XADD does)
-- Reply: {id, 1} for an event appended now, {first id, 0} when the key's record
-- names one already (nothing is appended). A delayed event's id is
-- 'delayed-<due ms>-<n>' (relay.domain.publication.delayed_due reads it back,
-- tested on both); the move into the stream (move_due.lua) gives it a stream id.
-- The record is set after the append, in the same script: a key never names an
-- event that is not there, and an event with a key always has its record.
if KEYS[5] then
  local first = redis.call('GET', KEYS[5])
  if first then
    return {first, 0}
  end
end
local id
if ARGV[2] ~= '' then
  id = 'delayed-' .. ARGV[2] .. '-' .. redis.call('INCR', KEYS[4])
  redis.call('HSET', KEYS[3], id, ARGV[1])
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[3], id .. ':traceparent', ARGV[4]) end
  redis.call('ZADD', KEYS[2], ARGV[2], id)
elseif ARGV[4] ~= '' then
  id = redis.call('XADD', KEYS[1], '*', 'event', ARGV[1], 'traceparent', ARGV[4])
else
  id = redis.call('XADD', KEYS[1], '*', 'event', ARGV[1])
end
if KEYS[5] then
  redis.call('SET', KEYS[5], id, 'PX', ARGV[3])
end
return {id, 1}
