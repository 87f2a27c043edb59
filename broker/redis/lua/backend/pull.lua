-- READY -> CONSUMING, best first (among the tags' ranges when tags are
-- given); an expired head is ended on the way, never delivered.
-- ARGV: now deadline batch retire_at tag... -> {ended, {id, meta, body}...}
if fenced() then return redis.error_reply(FENCE) end
local now, deadline, batch, retire_at = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[4]
local function head()
  if #ARGV == 4 then return redis.call('ZRANGE', READY, 0, 0)[1] end
  local best
  for i = 5, #ARGV do
    local tag = ARGV[i]
    local h = redis.call('ZRANGEBYLEX', TAGGED, '[' .. tag .. ',', '(' .. tag .. '-', 'LIMIT', 0, 1)[1]
    if h then
      local rk = string.sub(h, #tag + 2)
      if best == nil or less(rk, best) then best = rk end
    end
  end
  return best
end
local out, ended = {}, 0
while #out < batch do
  local rk = head()
  if not rk then break end
  local id = string.sub(rk, 22)
  local m = load(id)
  if not m then  -- a member without its message: drop it rather than loop on it
    redis.call('ZREM', READY, rk)
    for i = 5, #ARGV do redis.call('ZREM', TAGGED, ARGV[i] .. ',' .. rk) end
  else
    ready_remove(id, m)
    if now >= tonumber(m.expire) then
      end_expired(id, m, retire_at)
      ended = ended + 1
      save(id, m)
    else
      m.status = '3'
      m.retry = tostring(tonumber(m.retry) + 1)  -- retry counts deliveries (camellia)
      redis.call('ZADD', ACK, deadline, id)
      out[#out + 1] = {id, save(id, m), redis.call('HGET', BODY, id)}
    end
  end
end
table.insert(out, 1, ended)
return out
