-- A redriveMsgs job's slice (broker.redis.requests' redrive_slice): the
-- topic's dead letters in RETIRE order (score, then id bytewise) after the
-- cursor member (cscore, cid), at most max_scan read, those matching the
-- filter put back (at most max_moves), as redrive.lua does and more: retry 0,
-- trigger = the job's trigger time (or now), expire = trigger + ttl, its
-- redriveCount (m.redrives) one more; WAITING if the trigger is to come, else
-- READY. The cursor's place is found by rank (ZCOUNT, then a binary search
-- among the members of its score), so members left behind are never read
-- again and a member moved is gone from RETIRE: a slice run again re-drives
-- nothing twice. No time is printed but with %.0f (exact below 2^53).
-- ARGV: now trigger('' = now) cscore('' = from the start) cid max_moves
-- max_scan statuses(',5,6,') key tag prefix (each '' = any, else '=' .. value)
-- ended_from ended_to ('' = none)
-- -> {matched, redriven, ready_now, next score or false, next id or false}
if fenced() then return redis.error_reply(FENCE) end
local now, cscore, cid = tonumber(ARGV[1]), ARGV[3], ARGV[4]
local trigger = ARGV[2] == '' and now or tonumber(ARGV[2])
local max_moves, max_scan, wanted = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local fkey, ftag, fprefix = ARGV[8], ARGV[9], ARGV[10]
local from = ARGV[11] ~= '' and tonumber(ARGV[11]) or nil
local to = ARGV[12] ~= '' and tonumber(ARGV[12]) or nil
local start = 0
if cscore ~= '' then
  local lo = redis.call('ZCOUNT', RETIRE, '-inf', '(' .. cscore)
  local hi = lo + redis.call('ZCOUNT', RETIRE, cscore, cscore)
  while lo < hi do  -- the first member of the cursor's score past cid
    local mid = math.floor((lo + hi) / 2)
    if less(cid, redis.call('ZRANGE', RETIRE, mid, mid)[1]) then hi = mid else lo = mid + 1 end
  end
  start = lo
end
local members = redis.call('ZRANGE', RETIRE, start, start + max_scan - 1, 'WITHSCORES')
local matched, moved, ready, last = 0, 0, 0, 0
for i = 1, #members, 2 do
  local id = members[i]
  local m = load(id)
  last = i
  if m and string.find(wanted, ',' .. m.status .. ',', 1, true)
     and (fkey == '' or (m.key or '') == string.sub(fkey, 2))
     and (ftag == '' or m.tag == string.sub(ftag, 2))
     and (fprefix == '' or string.sub(id, 1, #fprefix - 1) == string.sub(fprefix, 2)) then
    local ended = tonumber(m.trigger) + tonumber(m.ttl)
    if (from == nil or ended >= from) and (to == nil or ended < to) then
      matched = matched + 1
      redis.call('ZREM', RETIRE, id)
      m.trigger = string.format('%.0f', trigger)
      m.expire = string.format('%.0f', trigger + tonumber(m.ttl))
      m.rk = string.format('%05d%015.0f:', 32767 - tonumber(m.priority), trigger) .. id
      m.retry = '0'
      m.endReason, m.skip, m.held = nil, nil, nil
      m.redrives = tostring((tonumber(m.redrives or '0')) + 1)
      if trigger > now then
        m.status = '1'
        redis.call('ZADD', WAITING, m.trigger, id)
      else
        ready_add(id, m)
        ready = ready + 1
      end
      save(id, m)
      moved = moved + 1
      if moved >= max_moves then break end
    end
  end
end
if last == 0 or (moved < max_moves and #members < 2 * max_scan) then
  return {matched, moved, ready, false, false}
end
return {matched, moved, ready, members[last + 1], members[last]}
