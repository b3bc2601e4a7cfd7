#!/usr/bin/env bash
# Checks the files in systemd/: `systemd-analyze verify` on every unit
# (any warning counts as a failure: verify exits 0 on unknown keys), the
# sysusers snippet creates the user in a scratch root, and the tmpfiles
# snippet applies there with that user.
#   verify_units.sh BUILT_SERVICE SOCKET SYSUSERS TMPFILES TRAINERD
set -u
service=$1 socket=$2 sysusers=$3 tmpfiles=$4 trainerd=$5
pass=0 fail=0
ok() { echo "ok: $1"; pass=$((pass + 1)); }
bad() { echo "FAIL: $1"; fail=$((fail + 1)); }

tmp=$(mktemp -d /tmp/trainerd-units-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

if ! command -v systemd-analyze >/dev/null; then
	echo "SKIP: systemd-analyze is not installed (package systemd): units not verified"
else
	# The installed unit names the installed binary; verify checks that
	# ExecStart= exists, so point it at the built one.
	sed "s|^ExecStart=[^ ]*/trainerd |ExecStart=$trainerd |" "$service" >"$tmp/trainerd.service"
	cp "$socket" "$tmp/trainerd.socket"
	for u in trainerd.service trainerd.socket; do
		out=$(cd "$tmp" && systemd-analyze verify --man=no "./$u" 2>&1)
		rc=$?
		if [ $rc -eq 0 ] && [ -z "$out" ]; then ok "systemd-analyze verify $u"; else bad "verify $u (rc $rc): $out"; fi
	done
	# The checks are real: a misspelt key makes verify complain.
	cp "$tmp/trainerd.service" "$tmp/broken.service"
	echo "DeviceAlow=char-nvidiactl rw" >>"$tmp/broken.service"
	out=$(cd "$tmp" && systemd-analyze verify --man=no ./broken.service 2>&1)
	if [ -n "$out" ]; then ok "verify notices a misspelt key"; else bad "verify said nothing about a misspelt key"; fi
	rm -f "$tmp/broken.service"
	for key in Type=notify WatchdogSec= StateDirectory= ProtectSystem=strict ProtectHome= PrivateTmp=yes \
		NoNewPrivileges=yes CapabilityBoundingSet= RestrictAddressFamilies= SystemCallFilter=@system-service \
		UMask=0077 DevicePolicy=closed "DeviceAllow=char-nvidiactl" "DeviceAllow=char-nvidia-uvm" \
		"DeviceAllow=char-nvidia-frontend" "DeviceAllow=char-nvidia-caps" "After=.*nvidia-persistenced.service" \
		"ExecReload="; do
		if grep -q "^$key" "$service"; then ok "unit has $key"; else bad "unit lacks $key"; fi
	done
fi

if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
	root=$tmp/root
	mkdir -p "$root/etc/trainerd"
	: >"$root/etc/trainerd/tokens"
	chmod 644 "$root/etc/trainerd/tokens"
	if out=$(systemd-sysusers --root="$root" - <"$sysusers" 2>&1) && grep -q '^trainerd:' "$root/etc/passwd"; then
		ok "sysusers creates the trainerd user"
	else
		bad "sysusers: $out"
	fi
	if out=$(systemd-tmpfiles --root="$root" --create - <"$tmpfiles" 2>&1) &&
		[ "$(stat -c %a "$root/etc/trainerd/tokens")" = 600 ]; then
		ok "tmpfiles makes the token file 0600"
	else
		bad "tmpfiles: $out"
	fi
else
	echo "SKIP: systemd-sysusers/systemd-tmpfiles missing: snippets not applied"
fi

echo "RESULT: $pass passed, $fail failed"
[ $fail -eq 0 ]
