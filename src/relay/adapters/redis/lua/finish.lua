-- finish (ledger_rules.finish): see finish_step in common.lua.
-- KEYS: ledger, stream, dlq
-- ARGV: header, token, reports, gates, released, then one reason per report
local c = context(KEYS, ARGV[1])
local errs = {}
for i = 6, #ARGV do table.insert(errs, ARGV[i]) end
return finish_step(c, once_clock(), ARGV[2], ARGV[3], ARGV[4], ARGV[5], errs)
