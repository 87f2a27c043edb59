-- Give the slot up, if held and nothing of it is being consumed.
-- ARGV: kind worker -> 1 released | 0 kept
if redis.call('GET', KEYS[9]) ~= ARGV[2] or redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
redis.call('DEL', KEYS[9])
return 1
