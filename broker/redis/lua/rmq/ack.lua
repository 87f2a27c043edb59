-- ARGV: kind id -> 1 acked | 0 not in prepare
if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then return 0 end
forget(ARGV[2])
return 1
