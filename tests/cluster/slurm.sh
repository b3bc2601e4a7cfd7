#!/usr/bin/env bash
# The Slurm allocator against a real one-node Slurm cluster
# (tests/cluster/slurm_cluster.sh starts munged, slurmctld and slurmd in a
# temporary folder on their own ports and stops them by pid):
#   - a 2-task job with "resources": {"allocator": "slurm"} (two ranks
#     under srun --mpi=pmix, exact mode) completes, and the
#     model.safetensors the daemon serves is the bits of a local
#     `trainerd run` of the same spec, which are those of a local
#     `trainerd run --processes 2` (a 1-task job completes below);
#   - `scontrol requeue` mid-run of a 2-task job: every rank stops on TERM at
#     the step they agree on, the job is `preempted` by Slurm (record, event
#     stream, log) while Slurm holds it, running again with --resume, and the
#     final model is the same bits;
#   - USR1 to the batch shell of a 2-task job (what --signal=B:USR1@S sends
#     before the time limit): a checkpoint, the script requeues the job, the
#     same bits; the time from USR1 to the worker's end (what the lead S
#     must cover) is measured and within S;
#   - a job Slurm has not started (partition `parked`): pause holds and
#     cancels the Slurm job and shows it paused, resume submits it again,
#     stop then cancels it;
#   - a job Slurm requeued and holds (`scontrol requeuehold`) is preempted;
#     cancel through the API is then scancel, the Slurm job ends CANCELLED
#     (a pause meanwhile is a 409);
#   - the daemon restarted while a 1-task Slurm job runs follows it again
#     and records its end, the same bits;
#   - with the daemon's report-url (set at that restart), a 2-task job's
#     rank 0 reports over the API with the job's token: live progress with
#     total_steps, every loss point once, the same bits; the token file is
#     0600, revoked at the end, and in no log or Slurm output;
#   - with report-url the worker runs in a folder of its own on the node
#     (the nodes need not share the daemon's): it writes nothing into the
#     job's folder on the daemon's side (only the daemon's files and the
#     worker's uploads are there), and a job requeued mid-run resumes from
#     the checkpoint it fetches over the API, the same bits;
#   - a bad "resources" is a 400 naming its JSON pointer (2 tasks without
#     exact mode too).
# Usage: slurm.sh TRAINERD [TRAINCTL]   (as root: slurmd runs jobs as their
# user; with TRAINCTL, its `ls` must name Slurm as the preempter too)
# Skipped (77) without Slurm's and munge's commands or without root. Every
# wait is bounded (generously: each ends as soon as its condition holds);
# about a minute and a half on two busy cores, several under a load of 20.
set -u
TRAINERD=$(realpath "${1:?usage: slurm.sh TRAINERD [TRAINCTL]}")
TRAINCTL=${2:+$(realpath "$2")}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../e2e/lib.sh"
cluster="$here/slurm_cluster.sh"

missing=$("$cluster" missing)
if [ -n "$missing" ]; then
	echo "slurm.sh: skipped, missing$missing (scripts/install-deps.sh installs slurm-wlm, slurmctld, slurmd, munge)"
	exit 77
fi
if [ "$(id -u)" != 0 ]; then
	echo "slurm.sh: skipped, needs root (slurmd starts jobs as the submitting user; CI runs as root)"
	exit 77
fi

