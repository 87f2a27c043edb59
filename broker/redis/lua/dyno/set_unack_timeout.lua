-- ARGV: id deadline_ms -> 1 | 0 not unacked in this shard
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
