-- A failed push delivery (broker.push.pusher): a CONSUMING message waits again
-- (WAITING) until its retry time, its trigger time then, as rescheduleMsg
-- files it (the caller computes trigger, expire and rk from its ttl and
-- priority); or ends (6) as a nack would, after maxRetry + 1 deliveries or
-- when the retry time is past its expire time. Anything else changes
-- nothing. ARGV: id trigger expire rk retire_at
-- -> 'NF' | 'NOOP' (not consuming) | 'WAITING' | 'ENDED', ending in '+' when
-- its key's next message became pullable (woke)
if fenced() then return redis.error_reply(FENCE) end
local id = ARGV[1]
local m = load(id)
if not m then return 'NF' end
if m.status ~= '3' then return 'NOOP' end
consuming_end(id, m)
if tonumber(m.retry) > tonumber(m.maxRetry) or tonumber(ARGV[2]) >= tonumber(m.expire) then
  finish(id, m, '6', ARGV[5])
  save(id, m)
  return woke('ENDED')
end
m.trigger, m.expire, m.rk = ARGV[2], ARGV[3], ARGV[4]
m.status = '1'
redis.call('ZADD', WAITING, m.trigger, id)
save(id, m)
return woke('WAITING')
