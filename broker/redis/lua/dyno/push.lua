-- ARGV: id payload priority due_ms -> 1 replaced an existing id | 0 new
local id = ARGV[1]
local existed = redis.call('HSET', KEYS[3], id, ARGV[2]) == 0
redis.call('HSET', KEYS[4], id, ARGV[3])
redis.call('ZREM', KEYS[2], id)
redis.call('ZADD', KEYS[1], score(ARGV[4], id), id)
if existed then return 1 end
return 0
