-- Unack deadline <= now -> queue, due now. ARGV: now_ms limit -> how many
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZADD', KEYS[1], score(ARGV[1], id), id)
end
return #ids
