#!/usr/bin/env bash
# Installs the npm packages of package.json (uPlot, which the build embeds
# into the dashboard; playwright-core, which drives Debian's chromium in the
# browser test) into the git-ignored node_modules/, exactly as
# package-lock.json pins them.  Does nothing when they are already there.
set -euo pipefail
cd "$(dirname "$0")/.."

stamp=node_modules/.package-lock.json
if [ -f "$stamp" ] && [ -f node_modules/uplot/dist/uPlot.iife.min.js ] &&
	[ -f node_modules/playwright-core/package.json ] && [ ! package-lock.json -nt "$stamp" ]; then
	exit 0
fi
echo "installing npm packages into node_modules/" >&2
npm ci --no-audit --no-fund --loglevel=error >/dev/null
