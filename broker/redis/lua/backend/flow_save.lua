-- pauseTopic, resumeTopic, setTopicConfig: the topic's settings and pauses
-- as kept (broker.redis.flow), FLOW replaced whole. ARGV: now retire_at,
-- then name value pairs ("c": the topic's entry; "paused": "1" while the
-- topic is paused; "k:<key>": a paused serial key's entry); no pair: the
-- topic has no settings. A key paused now has its pullable message parked
-- (none of its READY messages is pullable until it is resumed); a key
-- resumed, if no message of it is CONSUMING, has its best READY message
-- pullable again. The schedules' runs a pause held back ("h:<id>",
-- common.lua's hold) stay held while their topic or key is still paused;
-- the others are released now, as tick.lua would have released them (past
-- its expire time or, misfire=skip, its grace: ended unseen, 5).
-- Fairness ("fair"): turned on, every pullable (READY) message is indexed
-- in FAIR now, in this script (its time grows with the topic's pullable
-- messages: docs/redis.md, "Fairness on Redis"); kept on, the turn ("turn")
-- is kept; turned off, FAIR is dropped (UNLINK: freed in the background).
-- -> 1 if something became pullable (the topic, or a key, resumed: the
-- caller wakes the topic's long polls), else 0
if fenced() then return redis.error_reply(FENCE) end
local now, retire_at = ARGV[1], ARGV[2]
local was_paused = redis.call('HEXISTS', FLOW, 'paused') == 1
local was_fair = fair()
local turn = redis.call('HGET', FLOW, 'turn')
local old = redis.call('HKEYS', FLOW)
local new = {}
redis.call('DEL', FLOW)
for i = 3, #ARGV, 2 do
  new[ARGV[i]] = true
  redis.call('HSET', FLOW, ARGV[i], ARGV[i + 1])
end
fair_on = nil
if fair() and was_fair then
  if turn then redis.call('HSET', FLOW, 'turn', turn) end
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
end
for name, _ in pairs(new) do
  if string.sub(name, 1, 2) == 'k:' then
    local rk = key_best(string.sub(name, 3))
    if rk then
      pullable_remove(rk, load_rk(rk))
    end
  end
end
local released = false
for _, name in ipairs(old) do
  if string.sub(name, 1, 2) == 'k:' and not new[name] then
    local k = string.sub(name, 3)
    if redis.call('HEXISTS', BUSY, k) == 0 then key_promote(k) end
  elseif string.sub(name, 1, 2) == 'h:' then
    local id = string.sub(name, 3)
    local m = load(id)
    -- (one deleted, or rescheduled back into WAITING, since: no longer held)
    if m and m.status == '1' and m.held and not redis.call('ZSCORE', WAITING, id) then
      if new['paused'] or (keyed(m) and new['k:' .. m.key]) then
        redis.call('HSET', FLOW, name, '1')  -- still paused
      else
        m.held = nil
        if tonumber(now) >= tonumber(m.expire) or skipped(m, now) then
          finish(id, m, '5', retire_at)
        else
          ready_add(id, m)
          released = true
        end
        save(id, m)
      end
    end
  end
end
if woken or released or (was_paused and not new['paused']) then return 1 end
return 0
