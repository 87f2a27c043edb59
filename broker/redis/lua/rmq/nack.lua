-- ARGV: kind now due_ms max_retries id -> 'retry' | 'merged' | 'dead' | 'gone'
if not redis.call('ZSCORE', KEYS[2], ARGV[5]) then return 'gone' end
return fail(ARGV[5], ARGV[2], ARGV[3], tonumber(ARGV[4]))
