-- getTopicInfo. ARGV: the waiting buckets' upper bounds (trigger ms, exclusive)
-- -> {waiting, ready, consuming, count per bucket..., oldest} (every READY
-- message is in EXPIRE; READY lacks those of busy keys, and a free key's all
-- but one). oldest: the earliest trigger time among READY's messages, as a
-- string ('' none): the first of each priority's range, highest priority
-- first, at most OLDEST_BANDS priorities read (a READY member begins with
-- 32767 - priority in 5 digits, then the trigger time in 15: rk)
if fenced() then return redis.error_reply(FENCE) end
local out = {redis.call('ZCARD', WAITING), redis.call('ZCARD', EXPIRE), redis.call('ZCARD', ACK)}
local low = '-inf'
for i = 1, #ARGV do
  out[#out + 1] = redis.call('ZCOUNT', WAITING, low, '(' .. ARGV[i])
  low = ARGV[i]
end
out[#out + 1] = redis.call('ZCOUNT', WAITING, low, '+inf')
local OLDEST_BANDS = 16
local oldest, from = '', '-'
for _ = 1, OLDEST_BANDS do
  local first = redis.call('ZRANGEBYLEX', READY, from, '+', 'LIMIT', 0, 1)[1]
  if not first then break end
  local trigger = string.sub(first, 6, 20)
  if oldest == '' or less(trigger, oldest) then oldest = trigger end
  from = '[' .. string.format('%05d', tonumber(string.sub(first, 1, 5)) + 1)
end
out[#out + 1] = oldest
return out
