-- bench endpoints' many clients through wrk (bench/endpoints.py, --load-client wrk): each connection a loop of
-- runsync of one 1 KB input, with the endpoint's invocation key. A 200 that is not COMPLETED counts as failed.
-- done() prints one JSON line: requests, the completed and failed answers, wrk's socket errors and the latency
-- percentiles (microseconds) of every round trip.
wrk.method = "POST"
wrk.body = os.getenv("IDLEGRID_WRK_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("IDLEGRID_WRK_KEY")

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  completed = 0
  failed = 0
  first_failure = ""
end

function response(status, headers, body)
  if status == 200 and string.find(body, '"status": *"COMPLETED"') then
    completed = completed + 1
  else
    failed = failed + 1
    if first_failure == "" then
      first_failure = status .. " " .. string.sub(body, 1, 200)
    end
  end
end

function done(summary, latency, requests)
  local done_ok, done_failed, failure = 0, 0, ""
  for _, thread in ipairs(threads) do
    done_ok = done_ok + thread:get("completed")
    done_failed = done_failed + thread:get("failed")
    if failure == "" then failure = thread:get("first_failure") end
  end
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "completed": %d, "failed": %d, "first_failure": "%s", '
      .. '"socket_errors": %d, "p50_us": %d, "p95_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, done_ok, done_failed, string.gsub(failure, '[%c"\\]', " "),
    e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), latency.max
  ))
end
