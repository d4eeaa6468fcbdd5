-- publish_occurrence: publish-if-new of one schedule occurrence, one atomic step.
-- KEYS: dedup key (relay:occurrence:<stream>:schedule:<function>:<handler>:<scheduled_at>),
--       stream, the previous layout's key (relay:schedule:<function>:<handler>:<scheduled_at>)
-- ARGV: the envelope (the entry's one field `event`), the dedup TTL in seconds
-- Reply: the new entry's id, or false when the occurrence was published already.
-- The key and the entry exist together or not at all: if XADD fails, the key is
-- removed and XADD's error returned. The key holds the entry's id afterwards
-- (history only: it is never deleted on completion, it expires by its TTL).
-- A key of the previous layout (not scoped by stream) is honoured, never written,
-- so an upgrade inside its 7-day TTL does not publish an occurrence again. TTL,
-- not EXISTS, asks for it: the least-privilege user's command list has TTL.
if redis.call('TTL', KEYS[3]) ~= -2 then
  return false
end
if not redis.call('SET', KEYS[1], '-', 'NX', 'EX', ARGV[2]) then
  return false
end
local added = redis.pcall('XADD', KEYS[2], '*', 'event', ARGV[1])
if type(added) == 'table' and added.err then
  redis.call('DEL', KEYS[1])
  return added
end
redis.call('SET', KEYS[1], added, 'KEEPTTL')
return added
