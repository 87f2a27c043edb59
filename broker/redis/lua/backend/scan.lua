-- The bulk calls' reads, a bounded step each, never of a call half applied
-- (the fence). ARGV: 'meta' cursor match ('': all) count -> {next cursor,
-- {msgId, meta, ...}} (HSCAN of META); or 'tag' low high count tag ->
-- {msgId, meta or false, ...} of the tag's range of TAGS ("<tag>,<msgId>"
-- members); or 'key' low high count key -> the same of the key's range of
-- KEYED ("<key>\0<msgId>").
if fenced() then return redis.error_reply(FENCE) end
if ARGV[1] == 'meta' then
  if ARGV[3] == '' then return redis.call('HSCAN', META, ARGV[2], 'COUNT', ARGV[4]) end
  return redis.call('HSCAN', META, ARGV[2], 'MATCH', ARGV[3], 'COUNT', ARGV[4])
end
local tag = ARGV[5]  -- the tag or key: the members' prefix, and one byte more
local index = TAGS
if ARGV[1] == 'key' then index = KEYED end
local members = redis.call('ZRANGEBYLEX', index, ARGV[2], ARGV[3], 'LIMIT', 0, tonumber(ARGV[4]))
local out = {}
for i, member in ipairs(members) do
  local id = string.sub(member, #tag + 2)
  out[2 * i - 1] = id
  out[2 * i] = redis.call('HGET', META, id)
end
return out
