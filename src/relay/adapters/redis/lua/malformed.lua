-- malformed (ledger_rules.dead_letter_malformed): write the message's one placeholder
-- DLQ entry (once), then XACK.
-- KEYS: ledger, stream, dlq
-- ARGV: header, reason, event
local c = context(KEYS, ARGV[1])
local written = {}
if redis.call('HEXISTS', c.ledger, MALFORMED_FIELD) == 0 then
  local res = redis.pcall('XADD', c.dlq, '*',
    'original_stream', c.stream, 'original_id', c.id, 'group', c.group,
    'consumer', c.consumer, 'event', ARGV[3], 'reason', ARGV[2],
    'function', '-', 'handler', '-', 'deliveries', fmt(deliveries(c)),
    'handler_attempts', '0', 'timestamp', c.stamp)
  if type(res) == 'table' and res.err then return {0, written, res.err} end
  redis.call('HSET', c.ledger, MALFORMED_FIELD, res)
  table.insert(written, {'-', 0, res, ARGV[2]})
end
acknowledge(c)
return {1, written, ''}