work=$(mktemp -d)
daemon_pid=
stop_daemon() {
	[ -n "$daemon_pid" ] || return 0
	kill "$daemon_pid" 2>/dev/null
	wait "$daemon_pid" 2>/dev/null
	daemon_pid=
}
# Slurm's output of the jobs that ran in a node-local folder (report-url):
# on the node's /tmp, removed at the end.
node_outs=()
node_out() { echo "/tmp/trainerd-job-$1-slurm-$(cat "$work/state/slurm/job-$1/slurm_job_id" 2>/dev/null || echo "$2").out"; }
cleanup() {
	stop_daemon
	[ ${#node_outs[@]} = 0 ] || [ -n "${KEEP:-}" ] || rm -f "${node_outs[@]}"
	"$cluster" stop "$work/cluster"
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

if ! "$cluster" start "$work/cluster" >"$work/cluster.out" 2>&1; then
	cat "$work/cluster.out" >&2
	check "the one-node Slurm cluster starts" false
	finish
	exit 1
fi
export SLURM_CONF="$work/cluster/slurm.conf"
. "$here/../e2e/mpi_sanitizer_env.sh" # the daemon's environment reaches the tasks (sbatch exports it)

# start_daemon [OPTION...]: on 127.0.0.1, an ephemeral port unless told.
start_daemon() {
	rm -f "$work/state/listen.addr"
	"$TRAINERD" serve --listen 127.0.0.1:0 --state-dir "$work/state" --backend cpu --cpu-devices 1 "$@" \
		>>"$work/daemon.log" 2>&1 &
	daemon_pid=$!
	for _ in $(seq 150); do
		[ -s "$work/state/listen.addr" ] && break
		sleep 0.1
	done
	url=$(cat "$work/state/listen.addr" 2>/dev/null)
	[ -n "$url" ] || { echo "trainerd did not start" >&2; cat "$work/daemon.log" >&2; exit 1; }
}
mkdir -m 700 "$work/state"
start_daemon

# 378 steps; load_cost_us makes it last several seconds, so there is time
# to act mid-run.
cat >"$work/job.json" <<'JSON'
{"name": "slurmed", "seed": 7, "exact": true,
 "model": {"layers": [{"type": "dense", "units": 16}, {"type": "relu"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 2000, "features": 5, "classes": 3, "load_cost_us": 2500}},
 "batch_size": 32, "epochs": 6, "optimizer": {"type": "adamw", "lr": 0.01}, "devices": 1, "backend": "cpu",
 "checkpoint": {"every_steps": 50, "keep": 2},
 "resources": {"allocator": "slurm", "nodes": 1, "tasks_per_node": 1, "time_limit": "00:10:00"}}
JSON

# The same job as two tasks (ranks), and on a partition Slurm never starts.
# A build without MPI (no trainerd-mpi.so) runs the 2-task jobs as one.
tasks=2
if [ ! -e "$(dirname "$TRAINERD")/trainerd-mpi.so" ]; then
	tasks=1
	echo "slurm.sh: this build has no trainerd-mpi.so: the 2-task jobs run as 1 task, no local 2-process run"
fi
sed 's/"tasks_per_node": 1/"tasks_per_node": '$tasks'/' "$work/job.json" >"$work/job2.json"
sed 's/"time_limit"/"partition": "parked", "time_limit"/' "$work/job.json" >"$work/parked.json"

# field ID EXPR: a Python expression over the job's JSON (d).
field() {
	curl -sf "$url/jobs/$1" | python3 -c "import json,sys; d=json.load(sys.stdin); print($2)" 2>/dev/null
}
# submit [SPEC]: job.json unless named; prints the job id (the answer's
# first key: sed rather than python, whose start takes seconds on a busy
# machine, and the jobs to interrupt last about fifteen).
submit() {
	curl -sf -X POST "$url/jobs" -H 'Content-Type: application/json' --data-binary @"${1:-$work/job.json}" |
		sed -n 's/^{"id":\([0-9]*\),.*/\1/p'
}
# wait_for SECONDS ID EXPR: until the Python condition over d holds.
wait_for() {
	local end=$((SECONDS + $1)) v
	while ((SECONDS < end)); do
		v=$(field "$2" "$3")
		[ "$v" = True ] && return 0
		sleep 0.2
	done
	echo "job $2: '$3' not true within $1 s; job: $(curl -sf "$url/jobs/$2" | head -c 600)" >&2
	return 1
}
model_sha() {
	curl -sf "$url/jobs/$1/checkpoints/latest/model.safetensors" | sha256sum | cut -d' ' -f1
}
slurm_out() { cat "$work/state/slurm/job-$1"/slurm-*.out 2>/dev/null; }
# mid_run ID: waits (120 s at most: a start under a load of 20 on two
# cores took more than 30) until the worker has made a step, read
# from the job's folder (asking the API through curl and python takes
# seconds on a busy machine, and the job lasts about fifteen), then prints
# the Slurm job id.
mid_run() {
	local d="$work/state/slurm/job-$1" end=$((SECONDS + 120))
	while ((SECONDS < end)); do
		if [ -s "$d/slurm_job_id" ] && grep -q '"name":"loss"' "$d/metrics.jsonl" 2>/dev/null; then
			cat "$d/slurm_job_id"
			return 0
		fi
		sleep 0.1
	done
	echo "job $1: no step within 120 s" >&2
	return 1
}

# ---- submit; the jobs to interrupt first, as each lasts seconds ----
requeued=$(submit "$work/job2.json")
warned=$(submit "$work/job2.json")
cancelled=$(submit)

# ---- scontrol requeue, USR1 and requeuehold mid-run, one right after
# the other (each job lasts seconds) ----
sid=$(mid_run "$requeued") && scontrol requeue "$sid"
# USR1 to the batch shell, as before a time limit.
wsid=$(mid_run "$warned") && scancel --batch --signal=USR1 "$wsid"
# Requeued and held: Slurm keeps it back until released, so it stays
# preempted while the API is asked about it.
csid=$(mid_run "$cancelled") && scontrol requeuehold "$csid"

# ---- a job that completes undisturbed, as two tasks (one task completes
# below, after a daemon restart) ----
plain=$(submit "$work/job2.json")
check "jobs were submitted" test -n "$requeued" -a -n "$warned" -a -n "$cancelled" -a -n "$plain"
# The references, meanwhile: the same spec run here without Slurm, as one
# process and as two through mpirun (Open MPI's settings for root and two
# cores in this command's environment only).
"$TRAINERD" run "$work/job.json" --out "$work/local" --quiet &
local1_pid=$!
local2_pid=
if [ "$tasks" = 2 ]; then
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
		"$TRAINERD" run "$work/job.json" --processes 2 --out "$work/local2" --quiet >"$work/local2.log" 2>&1 &
	local2_pid=$!
fi
# Requeued, Slurm holds it back for cred_expire (10 s here) before it
# starts again: meanwhile the job is preempted, by Slurm (the event stream
# below shows it after the fact too).
check "requeue: the job is preempted by Slurm while Slurm holds it, the record naming the Slurm job and step" \
	wait_for 15 "$requeued" 'd["state"]=="preempted" and d["preemption"]["by"]=="slurm" and d["preemption"]["slurm_job_id"]=="'"$sid"'" and d["preemption"]["mode"]=="checkpoint" and d["preemption"]["step"]>0 and d["info"].get("slurm_requeued")=="true"'
# ---- cancel through the API, while Slurm holds the job after a requeue ----
check "cancel: requeued and held, the job is preempted" wait_for 30 "$cancelled" 'd["state"]=="preempted"'
if [ -n "$TRAINCTL" ]; then
	"$TRAINCTL" --url "$url" ls >"$work/ls.txt" 2>&1
	check "cancel: trainctl ls says preempted by slurm" grep -Eq "^ *$cancelled .*preempted by slurm" "$work/ls.txt"
fi
code=$(curl -s -o "$work/pause.json" -w '%{http_code}' -X POST "$url/jobs/$cancelled/pause")
check "cancel: a preempted Slurm job's pause is a 409" test "$code" = 409
check "... saying Slurm holds it" has "$work/pause.json" 'preempted by Slurm'
curl -sf -X POST "$url/jobs/$cancelled/cancel" >/dev/null
check "cancel: the job is cancelled" wait_for 90 "$cancelled" 'd["state"]=="cancelled"'
check "cancel: the Slurm job is CANCELLED" sh -c "scontrol show job -o $csid | grep -q JobState=CANCELLED"

# ---- a job Slurm has not started: pause, resume, stop (while the
# others run) ----
parked=$(submit "$work/parked.json")
check "pending: Slurm holds the job PENDING" wait_for 30 "$parked" 'd["info"].get("slurm_state")=="PENDING"'
psid=$(cat "$work/state/slurm/job-$parked/slurm_job_id")
curl -sf -X POST "$url/jobs/$parked/pause" >/dev/null
check "pending: a pause shows it paused" wait_for 30 "$parked" 'd["state"]=="paused"'
check "pending: ... and its Slurm job is cancelled" sh -c "scontrol show job -o $psid | grep -q JobState=CANCELLED"
curl -sf -X POST "$url/jobs/$parked/resume" >/dev/null
check "pending: resume submits a new Slurm job" wait_for 30 "$parked" 'd["state"]=="running" and d["info"].get("slurm_state")=="PENDING" and d["info"]["slurm_job_id"]!="'"$psid"'"'
psid=$(cat "$work/state/slurm/job-$parked/slurm_job_id")
curl -sf -X POST "$url/jobs/$parked/stop" >/dev/null
check "pending: a stop cancels it, saying why" wait_for 30 "$parked" 'd["state"]=="cancelled" and "before Slurm started it" in d["error"]["message"]'
check "pending: ... and its Slurm job is cancelled" sh -c "scontrol show job -o $psid | grep -q JobState=CANCELLED"

wait "$local1_pid"
ref=$(sha256sum "$work/local/model.safetensors" | cut -d' ' -f1)
ref_losses=$(grep -c '"name":"loss"' "$work/local/metrics.jsonl")
if [ -n "$local2_pid" ]; then
	wait "$local2_pid" || cat "$work/local2.log" >&2
	check "local: 2 processes give the bits of 1" test "$(sha256sum <"$work/local2/model.safetensors" | cut -d' ' -f1)" = "$ref"
fi

check "plain: completed, with the Slurm job id in its info" wait_for 240 "$plain" 'd["state"]=="completed" and d["info"]["slurm_state"]=="COMPLETED" and d["info"]["slurm_job_id"].isdigit() and d["devices"]==[]'
check "plain: the model of $tasks tasks is the bits of the local runs (1 and 2 processes)" test "$(model_sha "$plain")" = "$ref"
[ "$tasks" = 1 ] ||
	check "plain: srun started the ranks through PMIx" sh -c "$(declare -f slurm_out); work=$work; slurm_out $plain | grep -q '(2 tasks, --mpi=pmix)'"
n=$(curl -sf "$url/jobs/$plain/metrics?names=loss&max_points=100000" |
	python3 -c 'import json,sys; print(len(json.load(sys.stdin)["series"]["loss"]["steps"]))')
check "plain: every loss point reached the daemon from rank 0 ($n of $ref_losses)" test "$n" = "$ref_losses"

check "requeue: completed after one restart" wait_for 240 "$requeued" \
	'd["state"]=="completed" and d["info"].get("slurm_restarts")=="1" and d["info"]["slurm_requeued"]=="false"'
check "requeue: the second start resumed from the checkpoint" sh -c "$(declare -f slurm_out); work=$work; slurm_out $requeued | grep -q -- 'start 1: run --resume .*($tasks tasks'"
check "requeue: the model is the local run's bits" test "$(model_sha "$requeued")" = "$ref"
# job_events ID: the job's event history (the stream, cut after 3 s).
job_events() { curl -sN --max-time 3 "$url/jobs/$1/events" 2>/dev/null; }
job_events "$requeued" >"$work/events.txt"
check "requeue: the event stream has the state preempted, by Slurm" \
	grep -q '"state":"preempted".*"by":"slurm"' "$work/events.txt"
check "requeue: ... then running again" sh -c "grep -A100000 '\"state\":\"preempted\"' '$work/events.txt' | grep -q '\"state\":\"running\"'"
curl -sf "$url/jobs/$requeued/logs" >"$work/requeued.log"
check "requeue: the log says Slurm preempted it and started it again" \
	sh -c "grep -q 'preempted by Slurm: Slurm job' '$work/requeued.log' && grep -q 'Slurm started job .* again' '$work/requeued.log'"

check "USR1: completed after one restart" wait_for 240 "$warned" \
	'd["state"]=="completed" and d["info"].get("slurm_restarts")=="1"'
check "USR1: the worker checkpointed and the script requeued" sh -c "$(declare -f slurm_out); work=$work; slurm_out $warned | grep -q 'checkpointed for the time limit in .* s after USR1; requeueing'"
# S, the lead of --signal=B:USR1@S, must cover the step in progress and the
# checkpoint: here measured from USR1 to the end of both ranks.
took=$(slurm_out "$warned" | sed -n 's/.*checkpointed for the time limit in \([0-9.]*\) s after USR1.*/\1/p' | head -n 1)
echo "slurm.sh: USR1 to the end of a $tasks-rank worker: ${took:-?} s (the lead S for a 10 minute limit: 120 s)"
check "USR1: the checkpoint took ${took:-?} s, within the lead S (120 s)" awk -v t="${took:-999}" 'BEGIN { exit !(t > 0 && t < 120) }'
check "USR1: the model is the local run's bits" test "$(model_sha "$warned")" = "$ref"
check "USR1: the job was preempted by Slurm" sh -c "curl -sf '$url/jobs/$warned/logs' | grep -q 'preempted by Slurm'"

# ---- the daemon restarts while the Slurm job runs ----
followed=$(submit)
mid_run "$followed" >/dev/null
stop_daemon
sid=$(cat "$work/state/slurm/job-$followed/slurm_job_id")
check "restart: the Slurm job runs on without the daemon" sh -c "scontrol show job -o $sid | grep -Eq 'JobState=(RUNNING|COMPLETING|COMPLETED)'"
# Restarted on the port it had, with its URL as the nodes reach it: the
# jobs submitted from now on report over the API (docs/slurm.md).
port=${url##*:}
start_daemon --listen "127.0.0.1:$port" --report-url "http://127.0.0.1:$port"
check "restart: the job is followed again and completes" wait_for 240 "$followed" 'd["state"]=="completed"'
check "restart: the log says so" sh -c "curl -sf '$url/jobs/$followed/logs' | grep -q 'following Slurm job $sid again'"
check "restart: the model (1 task) is the local run's bits" test "$(model_sha "$followed")" = "$ref"

# ---- reports over the API (report-url): the worker in a node-local
# folder ----
reported=$(submit "$work/job2.json")
moved=$(submit "$work/job2.json")
rdir="$work/state/slurm/job-$reported"
mdir="$work/state/slurm/job-$moved"
# The token file, read as soon as it is there (it goes as the job ends).
for _ in $(seq 300); do [ -s "$rdir/report.token" ] && break; sleep 0.1; done
mode=$(stat -c %a "$rdir/report.token" 2>/dev/null)
token=$(cat "$rdir/report.token" 2>/dev/null)
rsid=$(cat "$rdir/slurm_job_id" 2>/dev/null)
# Requeued once its worker has uploaded its first periodic checkpoint
# (step 50): the next start, which has no other, fetches it (or the one
# the worker took on TERM, uploaded as it ended).
for _ in $(seq 1200); do [ -s "$mdir/checkpoint.safetensors" ] && [ -s "$mdir/slurm_job_id" ] && break; sleep 0.1; done
msid=$(cat "$mdir/slurm_job_id" 2>/dev/null)
node_outs+=("$(node_out "$reported" "$rsid")" "$(node_out "$moved" "$msid")")
scontrol requeue "$msid"
check "report: the token file is 0600 ($mode)" test "$mode" = 600
check "report: live progress with total_steps, from rank 0's reports" wait_for 120 "$reported" \
	'd["state"]=="running" and d["progress"]["total_steps"]==378 and d["progress"]["step"]>0'
# The mark is written just after the first report's progress is shown.
check "report: the worker reported (the folder's mark)" \
	sh -c "for i in \$(seq 100); do test -e '$rdir/reported' && exit 0; sleep 0.1; done; exit 1"
check "report: completed" wait_for 240 "$reported" 'd["state"]=="completed" and d["progress"]["total_steps"]==378'
check "report: the model of $tasks tasks is the local run's bits" test "$(model_sha "$reported")" = "$ref"
n=$(curl -sf "$url/jobs/$reported/metrics?names=loss&max_points=100000" |
	python3 -c 'import json,sys; print(len(json.load(sys.stdin)["series"]["loss"]["steps"]))')
check "report: every loss point once ($n of $ref_losses)" test "$n" = "$ref_losses"
check "report: the token is revoked (its file gone)" test ! -e "$rdir/report.token"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$url/jobs/$reported/report" -H 'Content-Type: application/json' \
	-H "Authorization: Bearer $token" --data-binary '{"progress": {"step": 1}}')
check "report: a revoked token is a 401" test "$code" = 401
check "report: the token is in no log or Slurm output" sh -c "test -n '$token' && ! grep -rqF -- '$token' '$work/daemon.log' '${node_outs[0]}'"
check "report: Slurm's output is on the node's /tmp" test -s "${node_outs[0]}"
# What the job's folder may hold: the daemon's own files (the spec, the
# script, the token and Slurm job id while it runs, the mark) and what the
# worker uploaded or reported (weights, checkpoint, summary).
only_daemon_files() {
	local f bad=
	for f in "$1"/*; do
		case "${f##*/}" in
		job.json | job.sh | report.token | slurm_job_id | reported | summary.json | model.safetensors | checkpoint.safetensors) ;;
		*) bad="$bad ${f##*/}" ;;
		esac
	done
	[ -z "$bad" ] || { echo "the worker wrote into $1:$bad" >&2; return 1; }
}
check "node-local: the worker wrote nothing into the job's folder" only_daemon_files "$rdir"
check "node-local: the worker uploaded a periodic checkpoint mid-run" test -s "$mdir/checkpoint.safetensors"
check "node-local: the requeued job completed after one restart" wait_for 240 "$moved" \
	'd["state"]=="completed" and d["info"].get("slurm_restarts")=="1"'
check "node-local: its second start resumed from the checkpoint fetched over the API" \
	grep -q "start 1: run --resume /.*($tasks tasks" "${node_outs[1]}"
check "node-local: the requeued job's model is the local run's bits" test "$(model_sha "$moved")" = "$ref"
check "node-local: ... and it wrote nothing into the job's folder" only_daemon_files "$mdir"

# ---- bad resources ----
code=$(curl -s -o "$work/bad.json" -w '%{http_code}' -X POST "$url/jobs" -H 'Content-Type: application/json' \
	--data-binary "$(sed 's/"00:10:00"/"10 minutes"/' "$work/job.json")")
check "a bad time_limit is a 400" test "$code" = 400
check "... naming /resources/time_limit" has "$work/bad.json" '/resources/time_limit'
code=$(curl -s -o "$work/bad.json" -w '%{http_code}' -X POST "$url/jobs" -H 'Content-Type: application/json' \
	--data-binary '{"model": {"layers": [{"type": "dense", "units": 2}]}, "data": {"train": {"format": "synthetic", "samples": 8, "features": 2, "classes": 2}}, "batch_size": 4, "optimizer": {"type": "sgd", "lr": 0.1}, "resources": {"partition": "gpu"}}')
check "a Slurm key with the local allocator is a 400" test "$code" = 400
check "... naming /resources/partition" has "$work/bad.json" '/resources/partition'
code=$(curl -s -o "$work/bad.json" -w '%{http_code}' -X POST "$url/jobs" -H 'Content-Type: application/json' \
	--data-binary "$(sed 's/, "exact": true//; s/"tasks_per_node": 1/"tasks_per_node": 2/' "$work/job.json")")
check "2 tasks without exact mode are a 400" test "$code" = 400
check "... naming /resources/tasks_per_node" has "$work/bad.json" '/resources/tasks_per_node'

finish
