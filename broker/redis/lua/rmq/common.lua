-- Every script: KEYS = store, prepare, dead, pending, body, key, retry, prio,
-- lease of one slot; ARGV[1] = the topic's kind.
local kind = ARGV[1]
local function forget(id)
  for i = 5, 8 do redis.call('HDEL', KEYS[i], id) end
end
-- An id in no zset goes back to the store, due at due_ms (priority topics:
-- at its priority), unless a message with its key is pending: then it
-- merges into that newer one (is forgotten). 1 if stored.
local function restore(id, due_ms)
  local key = redis.call('HGET', KEYS[6], id)
  if redis.call('HEXISTS', KEYS[4], key) == 1 then forget(id) return 0 end
  local score = due_ms
  if kind == 'priority' then score = redis.call('HGET', KEYS[8], id) end
  redis.call('ZADD', KEYS[1], score, id)
  redis.call('HSET', KEYS[4], key, id)
  return 1
end
-- Store -> prepare: up to `count` deliverable ids, due by `now`.
local function take(now, deadline, count)
  local ids
  if kind == 'priority' then
    ids = redis.call('ZREVRANGE', KEYS[1], 0, count - 1)
  else
    ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, count)
  end
  local out = {}
  for _, id in ipairs(ids) do
    local key = redis.call('HGET', KEYS[6], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[4], key)
    redis.call('ZADD', KEYS[2], deadline, id)
    out[#out + 1] = id
    out[#out + 1] = key
    out[#out + 1] = redis.call('HGET', KEYS[5], id)
    out[#out + 1] = redis.call('HGET', KEYS[7], id) or '0'
  end
  local head = false
  if kind ~= 'priority' then head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or false end
  return {head, out}
end
-- A failed delivery of an id in prepare.
local function fail(id, now, due_ms, max_retries)
  redis.call('ZREM', KEYS[2], id)
  if redis.call('HINCRBY', KEYS[7], id, 1) > max_retries then
    redis.call('ZADD', KEYS[3], now, id)
    return 'dead'
  end
  if restore(id, due_ms) == 1 then return 'retry' end
  return 'merged'
end
