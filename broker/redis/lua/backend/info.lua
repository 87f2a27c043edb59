-- getTopicInfo. ARGV: now, then the waiting buckets' upper bounds (trigger
-- ms, exclusive) -> {waiting, ready, consuming, count per bucket..., oldest,
-- due (WAITING members due at now: the mover has not moved them yet),
-- paused (1: the topic is; else its paused keys, a list)} (every READY
-- message is in EXPIRE; READY lacks those of busy keys, and a free key's all
-- but one). oldest: the earliest trigger time among READY's messages, as a
-- string ('' none): the first of each priority's range, highest priority
-- first, at most OLDEST_BANDS priorities read (a READY member begins with
-- 32767 - priority in 5 digits, then the trigger time in 15: rk)
if fenced() then return redis.error_reply(FENCE) end
local out = {redis.call('ZCARD', WAITING), redis.call('ZCARD', EXPIRE), redis.call('ZCARD', ACK)}
local low = '-inf'
for i = 2, #ARGV do
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
out[#out + 1] = redis.call('ZCOUNT', WAITING, '-inf', ARGV[1])
if redis.call('HEXISTS', FLOW, 'paused') == 1 then
  out[#out + 1] = 1
else
  local keys = {}
  for _, name in ipairs(redis.call('HKEYS', FLOW)) do
    if string.sub(name, 1, 2) == 'k:' then keys[#keys + 1] = string.sub(name, 3) end
  end
  out[#out + 1] = keys
end
return out
