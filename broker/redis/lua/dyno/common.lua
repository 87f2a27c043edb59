-- Every script: KEYS = queue, unack, msg, prio of one shard.
local function score(due, id)
  return due .. '.' .. string.format('%02d', 99 - tonumber(redis.call('HGET', KEYS[4], id)))
end
