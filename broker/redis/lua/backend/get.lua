-- ARGV: id -> {meta, body} or nil
if fenced() then return redis.error_reply(FENCE) end
local raw = redis.call('HGET', META, ARGV[1])
if not raw then return nil end
return {raw, redis.call('HGET', BODY, ARGV[1])}
