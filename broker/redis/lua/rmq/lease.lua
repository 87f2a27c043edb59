-- Take or renew the slot's lease. ARGV: kind worker lease_ms -> 1 held | 0 another's
local holder = redis.call('GET', KEYS[9])
if holder and holder ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[9], ARGV[2], 'PX', ARGV[3])
return 1
