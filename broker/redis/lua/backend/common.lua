-- Shared by every script. KEYS are a topic's eighteen keys (TopicKeys.all); a
-- message is a table of strings, read with load() and written with save().
local WAITING, READY, TAGGED, EXPIRE, ACK, META, BODY, RETIRE, TAGS, BULK, BULKINFO =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local BUSY, KEYREADY, KEYED, HELD, LEASES, FLOW = KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17]
local FAIR = KEYS[18]
-- While a bulk call is applied (BULK holds its changes not yet made) every
-- other script of the topic answers this error instead of running, so no
-- client sees a call half made; the caller applies the rest
-- (bulk_apply.lua) and runs its script again (broker.redis.bulk).
local FENCE = 'HGBULK a bulk call is being applied to this topic'
local function fenced()
  return redis.call('EXISTS', BULK) == 1
end
local function load(id)
  local raw = redis.call('HGET', META, id)
  if raw then return cjson.decode(raw) end
  return nil
end
local function save(id, m)
  local raw = cjson.encode(m)
  redis.call('HSET', META, id, raw)
  return raw
end
-- Bytewise, as zset members are ordered (Lua's < follows Redis's locale).
local function less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
-- Serial keys (broker.redis.keys): a keyed message's m.key is its key.
-- Every READY keyed message is in KEYREADY ("<key>\0<rk>", so a key's
-- range is ordered as READY is); only its key's best one, and only while
-- no message of the key is CONSUMING (BUSY names that one), is also in
-- READY (and TAGGED), where pulls find it.
local function keyed(m)
  return m.key ~= nil and m.key ~= ''
end
-- A paused serial key (pauseTopic with a key: broker.redis.flow) parks its
-- READY messages as a busy key does: none is pullable until it is resumed.
local function key_paused(k)
  return redis.call('HEXISTS', FLOW, 'k:' .. k) == 1
