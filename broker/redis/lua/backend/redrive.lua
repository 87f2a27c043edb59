-- redriveMsg: dead letters (5, 6) READY again with retry 0 and a new expire
-- time. ARGV: now, then per message: id expire rk -> per message 'NF' |
-- 'S<status>' (not dead) | {meta, body} as changed
if fenced() then return redis.error_reply(FENCE) end
local out = {}
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  local m = load(id)
  if not m then out[#out + 1] = 'NF'
  elseif m.status ~= '5' and m.status ~= '6' then out[#out + 1] = 'S' .. m.status
  else
    redis.call('ZREM', RETIRE, id)
    m.trigger, m.expire, m.rk, m.retry = ARGV[1], ARGV[i + 1], ARGV[i + 2], '0'
    m.endReason = nil  -- live again: a resume's expire no longer says why it ended
    ready_add(id, m)
    out[#out + 1] = {save(id, m), redis.call('HGET', BODY, id)}
  end
end
return out
