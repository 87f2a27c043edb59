-- Register topics in the topic set, within the topic cap. KEYS[1]: the
-- topic set (<prefix>:topics). ARGV: the cap (--max-topics), then topic
-- names, each once. Adds those not in the set, all or none: none if that
-- would make the set larger than the cap.
-- -> {1 added (or nothing to add) | 0 refused, the set's size before}
local topics = KEYS[1]
local new = {}
for i = 2, #ARGV do
  if redis.call('SISMEMBER', topics, ARGV[i]) == 0 then
    new[#new + 1] = ARGV[i]
  end
end
local size = redis.call('SCARD', topics)
if size + #new > tonumber(ARGV[1]) then
  return {0, size}
end
for _, topic in ipairs(new) do
  redis.call('SADD', topics, topic)
end
return {1, size}