end
local function key_best(k)
  local h = redis.call('ZRANGEBYLEX', KEYREADY, '[' .. k .. '\0', '(' .. k .. '\1', 'LIMIT', 0, 1)[1]
  if h then return string.sub(h, #k + 2) end
  return nil
end
-- Fairness (FLOW's "fair": broker.redis.flow): every pullable message is
-- in FAIR too, as "<fairKey>\0<rk>" (a fairKey holds no NUL; "" for none),
-- so pull.lua finds each group's best, and the next group after another,
-- by ZRANGEBYLEX. A topic without fairness pays one HEXISTS a script, no
-- write (read once: only flow_save.lua changes it, and resets fair_on).
local fair_on = nil
local function fair()
  if fair_on == nil then fair_on = redis.call('HEXISTS', FLOW, 'fair') == 1 end
  return fair_on
end
local function fair_member(rk, m)
  return (m and m.fairKey or '') .. '\0' .. rk
end
-- m: rk's message (nil: gone; its tag and fairKey taken as none).
local function pullable_add(rk, m)
  local tag = m and m.tag or ''
  redis.call('ZADD', READY, 0, rk)
  if tag ~= '' then redis.call('ZADD', TAGGED, 0, tag .. ',' .. rk) end
  if fair() then redis.call('ZADD', FAIR, 0, fair_member(rk, m)) end
end
local function pullable_remove(rk, m)
  local tag = m and m.tag or ''
  local was = redis.call('ZREM', READY, rk)
  if tag ~= '' then redis.call('ZREM', TAGGED, tag .. ',' .. rk) end
  if fair() then redis.call('ZREM', FAIR, fair_member(rk, m)) end
  return was
end
-- The message of rk, by the id rk ends with (or nil: gone).
local function load_rk(rk)
  local raw = redis.call('HGET', META, string.sub(rk, 22))
  if raw then return cjson.decode(raw) end
  return nil
end
-- True once this script made a keyed message pullable that was parked (its
-- key freed, or the one ahead of it gone): the caller wakes the topic's long
-- polls (`woke`), as the disk broker does when a key is freed.
local woken = false
local function woke(answer)
  if woken then return answer .. '+' end
  return answer
end
-- A free key's best READY message (if any) becomes pullable.
local function key_promote(k)
  if key_paused(k) then return end
  local rk = key_best(k)
  if rk then
    pullable_add(rk, load_rk(rk))
    woken = true
  end
end
local function ready_add(id, m)
  redis.call('ZADD', EXPIRE, m.expire, id)
  m.status = '2'
  m.skip = nil  -- released: its schedule moves on, and a later release (a reschedule) skips nothing
  m.held = nil
  if keyed(m) then
    local k = m.key
    redis.call('ZADD', KEYREADY, 0, k .. '\0' .. m.rk)
    if redis.call('HEXISTS', BUSY, k) == 1 or key_paused(k) or key_best(k) ~= m.rk then return end  -- parked
    -- the key's best now: the one that was (the next in its range) is pullable no more
    local next = redis.call('ZRANGEBYLEX', KEYREADY, '(' .. k .. '\0' .. m.rk, '(' .. k .. '\1', 'LIMIT', 0, 1)[1]
    if next then
      local rk = string.sub(next, #k + 2)
      pullable_remove(rk, load_rk(rk))
    end
  end
  pullable_add(m.rk, m)
end
local function ready_remove(id, m)
  redis.call('ZREM', EXPIRE, id)
  local was = pullable_remove(m.rk, m)
  if keyed(m) then
    redis.call('ZREM', KEYREADY, m.key .. '\0' .. m.rk)
    -- it was its free key's pullable one: the next best takes its place
    if was == 1 and redis.call('HEXISTS', BUSY, m.key) == 0 then key_promote(m.key) end
  end
end
-- A CONSUMING message leaves CONSUMING (acked, nacked, timed out, deleted,
-- given back, filed for a push retry): out of ACK and HELD, and its key, if
-- it held it, free, its best READY message pullable.
local function consuming_end(id, m)
  redis.call('ZREM', ACK, id)
  redis.call('ZREM', HELD, id)
  m.node = nil
  m.delivery = nil  -- (its hand-over is over: no fenced call matches it: lease.lua)
  if keyed(m) and redis.call('HGET', BUSY, m.key) == id then
    redis.call('HDEL', BUSY, m.key)
    key_promote(m.key)
  end
end
-- The message's entry in TAGS (the bulk calls' tag filter), made at its
-- send and dropped when it is purged.
-- So is its entry in KEYED ("<key>\0<msgId>", the key filter's).
local function tag_add(id, m)
  if m.tag ~= '' then redis.call('ZADD', TAGS, 0, m.tag .. ',' .. id) end
  if keyed(m) then redis.call('ZADD', KEYED, 0, m.key .. '\0' .. id) end
end
local function purge(id)
  local m = load(id)
  if m and m.tag ~= '' then redis.call('ZREM', TAGS, m.tag .. ',' .. id) end
  if m and keyed(m) then redis.call('ZREM', KEYED, m.key .. '\0' .. id) end
  redis.call('HDEL', META, id)
  redis.call('HDEL', BODY, id)
  redis.call('ZREM', RETIRE, id)
end
local function finish(id, m, status, retire_at)
  m.status = status
  redis.call('ZADD', RETIRE, retire_at, id)
end
-- A CONSUMING message (consuming_end done) is READY again, or ends (6)
-- after maxRetry + 1 deliveries (retry counts pulls) or past its expire
-- time. True if READY.
local function retry_or_end(id, m, now, retire_at)
  if tonumber(m.retry) > tonumber(m.maxRetry) or tonumber(now) >= tonumber(m.expire) then
    finish(id, m, '6', retire_at)
    return false
  end
  ready_add(id, m)
  return true
end
-- A schedule's run with misfire=skip (m.skip: its nominal time + grace,
-- send.lua) released first past its grace: it ends unseen (5), as the disk's
-- Schedules.on_release ends it (broker.schedules.keeper).
local function skipped(m, now)
  return m.skip ~= nil and m.retry == '0' and tonumber(now) > tonumber(m.skip)
end
-- A schedule's run (m.run, send.lua) that falls due while its topic or its
-- serial key is paused is held back (docs/redis.md, "Flow"): it stays
-- WAITING (1), out of WAITING, marked m.held and named in FLOW ("h:<id>"),
-- until the resume's flow_save.lua releases it, judged then (a run of
-- misfire=skip past its grace ends unseen: skipped) -- its schedule makes
-- no next run meanwhile (broker.redis.schedules' RunWatch sees it waiting).
local function run_paused(m)
  return m.run ~= nil and m.retry == '0'
    and (redis.call('HEXISTS', FLOW, 'paused') == 1 or (keyed(m) and key_paused(m.key)))
end
local function hold(id, m)
  m.held = '1'
  redis.call('HSET', FLOW, 'h:' .. id, '1')
end
-- A message out of READY past its expire time: 5 if never delivered, else 6.
local function end_expired(id, m, retire_at)
  if m.retry == '0' then finish(id, m, '5', retire_at) else finish(id, m, '6', retire_at) end
end
local function head_score(key)
  local h = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return h[2] or false
end
