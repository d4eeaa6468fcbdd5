-- begin (ledger_rules.begin): see begin_step in common.lua.
-- KEYS: ledger, stream, dlq
-- ARGV: header, classification, token, claims, gates, released
local c = context(KEYS, ARGV[1])
return begin_step(c, once_clock(), ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
