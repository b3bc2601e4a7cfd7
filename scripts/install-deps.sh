#!/usr/bin/env bash
# Installs the Debian packages trainerd needs to build and test, only those
# that are missing.  Uses sudo when not run as root.  Extra package names
# given as arguments are installed too (the benchmarks add python3-torch).
set -euo pipefail

packages=(
	gcc pkg-config meson ninja-build python3 python3-yaml python3-jsonschema python3-numpy
	libopenblas-dev libjansson-dev libcriterion-dev
	libsqlite3-dev libmicrohttpd-dev libcurl4-openssl-dev libsystemd-dev
	systemd openssl curl clang
	"$@"
)

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
	sudo="sudo"
fi
echo "installing: ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
