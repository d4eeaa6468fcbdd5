-- malformed: write the message's one placeholder DLQ entry (once), then XACK.
-- KEYS: ledger, stream, dlq
-- ARGV: header, reason, event
local ledger, stream, dlq = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, id, stamp, ttl = header(ARGV[1])
local written = {}
if redis.call('HEXISTS', ledger, '@dlq') == 0 then
  local res = redis.pcall('XADD', dlq, '*',
    'original_stream', stream, 'original_id', id, 'group', group,
    'consumer', consumer, 'event', ARGV[3], 'reason', ARGV[2],
    'function', '-', 'handler', '-', 'deliveries', fmt(deliveries(stream, group, id)),
    'handler_attempts', '0', 'timestamp', stamp)
  if type(res) == 'table' and res.err then return {0, written, res.err} end
  redis.call('HSET', ledger, '@dlq', res)
  table.insert(written, {'-', 0, res, ARGV[2]})
end
redis.call('XACK', stream, group, id)
redis.call('EXPIRE', ledger, ttl)
return {1, written, ''}
