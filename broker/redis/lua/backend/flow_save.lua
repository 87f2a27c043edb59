-- pauseTopic, resumeTopic, setTopicConfig: the topic's settings and pauses
-- as kept (broker.redis.flow), FLOW replaced whole. ARGV: name value pairs
-- ("c": the topic's entry; "paused": "1" while the topic is paused;
-- "k:<key>": a paused serial key's entry); none: the topic has no settings.
-- A key paused now has its pullable message parked (none of its READY
-- messages is pullable until it is resumed); a key resumed, if no message
-- of it is CONSUMING, has its best READY message pullable again.
-- -> 1 if something became pullable (the topic, or a key, resumed: the
-- caller wakes the topic's long polls), else 0
if fenced() then return redis.error_reply(FENCE) end
local was_paused = redis.call('HEXISTS', FLOW, 'paused') == 1
local old = redis.call('HKEYS', FLOW)
local new = {}
redis.call('DEL', FLOW)
for i = 1, #ARGV, 2 do
  new[ARGV[i]] = true
  redis.call('HSET', FLOW, ARGV[i], ARGV[i + 1])
end
for name, _ in pairs(new) do
  if string.sub(name, 1, 2) == 'k:' then
    local rk = key_best(string.sub(name, 3))
    if rk then
      local m = load_rk(rk)
      pullable_remove(rk, m and m.tag or '')
    end
  end
end
for _, name in ipairs(old) do
  if string.sub(name, 1, 2) == 'k:' and not new[name] then
    local k = string.sub(name, 3)
    if redis.call('HEXISTS', BUSY, k) == 0 then key_promote(k) end
  end
end
if woken or (was_paused and not new['paused']) then return 1 end
return 0
