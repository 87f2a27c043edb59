-- pauseTopic, resumeTopic, setTopicConfig: the topic's settings and pauses
-- as kept (broker.redis.flow). ARGV: now retire_at token mode, then name
-- value pairs ("c": the topic's entry; "paused": "1" while the topic is
-- paused; "fair": "1" while fairness is fairKey; "k:<key>": a paused
-- serial key's entry). Mode "w": FLOW replaced whole by the pairs (no
-- pair: the topic has no settings, and FLOW goes). Mode "c": one change,
-- only the fields named set, or removed where the value is "" -- what it
-- costs is that change, whatever the topic's other paused keys. Either
-- way "v" becomes the token (the change's own: a node that made it knows
-- its copy is current, broker.redis.flow's read_topic).
-- A key paused now has its pullable message parked (none of its READY
-- messages is pullable until it is resumed); a key resumed, if no message
-- of it is CONSUMING, has its best READY message pullable again. The
-- schedules' runs a pause held back ("h:<id>", common.lua's hold) stay
-- held while their topic or key is still paused; once either is resumed
-- the others are released now, as tick.lua would have released them (past
-- its expire time or, misfire=skip, its grace: ended unseen, 5).
-- Fairness ("fair"): turned on, every pullable (READY) message is indexed
-- in FAIR now, in this script (its time grows with the topic's pullable
-- messages: docs/redis.md, "Fairness on Redis"); kept on, the turn ("turn")
-- is kept; turned off, FAIR is dropped (UNLINK: freed in the background).
-- -> 1 if something became pullable (the topic, or a key, resumed: the
-- caller wakes the topic's long polls), else 0
if fenced() then return redis.error_reply(FENCE) end
local now, retire_at, token, whole = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == 'w'
local was_paused = redis.call('HEXISTS', FLOW, 'paused') == 1
local was_fair = fair()
local turn = redis.call('HGET', FLOW, 'turn')
local parked, freed, holds = {}, {}, {}
local function is_key(name) return string.sub(name, 1, 2) == 'k:' end
local function is_hold(name) return string.sub(name, 1, 2) == 'h:' end
if whole then
  local old = redis.call('HKEYS', FLOW)
  local new = {}
  redis.call('DEL', FLOW)
  for i = 5, #ARGV, 2 do
    new[ARGV[i]] = true
    redis.call('HSET', FLOW, ARGV[i], ARGV[i + 1])
    if is_key(ARGV[i]) then parked[#parked + 1] = string.sub(ARGV[i], 3) end
  end
  if #ARGV > 4 then redis.call('HSET', FLOW, 'v', token) end
  for _, name in ipairs(old) do
    if is_key(name) and not new[name] then
      freed[#freed + 1] = string.sub(name, 3)
    elseif is_hold(name) then
      holds[#holds + 1] = name
    end
  end
else
  for i = 5, #ARGV, 2 do
    local name, value = ARGV[i], ARGV[i + 1]
    local had = redis.call('HEXISTS', FLOW, name) == 1
    if value == '' then
      if had then
        redis.call('HDEL', FLOW, name)
        if is_key(name) then freed[#freed + 1] = string.sub(name, 3) end
      end
    else
      redis.call('HSET', FLOW, name, value)
      if is_key(name) and not had then parked[#parked + 1] = string.sub(name, 3) end
    end
  end
  redis.call('HSET', FLOW, 'v', token)
  -- (the holds are looked at only when something was resumed: a pause costs its own change)
  if #freed > 0 or (was_paused and redis.call('HEXISTS', FLOW, 'paused') == 0) then
    for _, name in ipairs(redis.call('HKEYS', FLOW)) do
      if is_hold(name) then holds[#holds + 1] = name end
    end
  end
end
fair_on = nil
if fair() and was_fair then
  if whole and turn then redis.call('HSET', FLOW, 'turn', turn) end
elseif fair() then
  local from = '-'
  while true do
    local rks = redis.call('ZRANGEBYLEX', READY, from, '+', 'LIMIT', 0, 1000)
    for _, rk in ipairs(rks) do redis.call('ZADD', FAIR, 0, fair_member(rk, load_rk(rk))) end
    if #rks < 1000 then break end
    from = '(' .. rks[#rks]
  end
elseif was_fair then
  redis.call('UNLINK', FAIR)
  redis.call('HDEL', FLOW, 'turn')
end
for _, k in ipairs(parked) do
  local rk = key_best(k)
  if rk then
    pullable_remove(rk, load_rk(rk))
  end
end
for _, k in ipairs(freed) do
  if redis.call('HEXISTS', BUSY, k) == 0 then key_promote(k) end
end
local paused = redis.call('HEXISTS', FLOW, 'paused') == 1
local released = false
for _, name in ipairs(holds) do
  local id = string.sub(name, 3)
  local m = load(id)
  -- (one deleted, or rescheduled back into WAITING, since: no longer held)
  if m and m.status == '1' and m.held and not redis.call('ZSCORE', WAITING, id) then
    if paused or (keyed(m) and key_paused(m.key)) then
      redis.call('HSET', FLOW, name, '1')  -- still paused
    else
      redis.call('HDEL', FLOW, name)
      m.held = nil
      if tonumber(now) >= tonumber(m.expire) or skipped(m, now) then
        finish(id, m, '5', retire_at)
      else
        ready_add(id, m)
        released = true
      end
      save(id, m)
    end
  else
    redis.call('HDEL', FLOW, name)
  end
end
if woken or released or (was_paused and not paused) then return 1 end
return 0
