#!/usr/bin/env bash
# `trainctl manifest --kubernetes` (docs/clusters.md, "Kubernetes"): each
# spec of tests/k8s/specs against its golden manifest, the structure
# check of tests/k8s/check_manifest.py on each (YAML and JSON forms), the
# checker's own self-test (broken manifests must be caught), and bad
# input: exit 2 with the flag or the spec's JSON pointer named.  Then the
# pods' script of a one-process manifest runs here as pod 0 would (in a
# folder standing for the data volume, with the ConfigMap's files): it
# completes; stopped by TERM mid-run it exits 75 with a checkpoint, and
# run again it resumes to the same model.safetensors bits.
# Last, two pods of a two-process manifest, simulated on this machine: each
# a mount and UTS namespace (its own /tmp, the pod's hostname NAME-I)
# running the pod script with the Job's environment; ssh and sshd are
# stand-ins (fakebin/ssh, sim-sshd) that run a command in the named pod's
# namespaces.  Pod 0 must wait for pod 1, and its mpirun must start a rank
# in each pod by the hostfile's DNS names (orted through the ssh
# stand-in), to the bits of one process; pod 0 then tells pod 1, which
# must exit 0.  Needs root, unshare, nsenter and the MPI module; skipped
# (said so) without them.
# No cluster is needed or contacted; Kubernetes, real sshd and pods on
# several machines are not.
# Usage: manifest.sh TRAINCTL TRAINERD   (from the repository root)
# TR_UPDATE_GOLDEN=1 rewrites the golden files from the current output
# (then read the diff before committing it).
set -u
TRAINCTL=$(realpath "${1:?usage: manifest.sh TRAINCTL TRAINERD}")
TRAINERD=$(realpath "${2:?usage: manifest.sh TRAINCTL TRAINERD}")
here=$(dirname "${BASH_SOURCE[0]}")
check=(/usr/bin/python3 "$here/check_manifest.py")
work=$(mktemp -d)
pod_pid=
sim=
# The simulated pods are ended with KILL: TERM would make a worker pod
# signal the trainerd processes it sees, and outside a pod's own PID
# namespace that is every one of the machine.
cleanup() {
	[ -n "$pod_pid" ] && kill "$pod_pid" 2>/dev/null
	if [ -n "$sim" ]; then
		for f in "$sim"/pid.* "$sim"/hosts/*; do
			[ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
		done
		rm -rf "$sim"
	fi
	rm -rf "$work"
}
trap cleanup EXIT
if ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
	echo "SKIP: Debian's python3-yaml is missing (scripts/install-deps.sh installs it)"
	exit 77
fi
failures=0
fail() {
	echo "FAIL: $*"
	failures=$((failures + 1))
}

# golden NAME ARGS...: specs/NAME.json with ARGS against golden/NAME.yaml
golden() {
	local name=$1
	shift
	local out=$work/$name.yaml
	if ! "$TRAINCTL" manifest --kubernetes "$@" "$here/specs/$name.json" >"$out" 2>"$work/err"; then
		fail "$name: exit $?: $(cat "$work/err")"
		return
	fi
	"$TRAINCTL" manifest --kubernetes --format json "$@" "$here/specs/$name.json" >"$work/$name.json" ||
		fail "$name: --format json failed"
	if [ "${TR_UPDATE_GOLDEN:-}" = 1 ]; then
		cp "$out" "$here/golden/$name.yaml"
		echo "updated $here/golden/$name.yaml"
	elif ! diff -u "$here/golden/$name.yaml" "$out"; then
		fail "$name: the manifest differs from golden/$name.yaml (TR_UPDATE_GOLDEN=1 rewrites it)"
	fi
	"${check[@]}" "$out" "$work/$name.json" || fail "$name: the structure check failed"
	echo "ok: $name"
}
golden one-pod --image registry.example/ml/trainerd:1
golden gpu-pod --image registry.example/ml/trainerd:1 --gpus-per-pod 2 --namespace vision --data-volume vision-data
golden four-ranks --image registry.example/ml/trainerd:1 --name fmnist4 --namespace vision --ssh-secret fmnist-ssh

# The checker catches each broken copy of a valid manifest.
for name in one-pod four-ranks; do
	"${check[@]}" --selftest "$work/$name.yaml" >"$work/selftest" || {
		cat "$work/selftest"
		fail "$name: the checker's self-test"
	}
done

# The default image is this version's; the default name the spec's.
version=$("$TRAINCTL" --version | awk '{print $2}')
"$TRAINCTL" manifest --kubernetes - <"$here/specs/one-pod.json" >"$work/default.yaml" || fail "spec from stdin"
grep -q "image: \"trainerd:$version\"" "$work/default.yaml" || fail "the default image is not trainerd:$version"
grep -q "^  name: synthetic-mlp$" "$work/default.yaml" || fail "the default name is not the spec's, as a DNS label"
grep -q "claimName: trainerd-data$" "$work/default.yaml" || fail "the default data volume is not trainerd-data"

# bad NAME WANT ARGS...: exit 2 and WANT (a fixed string) on stderr
bad() {
	local what=$1 want=$2
	shift 2
	"$TRAINCTL" manifest "$@" >"$work/out" 2>"$work/err"
	local rc=$?
	if [ "$rc" != 2 ]; then
		fail "$what: exit $rc, want 2 ($(cat "$work/err"))"
	elif ! grep -qF -- "$want" "$work/err"; then
		fail "$what: stderr does not name '$want': $(cat "$work/err")"
	elif [ -s "$work/out" ]; then
		fail "$what: printed a manifest anyway"
	else
		echo "ok: $what: $(head -n 1 "$work/err")"
	fi
}
spec=$here/specs/one-pod.json
# edit OUT PYTHON: the spec one-pod.json as d, changed by PYTHON, into OUT
edit() {
	/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(d, open(sys.argv[2], "w"))' "$spec" "$work/$1" "$2"
}
edit noproc.json 'del d["processes"]'
edit badlr.json 'd["optimizer"]["lr"] = -1'
edit upload.json 'd["data"]["train"] = {"format": "csv", "path": "dataset:digits/train.csv", "label": -1}'
edit inexact.json 'd["processes"] = 2'
edit two.json 'd.update(processes=2, exact=True)'
edit slurm.json 'd["resources"] = {"allocator": "slurm"}'
bad "unknown flag" "--frobnicate" --kubernetes --frobnicate "$spec"
bad "no --kubernetes" "--kubernetes" "$spec"
bad "a flag without its value" "--image" --kubernetes "$spec" --image
bad "spec without processes" "/processes" --kubernetes "$work/noproc.json"
bad "invalid spec" "/optimizer/lr" --kubernetes "$work/badlr.json"
bad "several processes without exact mode" "/processes" --kubernetes "$work/inexact.json"
bad "a daemon's dataset" "/data/train/path" --kubernetes "$work/upload.json"
bad "the slurm allocator" "/resources/allocator" --kubernetes "$work/slurm.json"
bad "a name that is no DNS label" "--name" --kubernetes --name Big_Job "$spec"
bad "a bad namespace" "--namespace" --kubernetes --namespace "-x" "$spec"
bad "a bad volume name" "--data-volume" --kubernetes --data-volume "my volume" "$spec"
bad "a bad GPU count" "--gpus-per-pod" --kubernetes --gpus-per-pod many "$spec"
bad "GPUs for CPU ranks" "--gpus-per-pod" --kubernetes --gpus-per-pod 1 "$work/two.json"
bad "a CUDA spec without GPUs" "--gpus-per-pod" --kubernetes "$here/specs/gpu-pod.json"
bad "too few GPUs for the devices" "--gpus-per-pod" --kubernetes --gpus-per-pod 1 "$here/specs/gpu-pod.json"
bad "an image with a space" "--image" --kubernetes --image "a b" "$spec"
bad "a bad format" "--format" --kubernetes --format toml "$spec"
"$TRAINCTL" manifest --kubernetes "$work/missing.json" >/dev/null 2>&1
[ $? = 5 ] || fail "a missing spec file: exit status is not 5"

# bash completion of the command and its options
comp() { # comp WORDS...: the completions of the last word
	bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _trainctl; echo "${COMPREPLY[*]}"' \
		_ cli/trainctl.bash-completion "$@"
}
[ "$(comp trainctl mani)" = manifest ] || fail "completion of manifest"
[ "$(comp trainctl manifest --kub)" = --kubernetes ] || fail "completion of --kubernetes"
[ "$(comp trainctl manifest --format y)" = yaml ] || fail "completion of --format yaml"

# The pod script, run as pod 0 of a one-process Job: the ConfigMap's files
# in conf/, the working directory standing for the data volume.
edit run.json 'd.update(epochs=3, data={"train": dict(d["data"]["train"], samples=2048, load_cost_us=300)},
	checkpoint={"every_steps": 5}); d["model"]["layers"][0]["units"] = 8'
"$TRAINCTL" manifest --kubernetes --name run "$work/run.json" >"$work/run.yaml" || fail "the run manifest"
mkdir -p "$work/conf" "$work/vol1" "$work/vol2"
/usr/bin/python3 -c 'import sys, yaml
cm = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap")
for k, v in cm["data"].items():
    open(sys.argv[2] + "/" + k, "w").write(v)' "$work/run.yaml" "$work/conf"
bin=$(dirname "$TRAINERD")
# pod0 DIR: the script as pod 0 in DIR (a subshell that becomes sh, so
# that $! of `pod0 DIR &` is the script's own pid)
pod0() { cd "$1" && exec env PATH="$bin:$PATH" JOB_COMPLETION_INDEX=0 sh "$work/conf/pod.sh"; }
(pod0 "$work/vol1") >"$work/pod1.log" 2>&1
rc=$?
out1=$work/vol1/trainerd/run
if [ "$rc" != 0 ] || ! grep -q '"state": "completed"' "$out1/summary.json" 2>/dev/null; then
	fail "pod 0 did not complete the job (exit $rc): $(tail -n 3 "$work/pod1.log")"
else
	echo "ok: pod 0 ran the job to its end"
fi
# TERM (an eviction) once the first checkpoint is there: a stop, exit 75
(pod0 "$work/vol2") >"$work/pod2.log" 2>&1 &
pod_pid=$!
out2=$work/vol2/trainerd/run
for _ in $(seq 300); do
	[ -f "$out2/checkpoint.safetensors" ] && break
	sleep 0.05
done
kill -TERM "$pod_pid"
wait "$pod_pid"
rc=$?
pod_pid=
if [ "$rc" != 75 ] || ! grep -q '"state": "stopped"' "$out2/summary.json" 2>/dev/null; then
	fail "pod 0 sent TERM: exit $rc, want 75 with a stopped summary: $(tail -n 3 "$work/pod2.log")"
else
	echo "ok: TERM stopped pod 0 with a checkpoint (exit 75)"
fi
(pod0 "$work/vol2") >"$work/pod3.log" 2>&1
rc=$?
if [ "$rc" != 0 ] || ! grep -q "trainerd run --resume" "$work/pod3.log"; then
	fail "a new pod 0 did not resume (exit $rc): $(head -n 3 "$work/pod3.log")"
elif ! cmp -s "$out1/model.safetensors" "$out2/model.safetensors"; then
	fail "the resumed job's model.safetensors differs from the uninterrupted one's"
else
	echo "ok: a new pod 0 resumed to the uninterrupted model's bits"
fi

# Two pods, simulated (see the top).  Their folder is not under /tmp,
# which each pod replaces with its own.
edit two.json 'd.update(name="two", epochs=2, exact=True, processes=2,
	data={"train": dict(d["data"]["train"], samples=2048)}); d["model"]["layers"][0]["units"] = 8; del d["checkpoint"]'
mpi_module=$(dirname "$TRAINERD")/trainerd-mpi.so
if [ "$(id -u)" != 0 ] || ! command -v unshare nsenter mpirun >/dev/null || [ ! -f "$mpi_module" ]; then
	echo "SKIP (part): two simulated pods need root, unshare, nsenter, mpirun and $mpi_module"
elif ! unshare -m true 2>/dev/null; then
	echo "SKIP (part): two simulated pods: unshare -m is not allowed here"
else
	. "$here/../e2e/mpi_sanitizer_env.sh"
	sim=$(mktemp -d -p /var/tmp)
	mkdir -p "$sim/conf" "$sim/hosts" "$sim/vol"
	"$TRAINCTL" manifest --kubernetes "$work/two.json" >"$work/two.yaml" || fail "the two-pod manifest"
	# the ConfigMap's files, and the container's environment as NAME=VALUE lines
	/usr/bin/python3 -c 'import shlex, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cm = next(d for d in docs if d["kind"] == "ConfigMap")
for k, v in cm["data"].items():
    open(sys.argv[2] + "/" + k, "w").write(v)
job = next(d for d in docs if d["kind"] == "Job")
with open(sys.argv[3], "w") as f:
    for e in job["spec"]["template"]["spec"]["containers"][0]["env"]:
        f.write("export %s=%s\n" % (e["name"], shlex.quote(e["value"])))' "$work/two.yaml" "$sim/conf" "$sim/env"
	# sim_pod INDEX: the pod script as that pod, in its own mount namespace
	sim_pod() {
		local host
		host=$(sed -n "$(($1 + 1))p" "$sim/conf/hostfile" | cut -d' ' -f1)
		exec unshare -m -u --propagation private sh -c '
			sim=$1 here=$2 bin=$3
			hostname "${4%%.*}" || exit 99
			# a pod has a /tmp of its own; the checkout and build, which a
			# clone under /tmp puts there, stay where they are
			keep=$sim/host-tmp.$5
			mkdir -p "$keep" && mount --rbind /tmp "$keep" || exit 99
			mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /usr/sbin || exit 99
			for p in "$here" "$bin"; do
				case $p in /tmp/*) mkdir -p "$p" && mount --bind "$keep${p#/tmp}" "$p" || exit 99 ;; esac
			done
			cp "$here/sim-sshd" /usr/sbin/sshd || exit 99
			cd "$sim/vol" || exit 99
			. "$sim/env"
			# the ConfigMap is not at /etc/trainerd here
			export OMPI_MCA_orte_default_hostfile="$sim/conf/hostfile"
			export PATH="$here/fakebin:$bin:$PATH" SIM_HOSTS="$sim/hosts" SIM_POD="$4" JOB_COMPLETION_INDEX="$5"
			exec sh "$sim/conf/pod.sh"' _ "$sim" "$(realpath "$here")" "$(dirname "$TRAINERD")" "$host" "$1"
	}
	(sim_pod 0) >"$sim/pod0.log" 2>&1 &
	echo $! >"$sim/pid.0"
	# pod 1 comes up later: once pod 0's own sshd is there, pod 0 must
	# still wait (longer than its 2 s between tries) for pod 1's
	host0=$(head -n 1 "$sim/conf/hostfile" | cut -d' ' -f1)
	for _ in $(seq 100); do
		[ -s "$sim/hosts/$host0" ] && break
		sleep 0.1
	done
	sleep 3
	grep -q "trainerd: pod 0 of 2" "$sim/pod0.log" && fail "two pods: pod 0 started the job before pod 1 was up"
	(sim_pod 1) >"$sim/pod1.log" 2>&1 &
	echo $! >"$sim/pid.1"
	rc0=timeout rc1=timeout
	for _ in $(seq 600); do
		if [ "$rc0" = timeout ] && ! kill -0 "$(cat "$sim/pid.0")" 2>/dev/null; then
			wait "$(cat "$sim/pid.0")"
			rc0=$?
		fi
		if [ "$rc1" = timeout ] && ! kill -0 "$(cat "$sim/pid.1")" 2>/dev/null; then
			wait "$(cat "$sim/pid.1")"
			rc1=$?
		fi
		[ "$rc0" != timeout ] && [ "$rc1" != timeout ] && break
		sleep 0.1
	done
	out=$sim/vol/trainerd/two
	(cd "$sim/vol" && "$TRAINERD" run "$sim/conf/job.json" --processes 1 --out "$sim/one" >/dev/null 2>&1) ||
		fail "the one-process run of the two-pod spec"
	if [ "$rc0" != 0 ] || [ "$rc1" != 0 ]; then
		fail "two pods: pod 0 exit $rc0, pod 1 exit $rc1 (0 and 0 wanted): $(tail -n 3 "$sim/pod0.log") / $(tail -n 3 "$sim/pod1.log")"
	elif ! grep -q '"processes": 2' "$out/summary.json"; then
		fail "two pods: the job did not run as two processes: $(cat "$out/summary.json")"
	elif ! cmp -s "$out/model.safetensors" "$sim/one/model.safetensors"; then
		fail "two pods: model.safetensors differs from one process's"
	else
		echo "ok: two simulated pods: pod 0 waited for pod 1, mpirun ran a rank in each to one process's bits, both exited 0"
	fi
fi

if [ "$failures" != 0 ]; then
	echo "$failures check(s) failed"
	exit 1
fi
echo "all manifest checks passed"
