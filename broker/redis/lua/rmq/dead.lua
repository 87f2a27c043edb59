-- Read only. ARGV: kind limit -> {id, died_ms, key, body, retries, ...}, oldest first
local out = {}
local dead = redis.call('ZRANGE', KEYS[3], 0, tonumber(ARGV[2]) - 1, 'WITHSCORES')
for i = 1, #dead, 2 do
  local id = dead[i]
  out[#out + 1] = id
  out[#out + 1] = dead[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[6], id)
  out[#out + 1] = redis.call('HGET', KEYS[5], id)
  out[#out + 1] = redis.call('HGET', KEYS[7], id) or '0'
end
return out
