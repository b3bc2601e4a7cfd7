#!/usr/bin/env bash
# trainctl against a live daemon: every command, the exit codes, watch
# through a completed, a failed and a cancelled job and across a daemon
# restart, and downloads (verified, resumed, a corrupted one refused).
# Usage: trainctl.sh TRAINERD TRAINCTL   (run from the repository root)
# Loopback only; every wait is bounded.
set -u
TRAINERD=$(realpath "${1:?usage: trainctl.sh TRAINERD TRAINCTL}")
TRAINCTL=$(realpath "${2:?usage: trainctl.sh TRAINERD TRAINCTL}")
work=$(mktemp -d)
completion=$(realpath cli/trainctl.bash-completion)
daemon_pid=
cleanup() {
	[ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
count() { grep -c -- "$2" "$1" || true; }      # count FILE PATTERN
tc() { "$TRAINCTL" "$@"; }

# start [PORT]: the daemon on loopback (ephemeral port unless given).
start() {
	rm -f "$work/state/listen.addr"
	"$TRAINERD" serve --listen "127.0.0.1:${1:-0}" --state-dir "$work/state" --data-root "$work/state" \
		--cpu-devices 2 --backend cpu >>"$work/daemon.log" 2>&1 &
	daemon_pid=$!
	for _ in $(seq 150); do
		[ -s "$work/state/listen.addr" ] && break
		sleep 0.1
	done
	export TRAINERD_URL
	TRAINERD_URL=$(cat "$work/state/listen.addr")
}
stop() {
	kill "$daemon_pid"
	wait "$daemon_pid"
	daemon_pid=
}
# wait_state ID STATE: polls `show` for up to 60 s.
wait_state() {
	for _ in $(seq 600); do
		tc show "$1" 2>/dev/null | grep -q "^state  *$2\$" && return 0
		sleep 0.1
	done
	return 1
}
mkdir -p "$work/state"
start
[ -n "$TRAINERD_URL" ] || { echo "trainerd did not start" >&2; cat "$work/daemon.log" >&2; exit 1; }

cat >"$work/small.json" <<'JSON'
{"name": "small", "seed": 4,
 "model": {"layers": [{"type": "dense", "units": 16}, {"type": "relu"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 3000, "features": 5, "classes": 3, "load_cost_us": 100},
          "validation_split": 0.2},
 "batch_size": 32, "epochs": 3, "optimizer": {"type": "adamw", "lr": 0.01},
 "checkpoint": {"every_steps": 50, "keep": 2}}
JSON
# Long enough to still run when the test acts on it (~10 s), short to finish.
sed -e 's/"small"/"long"/' -e 's/"load_cost_us": 100/"load_cost_us": 1500/' -e 's/"epochs": 3/"epochs": 4/' \
	"$work/small.json" >"$work/long.json"
cat >"$work/diverges.json" <<'JSON'
{"name": "diverges", "seed": 1,
 "model": {"layers": [{"type": "dense", "units": 16}, {"type": "relu"}, {"type": "dense", "units": 1}], "loss": "mse"},
 "data": {"train": {"format": "synthetic", "task": "regression", "samples": 3000, "features": 5}},
 "batch_size": 32, "epochs": 5, "optimizer": {"type": "sgd", "lr": 1e30}}
JSON

# ---- help, usage, unreachable ----
tc --help >"$work/o" 2>&1
check "--help exits 0" test $? -eq 0
check "--help lists exit codes" has "$work/o" "daemon cannot be reached"
for c in submit ls show watch stop cancel pause resume delete priority metrics logs checkpoints download upload datasets rm-dataset devices version; do
	tc "$c" --help >"$work/o" 2>&1
	check "$c --help exits 0 with usage" test $? -eq 0 -a -n "$(grep "usage: trainctl .*$c" "$work/o")"
done
tc frobnicate >/dev/null 2>"$work/e"
check "unknown command exits 2" test $? -eq 2
tc show abc >/dev/null 2>"$work/e"
check "bad id exits 2" test $? -eq 2
check "bad id message" has "$work/e" "not a job id: abc"
# show, logs and checkpoints read one job id and one flag alike
tc checkpoints >/dev/null 2>"$work/e"
check "no id exits 2" test $? -eq 2
check "no id message" has "$work/e" "checkpoints: expects one job id"
tc show 1 2 >/dev/null 2>"$work/e"
check "two ids exit 2" test $? -eq 2
tc logs --json 1 >/dev/null 2>"$work/e"
check "another command's flag exits 2" test $? -eq 2
check "unknown option message" has "$work/e" "trainctl logs: unknown option"
tc metrics --format xml 1 >/dev/null 2>&1
check "bad --format exits 2" test $? -eq 2
tc --url http://127.0.0.1:1 ls >/dev/null 2>"$work/e"
check "unreachable exits 3" test $? -eq 3
check "unreachable names the URL" has "$work/e" "cannot reach the daemon at http://127.0.0.1:1"
check "unreachable is one line" test "$(wc -l <"$work/e")" -eq 1
TRAINERD_URL=http://127.0.0.1:1 tc version >/dev/null 2>"$work/e"
check "TRAINERD_URL is read" has "$work/e" "127.0.0.1:1"

# ---- version, devices ----
tc version >"$work/o"
check "version exits 0" test $? -eq 0
check "version names client and daemon" test "$(grep -c '^trainctl \|^trainerd ' "$work/o")" -eq 2
tc devices >"$work/o"
check "devices table" test "$(grep -c ' cpu ' "$work/o")" -eq 2

# ---- submit, idempotency, watch through a completed job ----
id=$(tc submit "$work/small.json")
check "submit prints an id" test "$id" -ge 1 2>/dev/null
again1=$(tc submit --idempotency-key k-42 "$work/small.json")
again2=$(tc submit --idempotency-key k-42 - <"$work/small.json")
check "the same idempotency key gives the same job" test "$again1" = "$again2"
tc watch "$id" >"$work/watch.out" 2>"$work/watch.err"
check "watch of a completed job exits 0" test $? -eq 0
check "watch prints the end" has "$work/watch.out" "^job $id completed"
check "watch piped prints progress lines" has "$work/watch.out" "^step [0-9]*/225 "
check "watch piped has no control characters" test "$(count "$work/watch.out" $'\r')" -eq 0
tc watch "$id" >"$work/o" 2>&1
check "watch of a finished job replays and exits 0" test $? -eq 0
wait_state "$again1" completed

# ---- ls, show ----
tc ls >"$work/o"
check "ls exits 0" test $? -eq 0
check "ls has a header" has "$work/o" "^ID  NAME"
check "ls lists the job" test "$(grep -c ' small ' "$work/o")" -eq 2
check "ls heads whole-run figures" has "$work/o" "EPOCH LOSS  SAMPLES/S"
# A completed job's listed loss and samples/s are the summary's whole-run
# figures (the newest epoch's mean loss), not its last step's.
tc show --json "$id" >"$work/j"
want=$(python3 -c "import json; s=json.load(open('$work/j'))['summary']; print('%.4f %.0f' % (s['epoch_loss'], s['samples_per_sec']))")
check "ls shows the summary's epoch loss and samples/s ($want)" test -n "$(grep "^ *$id .* ${want% *} *${want#* } " "$work/o")"
tc show "$id" >"$work/o2"
check "show has the epoch loss" has "$work/o2" "^epoch loss  *${want% *}\$"
tc ls --json >"$work/o"
check "ls --json is JSON" python3 -c "import json,sys; j=json.load(open('$work/o')); assert len(j)==2"
tc ls --state running >"$work/o"
check "ls --state filters" test "$(grep -c ' small ' "$work/o")" -eq 0
tc show "$id" >"$work/o"
check "show prints the state" has "$work/o" "^state  *completed"
tc show --json "$id" >"$work/o"
check "show --json has the spec" python3 -c "import json; assert json.load(open('$work/o'))['spec']['name']=='small'"
tc show 9999 >/dev/null 2>"$work/e"
check "show of an unknown job exits 4" test $? -eq 4
check "HTTP errors print the daemon's message" has "$work/e" "HTTP 404: job 9999 not found"

# ---- metrics, logs, checkpoints ----
tc metrics "$id" --names loss >"$work/o"
check "metrics csv header" test "$(head -1 "$work/o")" = "name,step,epoch,value"
check "metrics csv has every loss point" test "$(grep -c '^loss,' "$work/o")" -eq 225
tc metrics "$id" --names loss,val_loss --max-points 10 --format json >"$work/o"
check "metrics json downsampled" python3 -c "
import json; s=json.load(open('$work/o'))['series']; assert set(s)=={'loss','val_loss'}, s; assert len(s['loss']['steps'])<=10"
tc metrics "$id" --max-points -3 >/dev/null 2>"$work/e"
check "a bad query is the daemon's 400 (exit 4)" test $? -eq 4
tc logs "$id" >"$work/o"
check "logs" has "$work/o" "checkpoint at step 225 (final)"
timeout 20 "$TRAINCTL" logs -f "$id" >"$work/o"
check "logs -f of a finished job ends, exit 0" test $? -eq 0
check "logs -f prints lines once" test "$(count "$work/o" " submitted$")" -eq 1
tc checkpoints "$id" >"$work/o"
# keep 2: the final one and the newest periodic one (a periodic checkpoint
# that finds the previous one still being written is skipped, so which
# one depends on timing)
check "checkpoints table" test "$(grep -c '^ *[0-9][0-9]*  *[0-9]  *[0-9.]* kB ' "$work/o")" -eq 2
check "checkpoints lists the final one" grep -q '^ *225 ' "$work/o"
older=$(awk 'NR == 3 {print $1}' "$work/o")

# ---- download: verified, by step, resumed, corrupted ----
cd "$work" || exit 1
tc download "$id" >"$work/o"
check "download latest exits 0" test $? -eq 0
f=job-$id-step-225-checkpoint.safetensors
sha=$(tc checkpoints "$id" | awk '$1 == 225 {print $NF}')
check "download writes the file" test -s "$f"
check "the file's SHA-256 is the listed one" test "$(sha256sum "$f" | cut -d' ' -f1)" = "$sha"
tc download "$id" "$older" -o by-step.safetensors >/dev/null
check "download by step" test -s by-step.safetensors
size=$(stat -c %s "$f")
head -c $((size / 2)) "$f" >resumed.safetensors.part
tc -v download "$id" latest -o resumed.safetensors >/dev/null 2>"$work/e"
check "a partial download resumes" has "$work/e" "resuming resumed.safetensors.part at byte $((size / 2))"
check "the resume asks for a range" has "$work/e" "< 206"
check "the resumed file is whole" cmp -s "$f" resumed.safetensors
check "the part is gone" test ! -e resumed.safetensors.part
tc download "$id" --weights -o w.safetensors >"$work/o"
check "download --weights" has "$work/o" "weights of step 225"
# the daemon's Range handling itself
u="$TRAINERD_URL/jobs/$id/checkpoints/225/checkpoint.safetensors"
check "a range past the end is 416" test "$(curl -s -o /dev/null -w '%{http_code}' -H 'Range: bytes=99999999-' "$u")" = 416
curl -s -D hdr -o tail.bin -H 'Range: bytes=-10' "$u"
check "a suffix range is the file's tail" cmp -s tail.bin <(tail -c 10 "$f")
check "206 names the range" grep -qi "^Content-Range: bytes $((size - 10))-$((size - 1))/$size" hdr
curl -s -o other.bin -H 'Range: bytes=10-' -H 'If-Range: "0000"' "$u"
check "If-Range of another file sends it whole" cmp -s other.bin "$f"
curl -s -o two.bin -H 'Range: bytes=0-1,5-6' "$u"
check "several ranges send the whole file" cmp -s two.bin "$f"
# a part whose bytes are not the file's: the hash check refuses it
head -c $((size / 2)) "$f" | tr '\000-\377' '\001-\377\000' >bad.safetensors.part
tc download "$id" -o bad.safetensors >/dev/null 2>"$work/e"
check "a corrupted download exits 5" test $? -eq 5
check "a corrupted download is named" has "$work/e" "SHA-256 mismatch"
check "a corrupted download leaves no file" test ! -e bad.safetensors -a ! -e bad.safetensors.part
# the stored checkpoint itself damaged: the daemon's bytes fail the check
if [ -d "$work/state/trainerd.db-checkpoints" ]; then
	# Each file is a small SQLite database whose last page holds the
	# checkpoint's bytes from its end: one byte changed there changes the
	# data, not SQLite's structure.
	for c in "$work"/state/trainerd.db-checkpoints/*; do
		printf 'X' | dd of="$c" bs=1 seek=$(($(stat -c %s "$c") - 1000)) conv=notrunc status=none
	done
	tc download "$id" -o damaged.safetensors >/dev/null 2>"$work/e"
	check "a damaged stored checkpoint is refused" test $? -eq 5 -a ! -e damaged.safetensors
fi
tc download "$id" 7 >/dev/null 2>"$work/e"
check "download of a missing step exits 4" test $? -eq 4
cd - >/dev/null || exit 1

# ---- a failed and a cancelled job ----
bad=$(tc submit "$work/diverges.json")
tc watch "$bad" >"$work/o" 2>&1
check "watch of a failed job exits 1" test $? -eq 1
check "watch prints the failure" has "$work/o" "^job $bad failed: .*step [0-9]*: the loss is"
tc submit --wait "$work/diverges.json" >"$work/o" 2>&1
check "submit --wait of a failing job exits 1" test $? -eq 1
# A spec with several problems: every one is printed, not only the first.
cat >"$work/three-bad.json" <<'JSON'
{"name": "bad", "model": {"layers": [{"type": "dense", "units": 0}]},
 "data": {"train": {"format": "synthetic", "samples": 64, "features": 2, "classes": 2}},
 "batch_size": -1, "epochs": 1, "optimizer": {"type": "sgd", "lr": -1}}
JSON
tc submit "$work/three-bad.json" >/dev/null 2>"$work/e"
check "submit of a bad spec exits 4" test $? -eq 4
for p in /model/layers/0/units /batch_size /optimizer/lr; do
	check "submit prints the problem at $p" has "$work/e" "$p"
done
# Followed from the queue, piped: the total (and so the ETA) is unknown
# until the trainer set up, and lines used to say "step 151/0 (0%) ... eta -".
tc submit --wait "$work/long.json" >"$work/o" 2>&1
check "submit --wait piped exits 0" test $? -eq 0
check "submit --wait piped prints progress" has "$work/o" "^step [0-9]*/300 "
check "submit --wait piped never shows a total of 0" test "$(count "$work/o" '^step [0-9]*/0 ')" -eq 0
check "submit --wait piped has an ETA on every line" test "$(count "$work/o" '^step .* eta -$')" -eq 0
long=$(tc submit "$work/long.json")
wait_state "$long" running
tc watch "$long" >"$work/o" 2>&1 &
watcher=$!
sleep 0.5
tc priority "$long" 5 >"$work/p"
check "priority" has "$work/p" "priority 5"
tc cancel "$long" >"$work/p"
check "cancel" has "$work/p" "cancel requested"
wait "$watcher"
check "watch of a cancelled job exits 1" test $? -eq 1
check "watch prints the cancellation" has "$work/o" "^job $long cancelled"
tc delete "$long" >"$work/p"
check "delete" has "$work/p" "job $long deleted"
tc show "$long" >/dev/null 2>&1
check "a deleted job is gone (exit 4)" test $? -eq 4
tc pause "$long" >/dev/null 2>&1
check "control of a missing job exits 4" test $? -eq 4

# ---- pause, resume, stop ----
long=$(tc submit "$work/long.json")
wait_state "$long" running
tc pause "$long" >/dev/null
check "pause" wait_state "$long" paused
tc resume "$long" >/dev/null
check "resume" wait_state "$long" running
tc stop "$long" >/dev/null
tc watch "$long" >"$work/o" 2>&1
check "a stopped job ends stopped (watch exits 0)" test $? -eq 0
check "watch prints stopped" has "$work/o" "^job $long stopped"
tc ls --state stopped >"$work/o"
check "ls --state stopped lists it" has "$work/o" "^ *$long "
tc resume --epochs 0 "$long" >/dev/null 2>"$work/e"
check "resume --epochs 0 is a usage error (exit 2)" test $? -eq 2

# ---- watch across a daemon restart ----
long=$(tc submit "$work/long.json")
wait_state "$long" running
port=${TRAINERD_URL##*:}
tc watch --reconnect-timeout 60 "$long" >"$work/w.out" 2>"$work/w.err" &
watcher=$!
for _ in $(seq 100); do
	[ -s "$work/w.out" ] && break
	sleep 0.1
done
sleep 0.5
# Experiments: submit --wait ends 0 on a completed one (its best trial
# named), 1 on one whose every trial failed (a learning rate that makes the
# loss NaN); ls and show; cancel of an ended one is the daemon's 409.
cat >"$work/exp.json" <<'JSON'
{"name": "sweep", "spec": {"seed": 2,
 "model": {"layers": [{"type": "dense", "units": 8}, {"type": "relu"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 600, "features": 5, "classes": 3}, "validation_split": 0.2},
 "batch_size": 32, "epochs": 3, "optimizer": {"type": "sgd", "lr": 0.1}},
 "search": {"method": "grid"}, "parameters": {"/optimizer/lr": {"grid": [0.3, 0.03]}}}
JSON
sed 's/\[0.3, 0.03\]/[1e30]/' "$work/exp.json" >"$work/exp-nan.json"
tc experiment submit --wait "$work/exp.json" >"$work/o" 2>"$work/e"
check "experiment submit --wait: exit 0 when completed" test $? -eq 0
check "experiment submit --wait: completed" has "$work/o" "^state  *completed"
check "experiment submit --wait: names the best trial" has "$work/o" "^best  *trial [01] (job"
exp_id=$(head -1 "$work/o")
tc experiment submit --wait "$work/exp-nan.json" >"$work/o" 2>"$work/e"
check "experiment submit --wait: exit 1 when failed" test $? -eq 1
check "experiment submit --wait: failed" has "$work/o" "^state  *failed"
tc experiment ls >"$work/o"
check "experiment ls: lists both" test "$(count "$work/o" ' grid ')" -eq 2
tc experiment show "$exp_id" >"$work/o"
check "experiment show: the trials" test "$(count "$work/o" '/optimizer/lr')" -eq 2
tc experiment cancel "$exp_id" >/dev/null 2>"$work/e"
check "experiment cancel of an ended one: exit 4" test $? -eq 4
# --priority and --preemptible reach the experiment (and so its trials).
exp_pre=$(tc experiment submit --priority 2 --preemptible "$work/exp.json")
tc experiment show "$exp_pre" >"$work/o"
check "experiment submit --preemptible: show says so" has "$work/o" "^priority  *2, preemptible$"
tc experiment cancel "$exp_pre" >/dev/null 2>&1
tc experiment frobnicate 2>/dev/null
check "experiment with an unknown subcommand: exit 2" test $? -eq 2

stop
sleep 1
start "$port"
wait "$watcher"
check "watch across a restart exits 0" test $? -eq 0
check "watch said it reconnects" has "$work/w.err" "reconnecting after event"
check "watch saw the job interrupted" has "$work/w.out" "^job $long interrupted"
check "watch followed it to completion" has "$work/w.out" "^job $long completed"
check "no event shown twice after reconnecting" test "$(count "$work/w.out" " submitted$")" -eq 1
# the daemon gone for good: watch gives up with exit 3
long=$(tc submit "$work/long.json")
wait_state "$long" running
tc watch --reconnect-timeout 1 "$long" >"$work/o" 2>"$work/e" &
watcher=$!
# stopped only once watch follows the stream (it has printed a line);
# bounded at 60 s: on a loaded machine its first line took over 10 s, and
# a daemon stopped before watch read the job is exit 3 without "giving up"
for _ in $(seq 600); do
	[ -s "$work/o" ] && break
	sleep 0.1
done
stop
wait "$watcher"
check "watch gives up on a daemon that stays away (exit 3)" test $? -eq 3
check "and says so" has "$work/e" "giving up"

# ---- bash completion (without the bash-completion package's helpers) ----
comp() { # comp WORDS...: the completions of the last word
	bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _trainctl; echo "${COMPREPLY[*]}"' \
		_ "$completion" "$@"
}
check "completion of commands" test "$(comp trainctl me)" = "metrics"
check "completion of options" test "$(comp trainctl ls --st)" = "--state"
check "completion of states" test "$(comp trainctl ls --state c)" = "completed cancelled"
check "completion of aliases" test "$(comp trainctl download 3 l)" = "latest"
check "completion of experiment subcommands" test "$(comp trainctl experiment s)" = "submit show"

# ---- tokens ----
echo "sekrit" >"$work/token"
chmod 600 "$work/token"
"$TRAINERD" serve --listen 127.0.0.1:0 --state-dir "$work/state2" --data-root "$work/state2" --cpu-devices 1 \
	--backend cpu --token sekrit >>"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 150); do
	[ -s "$work/state2/listen.addr" ] && break
	sleep 0.1
done
TRAINERD_URL=$(cat "$work/state2/listen.addr")
tc ls >/dev/null 2>"$work/e"
check "no token: exit 4" test $? -eq 4
check "no token: a hint" has "$work/e" "needs a token: set TRAINERD_TOKEN"
check "no token: one line" test "$(wc -l <"$work/e")" -eq 1
TRAINERD_TOKEN=wrong tc ls >/dev/null 2>"$work/e"
check "a wrong token: exit 4 with a hint" test $? -eq 4 -a -n "$(grep 'not valid .*check TRAINERD_TOKEN' "$work/e")"
check "a wrong token: one line" test "$(wc -l <"$work/e")" -eq 1
TRAINERD_TOKEN=sekrit tc ls >/dev/null
check "TRAINERD_TOKEN" test $? -eq 0
tc --token-file "$work/token" ls >/dev/null
check "--token-file" test $? -eq 0

# ---- upload, datasets, rm-dataset (and the write role they need) ----
stop
printf 'read:rtok\nwrite:wtok\nadmin:atok\n' >"$work/tokens"
chmod 600 "$work/tokens"
"$TRAINERD" serve --listen 127.0.0.1:0 --state-dir "$work/state3" --data-root "$work/state3" --cpu-devices 1 \
	--backend cpu --token-file "$work/tokens" >>"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 150); do
	[ -s "$work/state3/listen.addr" ] && break
	sleep 0.1
done
TRAINERD_URL=$(cat "$work/state3/listen.addr")
python3 -c "
for r in range(96): print('%d.5,%d.25,%d' % (r * 7 % 5, r * 3 % 4, r % 3))" >"$work/toy.csv"
head -c 3000000 /dev/urandom >"$work/blob.bin"
TRAINERD_TOKEN=rtok tc upload "$work/toy.csv" toy >/dev/null 2>"$work/e"
check "upload with a read token: exit 4" test $? -eq 4
check "upload with a read token: the role is named" has "$work/e" "HTTP 403.*write"
export TRAINERD_TOKEN=wtok
tc upload "$work/toy.csv" toy >"$work/o" 2>"$work/e"
check "upload exits 0" test $? -eq 0
check "upload prints the spec path and sha256sum's digest" \
	has "$work/o" "^dataset:toy/toy.csv .* sha256 $(sha256sum "$work/toy.csv" | cut -d' ' -f1)\$"
tc upload --as blob.bin "$work/blob.bin" toy >"$work/o" 2>"$work/e"
check "upload of 3 MB exits 0" test $? -eq 0
check "upload piped shows no progress bar" test "$(count "$work/e" $'\r')" -eq 0
tc datasets >"$work/o"
check "datasets lists both files" test "$(grep -c '^dataset:toy/' "$work/o")" -eq 2
check "datasets shows sha256sum's digest" has "$work/o" "$(sha256sum "$work/blob.bin" | cut -d' ' -f1)"
tc datasets --json >"$work/o"
check "datasets --json" python3 -c "import json; j=json.load(open('$work/o')); assert j['used_bytes']==$(($(stat -c %s "$work/toy.csv") + 3000000))"
tc upload "$work/toy.csv" ../etc >/dev/null 2>"$work/e"
check "upload to a name that leaves the directory: exit 2" test $? -eq 2
cat >"$work/ds.json" <<'JSON'
{"name": "from-upload", "seed": 1, "model": {"inputs": 2, "layers": [{"type": "dense", "units": 3}]},
 "data": {"train": {"format": "csv", "path": "dataset:toy/toy.csv"}}, "batch_size": 16, "epochs": 2,
 "optimizer": {"type": "sgd", "lr": 0.1}}
JSON
tc submit --wait "$work/ds.json" >"$work/o" 2>&1
check "a job trains on the uploaded file" test $? -eq 0
tc rm-dataset toy/blob.bin >/dev/null 2>"$work/e"
check "rm-dataset with a write token: exit 4 (deleting needs admin)" test $? -eq 4
export TRAINERD_TOKEN=atok
tc rm-dataset toy/blob.bin >"$work/o"
check "rm-dataset of a file exits 0" test $? -eq 0
check "rm-dataset says what it freed" has "$work/o" "deleted toy/blob.bin (3.0 MB freed)"
tc rm-dataset toy/blob.bin >/dev/null 2>"$work/e"
check "rm-dataset of a missing file: exit 4" test $? -eq 4
tc rm-dataset toy >/dev/null
check "rm-dataset of a dataset exits 0" test $? -eq 0
check "nothing is left" test "$(tc datasets | grep -c '^dataset:')" -eq 0
unset TRAINERD_TOKEN

# ---- a full disk during an upload: said as such, and not sent again ----
# The datasets directory on a 2 MiB tmpfs in a mount namespace of the
# daemon's own (unshare -m, as root); skipped where that is not allowed.
# 24 MB: past what the daemon drops after a refusal before cutting off.
stop
mkdir -p "$work/state5/datasets"
chmod 700 "$work/state5" "$work/state5/datasets"
truncate -s 24000000 "$work/big.bin"
if unshare -m --propagation private true 2>/dev/null; then
	rm -f "$work/state5/listen.addr"
	unshare -m --propagation private sh -c 'mount -t tmpfs -o size=2m,mode=0700 tmpfs "$1/datasets" &&
		exec "$2" serve --listen 127.0.0.1:0 --state-dir "$1" --data-root "$1" --cpu-devices 1 --backend cpu' \
		sh "$work/state5" "$TRAINERD" >>"$work/daemon.log" 2>&1 &
	daemon_pid=$!
	for _ in $(seq 150); do
		[ -s "$work/state5/listen.addr" ] && break
		sleep 0.1
	done
	TRAINERD_URL=$(cat "$work/state5/listen.addr")
	tc upload "$work/big.bin" full >/dev/null 2>"$work/e"
	check "upload to a full disk: exit 4" test $? -eq 4
	check "upload to a full disk: says so" has "$work/e" "the daemon's disk is full"
	check "upload to a full disk: not sent again" test "$(count "$work/e" 'sending it again')" -eq 0
	stop
else
	echo "trainctl.sh: the full-disk upload is skipped: unshare -m is not allowed here (it needs root)" >&2
fi

if [ "$fail" -ne 0 ]; then
	echo "---- daemon log ----" >&2
	tail -50 "$work/daemon.log" >&2
fi
finish
