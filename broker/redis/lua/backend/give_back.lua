-- Pulled for a long poll whose client hung up: CONSUMING -> READY, as if
-- never pulled (its delivery uncounted), if still held by that pull.
-- ARGV: deadline id... -> how many went back
if fenced() then return redis.error_reply(FENCE) end
local given = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local m = load(id)
  local deadline = redis.call('ZSCORE', ACK, id)
  if m and m.status == '3' and deadline and tonumber(deadline) == tonumber(ARGV[1]) then
    consuming_end(id, m)
    m.retry = tostring(tonumber(m.retry) - 1)
    ready_add(id, m)
    save(id, m)
    given = given + 1
  end
end
return given
