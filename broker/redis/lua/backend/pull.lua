-- READY -> CONSUMING, best first (among the tags' ranges when tags are
-- given); an expired head is ended on the way, never delivered. A keyed
-- message taken makes its key busy (common.lua): the key's other READY
-- messages wait until it leaves CONSUMING. A pusher's pull (node given)
-- also files each message in HELD at held_until, its push timeout, and
-- names the node in it: tick.lua hands it back then if the node is gone;
-- the node's lease is renewed to lease_until (as its TICKs renew it).
-- A paused topic (FLOW's "paused": broker.redis.flow) hands nothing out.
-- maxDueAgeMillis: with `overdue_at` (now - the cap; '': none) a message
-- due at or before it goes first, the oldest first, before priority order:
-- the first message of each priority's range is read (the oldest of that
-- priority), at most OLDEST_BANDS priorities, highest first.
-- Fairness (FLOW's "fair", common.lua): a pull without tags takes turns
-- over the groups of FAIR (one per fairKey, "" for none), in the order of
-- their names, starting after the group served last ("turn" in FLOW,
-- kept there for the next pull): each turn takes the group's best. The
-- overdue ones (maxDueAgeMillis) still go first, taking no turn; a pull by
-- tags follows the plain order among its tags (docs/redis.md).
-- Each message taken keeps the pull's delivery (its deliveryId: docs/api.md,
-- "Leases") in m.delivery until it leaves CONSUMING (lease.lua fences by it).
-- ARGV: now deadline batch retire_at node ('': a consumer's) held_until
-- lease_until overdue_at delivery tag... -> {ended, {id, meta, body}...}
if fenced() then return redis.error_reply(FENCE) end
local now, deadline, batch, retire_at = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[4]
local node, held_until = ARGV[5], ARGV[6]
local FIRST_TAG = 10
local delivery = ARGV[9]
local overdue_at = tonumber(ARGV[8])
local OLDEST_BANDS = 16
-- The oldest rk due at or before overdue_at among the first of each
-- priority's range of `zset`'s members that begin with `prefix` (up to
-- `upper`, exclusive), or nil.
local function overdue(zset, prefix, upper)
  local best, best_trigger, from = nil, nil, '[' .. prefix
  for _ = 1, OLDEST_BANDS do
    local first = redis.call('ZRANGEBYLEX', zset, from, upper, 'LIMIT', 0, 1)[1]
    if not first then break end
    local rk = string.sub(first, #prefix + 1)
    local trigger = string.sub(rk, 6, 20)
    if tonumber(trigger) <= overdue_at and (best == nil or less(trigger, best_trigger)) then
      best, best_trigger = rk, trigger
    end
    from = '[' .. prefix .. string.format('%05d', tonumber(string.sub(rk, 1, 5)) + 1)
  end
  return best
end
if node ~= '' then redis.call('ZADD', LEASES, ARGV[7], node) end
if redis.call('HEXISTS', FLOW, 'paused') == 1 then return {0} end  -- a paused topic hands nothing out
local turn = redis.call('HGET', FLOW, 'turn')
local turned = false
-- The best rk of the next group after `turn` (wrapping), and its group.
local function fair_head()
  local h
  if turn then h = redis.call('ZRANGEBYLEX', FAIR, '[' .. turn .. '\1', '+', 'LIMIT', 0, 1)[1] end
  if not h then h = redis.call('ZRANGEBYLEX', FAIR, '-', '+', 'LIMIT', 0, 1)[1] end
  if not h then return nil end
  local cut = string.find(h, '\0', 1, true)
  return string.sub(h, cut + 1), string.sub(h, 1, cut - 1)
end
local function head()
  if #ARGV < FIRST_TAG then
    local old = overdue_at and overdue(READY, '', '+')
    if old then return old end
    if fair() then return fair_head() end
    return redis.call('ZRANGE', READY, 0, 0)[1]
  end
  local best, oldest
  for i = FIRST_TAG, #ARGV do
    local tag = ARGV[i]
    local h = redis.call('ZRANGEBYLEX', TAGGED, '[' .. tag .. ',', '(' .. tag .. '-', 'LIMIT', 0, 1)[1]
    if h then
      local rk = string.sub(h, #tag + 2)
      if best == nil or less(rk, best) then best = rk end
      local old = overdue_at and overdue(TAGGED, tag .. ',', '(' .. tag .. '-')
      if old and (oldest == nil or less(string.sub(old, 6), string.sub(oldest, 6))) then oldest = old end
    end
  end
  return oldest or best
end
local out, ended = {}, 0
while #out < batch do
  local rk, group = head()
  if not rk then break end
  local id = string.sub(rk, 22)
  local m = load(id)
  if not m then  -- a member without its message: drop it rather than loop on it
    redis.call('ZREM', READY, rk)
    if group then redis.call('ZREM', FAIR, group .. '\0' .. rk) end
    for i = FIRST_TAG, #ARGV do redis.call('ZREM', TAGGED, ARGV[i] .. ',' .. rk) end
  elseif now >= tonumber(m.expire) then
    ready_remove(id, m)
    end_expired(id, m, retire_at)
    ended = ended + 1
    save(id, m)
  else
    if keyed(m) then redis.call('HSET', BUSY, m.key, id) end  -- before ready_remove: no other of the key pullable
    ready_remove(id, m)
    m.status = '3'
    if group then turn, turned = group, true end  -- its turn taken: the next group's is next
    m.retry = tostring(tonumber(m.retry) + 1)  -- retry counts deliveries (camellia)
    m.delivery = delivery
    redis.call('ZADD', ACK, deadline, id)
    if node ~= '' then
      m.node = node
      redis.call('ZADD', HELD, held_until, id)
    end
    out[#out + 1] = {id, save(id, m), redis.call('HGET', BODY, id)}
  end
end
if turned then redis.call('HSET', FLOW, 'turn', turn) end
table.insert(out, 1, ended)
return out
