-- begin_many: begin_step (common.lua) for every message of a batch, in one atomic
-- call; one reply per message, in order (each as begin's).
-- KEYS: ledger_1 .. ledger_n, stream, dlq
-- ARGV: six per message, as begin's: header, classification, token, claims, gates,
--       released
local n = #KEYS - 2
local stream, dlq = KEYS[n + 1], KEYS[n + 2]
local clock = once_clock()
local replies = {}
for i = 1, n do
  local a = (i - 1) * 6
  local c = context({KEYS[i], stream, dlq}, ARGV[a + 1])
  replies[i] = begin_step(c, clock, ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
    ARGV[a + 6])
end
return replies
