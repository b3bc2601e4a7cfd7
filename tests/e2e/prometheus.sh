#!/usr/bin/env bash
# GET /metrics against a live daemon: the output passes `promtool check
# metrics`, routes are labelled by pattern, a finished job's series go
# away; and a real Prometheus server (Debian's prometheus package) scrapes
# the daemon on loopback and answers queries for trainerd_jobs and a
# running job's step through its HTTP API.
# Usage: prometheus.sh TRAINERD   (run from the repository root)
# Loopback only; every wait is bounded.
set -u
TRAINERD=$(realpath "${1:?usage: prometheus.sh TRAINERD}")
work=$(mktemp -d)
daemon_pid=
prom_pid=
cleanup() {
	[ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null
	[ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
for tool in promtool prometheus curl; do
	if ! command -v $tool >/dev/null; then
		echo "$tool is not installed (scripts/install-deps.sh installs it)" >&2
		echo "RESULT: 0 passed, 1 failed"
		exit 1
	fi
done

mkdir -p "$work/state"
"$TRAINERD" serve --listen 127.0.0.1:0 --state-dir "$work/state" --data-root "$work/state" --cpu-devices 2 \
	--backend cpu >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 150); do
	[ -s "$work/state/listen.addr" ] && break
	sleep 0.1
done
url=$(cat "$work/state/listen.addr")
[ -n "$url" ] || { echo "trainerd did not start" >&2; cat "$work/daemon.log" >&2; exit 1; }

# Minutes of training (cancelled at the end): it runs through every scrape.
cat >"$work/job.json" <<'JSON'
{"name": "scraped", "seed": 4,
 "model": {"layers": [{"type": "dense", "units": 16}, {"type": "relu"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 3000, "features": 5, "classes": 3, "load_cost_us": 1500}},
 "batch_size": 32, "epochs": 200, "optimizer": {"type": "adamw", "lr": 0.01},
 "checkpoint": {"every_steps": 50, "keep": 2}}
JSON
id=$(curl -sf -X POST "$url/jobs" -H 'Content-Type: application/json' --data-binary @"$work/job.json" |
	python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
check "a job was submitted" test -n "$id"
for _ in $(seq 300); do
	curl -sf "$url/jobs/$id" | grep -q '"state":"running"' && break
	sleep 0.1
done
curl -sf "$url/jobs/$id" >/dev/null
curl -s "$url/no/such/route" >/dev/null
sleep 1.5 # a checkpoint or two

# ---- the exposition itself ----
curl -sf -D "$work/headers" "$url/metrics" >"$work/m1"
check "GET /metrics answers 200" test $? -eq 0
check "content type is text format 0.0.4" has "$work/headers" "Content-Type: text/plain; version=0.0.4"
promtool check metrics <"$work/m1" >"$work/lint" 2>&1
check "promtool check metrics passes" test $? -eq 0
[ -s "$work/lint" ] && cat "$work/lint" >&2
for name in 'trainerd_build_info{version="' 'trainerd_jobs{state="running"} 1' 'trainerd_jobs_submitted_total 1' \
	"trainerd_job_step{job_id=\"$id\"}" "trainerd_job_samples_per_second{job_id=\"$id\"}" \
	"trainerd_job_loss{job_id=\"$id\"}" "trainerd_job_data_wait_ratio{job_id=\"$id\"}" \
	"trainerd_device_info{device=\"0\",name=\"cpu0\",job_id=\"$id\"} 1" \
	'trainerd_http_requests_total{method="GET",route="/jobs/{id}",code="200"}' \
	'trainerd_http_requests_total{method="other",route="unmatched",code="404"} 1' \
	'trainerd_http_request_duration_seconds_bucket{method="GET",route="/jobs/{id}",le="+Inf"}' \
	'trainerd_checkpoint_write_duration_seconds_count' 'trainerd_checkpoint_bytes_total' \
	'trainerd_preemptions_total{mode="checkpoint"} 0' 'trainerd_preemptions_total{mode="hard"} 0' \
	'trainerd_metric_points_dropped_total 0' 'process_resident_memory_bytes' 'process_open_fds' \
	'process_cpu_seconds_total' 'process_start_time_seconds' 'process_max_fds'; do
	check "/metrics has $name" has "$work/m1" "^$name"
done
check "no raw path becomes a route label" test -z "$(grep "route=\"/jobs/$id" "$work/m1")"
ckpts=$(awk '/^trainerd_checkpoint_write_duration_seconds_count/ {print $2}' "$work/m1")
check "checkpoint writes are counted" test "${ckpts:-0}" -ge 1
start=$(awk '/^process_start_time_seconds/ {print $2}' "$work/m1")
check "process start time is within the last minute" python3 -c "import time; assert abs(time.time() - $start) < 60"

# ---- a real Prometheus scraping it ----
pport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: trainerd
    static_configs:
      - targets: ['${url#http://}']
EOF
promtool check config "$work/prometheus.yml" >/dev/null
check "the scrape config is valid" test $? -eq 0
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
	--web.listen-address="127.0.0.1:$pport" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
query() { # query PROMQL: prints the first sample's value, or nothing
	curl -sf --get "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1" |
		python3 -c 'import json,sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else "")' 2>/dev/null
}
running= step=
deadline=$((SECONDS + 60))
while [ $SECONDS -lt $deadline ]; do
	running=$(query 'trainerd_jobs{state="running"}')
	step=$(query "trainerd_job_step{job_id=\"$id\"}")
	[ -n "$running" ] && [ -n "$step" ] && break
	sleep 0.5
done
check "Prometheus scraped trainerd_jobs" test "$running" = 1
check "Prometheus has the running job's step" python3 -c "assert float('${step:-0}') > 0"
up=$(query 'up{job="trainerd"}')
check "the target is up" test "$up" = 1
if [ "$fail" -ne 0 ]; then
	tail -20 "$work/prometheus.log" >&2
fi

# ---- a finished job's series disappear ----
curl -sf -X POST "$url/jobs/$id/cancel" >/dev/null
for _ in $(seq 300); do
	curl -sf "$url/jobs/$id" | grep -q '"state":"cancelled"' && break
	sleep 0.1
done
curl -sf "$url/metrics" >"$work/m2"
check "a finished job's series are gone" test -z "$(grep "job_id=\"$id\"" "$work/m2" | grep -v '^trainerd_device_info')"
check "devices are free again" has "$work/m2" 'trainerd_device_info{device="0",name="cpu0",job_id=""} 1'
check "jobs by state follow" has "$work/m2" 'trainerd_jobs{state="cancelled"} 1'
promtool check metrics <"$work/m2" >/dev/null 2>&1
check "promtool passes with no job running" test $? -eq 0

if [ "$fail" -ne 0 ]; then
	echo "---- daemon log ----" >&2
	tail -30 "$work/daemon.log" >&2
fi
finish
