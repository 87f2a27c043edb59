-- Deadlines <= now: failed deliveries. ARGV: kind now due_ms max_retries limit -> how many
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[5]))
for _, id in ipairs(ids) do fail(id, ARGV[2], ARGV[3], tonumber(ARGV[4])) end
return #ids
