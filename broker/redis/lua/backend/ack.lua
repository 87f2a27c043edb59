-- ARGV: id ack(1|0) now retire_at
-- -> 'NF' | 'OK' | 'NOOP' | 'READY' (nack requeued) | 'ENDED' (nack ended it);
-- 'OK' and 'ENDED' end in '+' when a parked message became pullable (woke);
-- an ack of a due message (READY or CONSUMING) answers 'OK <triggerTime>'
-- (its dwell, /metrics)
-- An ack of a WAITING, READY or CONSUMING message acks it; anything else
-- changes nothing (camellia answers success).
if fenced() then return redis.error_reply(FENCE) end
local id = ARGV[1]
local m = load(id)
if not m then return 'NF' end
local st = m.status
if ARGV[2] == '1' then
  local answer = 'OK ' .. m.trigger
  if st == '1' then redis.call('ZREM', WAITING, id); answer = 'OK'
  elseif st == '2' then ready_remove(id, m)
  elseif st == '3' then consuming_end(id, m)
  else return 'NOOP' end
  finish(id, m, '4', ARGV[4])
  save(id, m)
  return woke(answer)
end
if st ~= '3' then return 'NOOP' end
consuming_end(id, m)
local ready = retry_or_end(id, m, ARGV[3], ARGV[4])
save(id, m)
if ready then return 'READY' end
return woke('ENDED')
