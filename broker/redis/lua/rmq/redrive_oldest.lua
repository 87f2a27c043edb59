-- As redrive, the oldest deaths first. ARGV: kind now limit -> how many
local ids = redis.call('ZRANGE', KEYS[3], 0, tonumber(ARGV[3]) - 1)
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[7], id)
  restore(id, ARGV[2])
end
return #ids
