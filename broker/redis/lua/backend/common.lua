-- Shared by every script. KEYS are a topic's eleven keys (TopicKeys.all); a
-- message is a table of strings, read with load() and written with save().
local WAITING, READY, TAGGED, EXPIRE, ACK, META, BODY, RETIRE, TAGS, BULK, BULKINFO =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
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
local function ready_add(id, m)
  redis.call('ZADD', READY, 0, m.rk)
  if m.tag ~= '' then redis.call('ZADD', TAGGED, 0, m.tag .. ',' .. m.rk) end
  redis.call('ZADD', EXPIRE, m.expire, id)
  m.status = '2'
end
local function ready_remove(id, m)
  redis.call('ZREM', READY, m.rk)
  if m.tag ~= '' then redis.call('ZREM', TAGGED, m.tag .. ',' .. m.rk) end
  redis.call('ZREM', EXPIRE, id)
end
-- The message's entry in TAGS (the bulk calls' tag filter), made at its
-- send and dropped when it is purged.
local function tag_add(id, m)
  if m.tag ~= '' then redis.call('ZADD', TAGS, 0, m.tag .. ',' .. id) end
end
local function purge(id)
  local m = load(id)
  if m and m.tag ~= '' then redis.call('ZREM', TAGS, m.tag .. ',' .. id) end
  redis.call('HDEL', META, id)
  redis.call('HDEL', BODY, id)
  redis.call('ZREM', RETIRE, id)
end
local function finish(id, m, status, retire_at)
  m.status = status
  redis.call('ZADD', RETIRE, retire_at, id)
end
-- A CONSUMING message (already out of ACK) is READY again, or ends (6)
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
-- A message out of READY past its expire time: 5 if never delivered, else 6.
local function end_expired(id, m, retire_at)
  if m.retry == '0' then finish(id, m, '5', retire_at) else finish(id, m, '6', retire_at) end
end
local function head_score(key)
  local h = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return h[2] or false
end
