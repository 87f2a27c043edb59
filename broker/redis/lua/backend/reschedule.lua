-- rescheduleMsg: a WAITING or READY message gets a new trigger time (and
-- expire time, rk: the caller computes them from its ttl and priority, which
-- never change). ARGV: id trigger expire rk now retire_at -> 'NF' |
-- 'S<status>' (not allowed) | {meta, body} as changed. A schedule's run of
-- misfire=skip never released, moved to now past its deadline, ends unseen
-- (5) as tick.lua would end it (common.lua's skipped).
if fenced() then return redis.error_reply(FENCE) end
local id = ARGV[1]
local m = load(id)
if not m then return 'NF' end
if m.status == '1' then redis.call('ZREM', WAITING, id)
elseif m.status == '2' then ready_remove(id, m)
else return 'S' .. m.status end
m.trigger, m.expire, m.rk = ARGV[2], ARGV[3], ARGV[4]
if tonumber(m.trigger) > tonumber(ARGV[5]) then
  redis.call('ZADD', WAITING, m.trigger, id)
  m.status = '1'
elseif skipped(m, ARGV[5]) then
  finish(id, m, '5', ARGV[6])
else
  ready_add(id, m)
end
return {save(id, m), redis.call('HGET', BODY, id)}
