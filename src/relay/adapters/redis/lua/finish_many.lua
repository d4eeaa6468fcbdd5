-- finish_many: finish_step (common.lua) for every message of a group, in one atomic
-- call: results, then each message's DLQ entries before its XACK; one reply per
-- message, in order (each as finish's).
-- KEYS: ledger_1 .. ledger_n, stream, dlq
-- ARGV: per message: header, token, reports, gates, released, the number of
--       reports k, then k reasons
local n = #KEYS - 2
local stream, dlq = KEYS[n + 1], KEYS[n + 2]
local clock = once_clock()
local replies = {}
local a = 0
for i = 1, n do
  local c = context({KEYS[i], stream, dlq}, ARGV[a + 1])
  local k = tonumber(ARGV[a + 6])
  local errs = {}
  for j = 1, k do errs[j] = ARGV[a + 6 + j] end
  replies[i] = finish_step(c, clock, ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], errs)
  a = a + 6 + k
end
return replies
