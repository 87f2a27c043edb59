-- deleteMsgs: each listed live (1, 2, 3) message -> DELETED (7), as
-- delete.lua does one; all in one script, so the call is whole. ARGV:
-- retire_at, then ids -> how many were deleted (an id gone or ended
-- meanwhile is left as it is)
local retire_at, n = ARGV[1], 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local m = load(id)
  if m then
    local st = m.status
    if st == '1' or st == '2' or st == '3' then
      if st == '1' then redis.call('ZREM', WAITING, id)
      elseif st == '2' then ready_remove(id, m)
      else redis.call('ZREM', ACK, id) end
      finish(id, m, '7', retire_at)
      save(id, m)
      n = n + 1
    end
  end
end
return n
