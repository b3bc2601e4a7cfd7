#!/usr/bin/env bash
# Lints openapi/openapi.yaml with Redocly CLI (the recommended ruleset,
# warnings as errors: tests/openapi/redocly.yaml).  Redocly is installed
# from the npm registry into tests/openapi/.npm (gitignored) the first time
# and reused after; the version is pinned because rules change between
# releases.  No npm or no registry is a failure, not a skip: CI must lint.
# Prints "RESULT: 1 passed, 0 failed" or "RESULT: 0 passed, 1 failed".
set -uo pipefail

REDOCLY_VERSION=2.77.0 # needs Node.js >= 20.19 (20.x) or >= 22.12
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
spec="${1:-$root/openapi/openapi.yaml}"
prefix="$here/.npm"
bin="$prefix/node_modules/.bin/redocly"

fail() {
	echo "lint: $*" >&2
	echo "RESULT: 0 passed, 1 failed"
	exit 1
}

command -v node >/dev/null || fail "node is not installed (Debian: nodejs; needs >= 20.19)"
command -v npm >/dev/null || fail "npm is not installed"
node -e 'const [a, b] = process.versions.node.split(".").map(Number);
	process.exit((a == 20 && b >= 19) || (a == 22 && b >= 12) || a > 22 ? 0 : 1)' ||
	fail "Redocly CLI $REDOCLY_VERSION needs Node.js >= 20.19 (20.x) or >= 22.12; this is $(node --version)"
# Redocly checks for updates and sends usage data unless told not to; CI
# has no use for either.
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true NO_UPDATE_NOTIFIER=1

installed="$(node -p "require('$prefix/node_modules/@redocly/cli/package.json').version" 2>/dev/null || true)"
if [ "$installed" != "$REDOCLY_VERSION" ]; then
	log="$(mktemp)"
	if ! npm install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error \
		"@redocly/cli@$REDOCLY_VERSION" >"$log" 2>&1; then
		cat "$log" >&2
		rm -f "$log"
		fail "cannot install @redocly/cli@$REDOCLY_VERSION from the npm registry"
	fi
	rm -f "$log"
fi
[ -x "$bin" ] || fail "$bin is missing after npm install"

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
"$bin" lint --config "$here/redocly.yaml" --format stylish "$spec" >"$out" 2>&1
rc=$?
# Redocly 2.x prints a boxed Node.js 20 deprecation notice on every run.
grep -v '[╔╚║]' "$out"
if [ $rc -ne 0 ]; then
	echo "lint: redocly lint found problems in $spec" >&2
	echo "RESULT: 0 passed, 1 failed"
	exit 1
fi
echo "RESULT: 1 passed, 0 failed"
