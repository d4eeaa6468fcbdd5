-- malformed: write the message's one placeholder DLQ entry (once), then XACK.
-- KEYS: ledger, stream, dlq
-- ARGV: group, consumer, id, timestamp, ttl_s, reason, event
local ledger, stream, dlq = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, id, stamp, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local written = {}
if redis.call('HEXISTS', ledger, '@dlq') == 0 then
  local res = redis.pcall('XADD', dlq, '*',
    'original_stream', stream, 'original_id', id, 'group', group,
    'consumer', consumer, 'event', ARGV[7], 'reason', ARGV[6],
    'function', '-', 'handler', '-', 'deliveries', fmt(deliveries(stream, group, id)),
    'handler_attempts', '0', 'timestamp', stamp)
  if type(res) == 'table' and res.err then return {0, written, res.err} end
  redis.call('HSET', ledger, '@dlq', res)
  table.insert(written, {'-', 0, res, ARGV[6]})
end
redis.call('XACK', stream, group, id)
redis.call('EXPIRE', ledger, ttl)
return {1, written, ''}
