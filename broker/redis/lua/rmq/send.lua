-- ARGV: kind id key body score -> {1 stored | 0 merged, id}
local old = redis.call('HGET', KEYS[4], ARGV[3])
if old then
  if kind ~= 'range-merge' then redis.call('ZADD', KEYS[1], ARGV[5], old) end
  if kind == 'priority' then redis.call('HSET', KEYS[8], old, ARGV[5]) end
  redis.call('HSET', KEYS[5], old, ARGV[4])
  return {0, old}
end
local id = ARGV[2]
redis.call('ZADD', KEYS[1], ARGV[5], id)
redis.call('HSET', KEYS[4], ARGV[3], id)
redis.call('HSET', KEYS[5], id, ARGV[4])
redis.call('HSET', KEYS[6], id, ARGV[3])
if kind == 'priority' then redis.call('HSET', KEYS[8], id, ARGV[5]) end
return {1, id}
