-- Queued or unacked -> queue, due at due_ms. ARGV: id due_ms -> 1 | 0
local id = ARGV[1]
if not redis.call('ZSCORE', KEYS[1], id) and redis.call('ZREM', KEYS[2], id) == 0 then return 0 end
redis.call('ZADD', KEYS[1], score(ARGV[2], id), id)
return 1
