#!/usr/bin/env bash
# Installs the Debian packages trainerd needs to build and test, only those
# that are missing, then the npm packages of package.json
# (scripts/install-npm.sh: the dashboard's chart library, embedded at build
# time, and playwright-core for the browser test, which runs Debian's
# chromium).  Uses sudo when not run as root.  Extra package names given as
# arguments are installed too (the benchmarks add python3-torch, which the
# conv-net equivalence test needs too; the
# dashboard's chart benchmark libjs-dygraphs and libjs-chart.js).
set -euo pipefail

packages=(
	gcc pkg-config meson ninja-build python3 python3-yaml python3-jsonschema python3-numpy python3-torch python3-sklearn curl prometheus wrk
	libopenblas-dev libdnnl-dev libjansson-dev libcriterion-dev zlib1g-dev libpng-dev libjpeg-dev
	dataset-fashion-mnist python3-skimage
	libsqlite3-dev libmicrohttpd-dev libcurl4-openssl-dev libsystemd-dev nettle-dev
	nodejs chromium systemd openssl clang clang-format
	openmpi-bin libopenmpi-dev slurm-wlm munge
	"$@"
)
# A nodejs package that bundles npm (as nodesource's does) conflicts with
# Debian's npm package: ask for npm only when there is no npm command.
if ! command -v npm >/dev/null 2>&1; then
	packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -gt 0 ]; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		sudo="sudo"
	fi
	echo "installing: ${missing[*]}" >&2
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

"$(dirname "$0")/install-npm.sh"
