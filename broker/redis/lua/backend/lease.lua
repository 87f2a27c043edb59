-- A fenced ack, nack or extension (docs/api.md, "Leases") of each id, in
-- turn: carried out only while the message is CONSUMING (3) and its
-- m.delivery, set by the pull that handed it over (pull.lua), is the one
-- given; an extension also only while its new deadline is within the
-- lease's bound (`cap`: the hand-over's time + --max-lease-ms, reckoned by
-- the caller from the delivery).
-- ARGV: kind ('ack' | 'nack' | 'extend') now retire_at deadline, then for
-- each id: id delivery cap
-- -> for each id: 'NF' (no such message) | 'STALE <status>' | 'CAP' |
--    'OK <status after> <triggerTime>'; the whole list ends with '+' as its
--    last item when a parked message became pullable (woke)
if fenced() then return redis.error_reply(FENCE) end
local kind, now, retire_at, deadline = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local out = {}
for i = 5, #ARGV, 3 do
  local id, delivery, cap = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local m = load(id)
  if not m then
    out[#out + 1] = 'NF'
  elseif m.status ~= '3' or m.delivery ~= delivery then
    out[#out + 1] = 'STALE ' .. m.status
  elseif kind == 'extend' then
    if tonumber(deadline) > tonumber(cap) then
      out[#out + 1] = 'CAP'
    else
      redis.call('ZADD', ACK, deadline, id)
      out[#out + 1] = 'OK 3 ' .. m.trigger
    end
  elseif kind == 'ack' then
    consuming_end(id, m)
    finish(id, m, '4', retire_at)
    save(id, m)
    out[#out + 1] = 'OK 4 ' .. m.trigger
  else
    consuming_end(id, m)
    local ready = retry_or_end(id, m, now, retire_at)
    save(id, m)
    out[#out + 1] = (ready and 'OK 2 ' or 'OK 6 ') .. m.trigger
  end
end
if woken then out[#out + 1] = '+' end
return out
