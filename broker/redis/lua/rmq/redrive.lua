-- Dead -> store, failure count 0. ARGV: kind now id... -> how many left the dead queue
local n = 0
for i = 3, #ARGV do
  if redis.call('ZREM', KEYS[3], ARGV[i]) == 1 then
    redis.call('HDEL', KEYS[7], ARGV[i])
    restore(ARGV[i], ARGV[2])
    n = n + 1
  end
end
return n
