-- The mover's step: WAITING -> READY (or EXPIRED past its expire time, or
-- a schedule's run of misfire=skip past its grace: common.lua's skipped; or
-- held back, still WAITING, if its topic or key is paused: common.lua's hold), ack
-- timeouts (CONSUMING -> READY retry+1, or 6), READY expiry (5 if never
-- delivered, else 6), purge of retired final messages; and the push
-- deliveries whose node is gone: the calling node renews its lease in
-- LEASES (node -> until when it counts as alive) while the topic has
-- deliveries held (an idle topic's TICK writes nothing), and a delivery in HELD
-- past its push timeout times out now if the node that pushed it has no
-- lease left (else it is looked at again when that lease ends, and its
-- ack deadline holds meanwhile). ARGV: now limit retire_at node
-- lease_until -> {trigger times made ready, retried, ended, 1 if a step
-- was cut at limit, 1 if a parked message became pullable (woke), next
-- waiting, ack, expire, retire and held scores (or false)}
if fenced() then return redis.error_reply(FENCE) end
local now, limit, retire_at = ARGV[1], tonumber(ARGV[2]), ARGV[3]
redis.call('ZREMRANGEBYSCORE', LEASES, '-inf', now)  -- a lease counts while it ends after now
if redis.call('ZCARD', HELD) > 0 then redis.call('ZADD', LEASES, ARGV[5], ARGV[4]) end
local triggers, retried, ended = {}, 0, 0
-- Pops the members of `key` due by now; runs step(id, m) on those whose
-- message is still in `status`, and saves them. How many were popped.
local function each_due(key, status, step)
  local ids = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(ids) do
    redis.call('ZREM', key, id)
    local m = load(id)
    if m and m.status == status then
      step(id, m)
      save(id, m)
    end
  end
  return #ids
end
local due = each_due(WAITING, '1', function(id, m)
  if tonumber(now) < tonumber(m.expire) and run_paused(m) then  -- a schedule's run held by a pause
    hold(id, m)
  elseif tonumber(now) >= tonumber(m.expire) or skipped(m, now) then  -- skipped: a missed run of misfire=skip
    finish(id, m, '5', retire_at)
    ended = ended + 1
  else
    ready_add(id, m)
    triggers[#triggers + 1] = m.trigger
  end
end)
local function time_out(id, m)
  consuming_end(id, m)
  if retry_or_end(id, m, now, retire_at) then retried = retried + 1 else ended = ended + 1 end
end
local timed_out = each_due(ACK, '3', time_out)
local orphaned = each_due(HELD, '3', function(id, m)
  local lease = m.node and redis.call('ZSCORE', LEASES, m.node)
  if lease then redis.call('ZADD', HELD, lease, id) else time_out(id, m) end
end)
local expired = each_due(EXPIRE, '2', function(id, m)
  ready_remove(id, m)
  end_expired(id, m, retire_at)
  ended = ended + 1
end)
local retired = redis.call('ZRANGEBYSCORE', RETIRE, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(retired) do
  purge(id)
end
local full = 0
if due == limit or timed_out == limit or orphaned == limit or expired == limit or #retired == limit then
  full = 1
end
return {triggers, retried, ended, full, woken and 1 or 0, head_score(WAITING), head_score(ACK), head_score(EXPIRE),
        head_score(RETIRE), head_score(HELD)}
