-- A bulk call's commit: its gathered changes (the last of KEYS, the staging list
-- broker.redis.bulk filled) become BULK, the changes being applied, in one
-- O(1) step; from here the call takes effect whole, whoever applies it
-- (bulk_apply.lua). While another call is applied: the fence error (the
-- caller applies that one, then commits again).
-- ARGV: call -> 'OK' | 'GONE' (the staging list expired: nothing done)
if fenced() then return redis.error_reply(FENCE) end
local staging, call = KEYS[#KEYS], ARGV[1]
if redis.call('EXISTS', staging) == 0 then return 'GONE' end
redis.call('RENAME', staging, BULK)
redis.call('PERSIST', BULK)
redis.call('HSET', BULKINFO, 'call', call, 'n:' .. call, 0)
redis.call('PEXPIRE', BULKINFO, 3600000)
return 'OK'
