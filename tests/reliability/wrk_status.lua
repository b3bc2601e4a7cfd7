-- wrk script for tests/reliability/load.py: GETs spread over the paths in
-- WRK_PATHS (space-separated), responses counted by status class; done()
-- prints one line that load.py parses.
local paths = {}
for p in string.gmatch(os.getenv("WRK_PATHS") or "/healthz", "%S+") do
	paths[#paths + 1] = p
end
local threads = {}
local n = 0

function setup(thread)
	threads[#threads + 1] = thread
end

function init(args)
	s2 = 0
	s4 = 0
	s5 = 0
	other = 0
end

function request()
	n = n + 1
	return wrk.format("GET", paths[(n % #paths) + 1])
end

function response(status, headers, body)
	if status >= 500 then
		s5 = s5 + 1
	elseif status >= 400 then
		s4 = s4 + 1
	elseif status >= 200 and status < 300 then
		s2 = s2 + 1
	else
		other = other + 1
	end
end

function done(summary, latency, requests)
	local t2, t4, t5, to = 0, 0, 0, 0
	for _, t in ipairs(threads) do
		t2 = t2 + t:get("s2")
		t4 = t4 + t:get("s4")
		t5 = t5 + t:get("s5")
		to = to + t:get("other")
	end
	io.write(string.format("WRKSTATUS 2xx=%d 4xx=%d 5xx=%d other=%d requests=%d connect=%d read=%d write=%d timeout=%d p99_ms=%.1f\n",
		t2, t4, t5, to, summary.requests, summary.errors.connect, summary.errors.read,
		summary.errors.write, summary.errors.timeout, latency:percentile(99) / 1000))
end
