-- getTopicInfo. ARGV: the waiting buckets' upper bounds (trigger ms, exclusive)
-- -> {waiting, ready, consuming, count per bucket...} (every READY message is
-- in EXPIRE; READY lacks those of busy keys, and a free key's all but one)
if fenced() then return redis.error_reply(FENCE) end
local out = {redis.call('ZCARD', WAITING), redis.call('ZCARD', EXPIRE), redis.call('ZCARD', ACK)}
local low = '-inf'
for i = 1, #ARGV do
  out[#out + 1] = redis.call('ZCOUNT', WAITING, low, '(' .. ARGV[i])
  low = ARGV[i]
end
out[#out + 1] = redis.call('ZCOUNT', WAITING, low, '+inf')
return out
