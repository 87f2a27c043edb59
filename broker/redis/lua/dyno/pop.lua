-- Due ids, best first, -> unack. ARGV: due bound "(now+1", deadline, count
-- -> {head score of the queue | false, {id, payload, priority, ...}}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], ARGV[2], id)
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[3], id)
  out[#out + 1] = redis.call('HGET', KEYS[4], id)
end
return {redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or false, out}
