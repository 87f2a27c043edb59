-- Store -> prepare. ARGV: kind now deadline count
-- -> {next due score | false, {id, key, body, retries, ...}}
return take(ARGV[2], ARGV[3], tonumber(ARGV[4]))
