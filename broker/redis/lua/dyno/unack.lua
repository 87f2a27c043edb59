-- Unacked -> queue, due now. ARGV: id now_ms -> 1 | 0
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[1], score(ARGV[2], ARGV[1]), ARGV[1])
return 1
