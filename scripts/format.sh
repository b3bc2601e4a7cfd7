#!/usr/bin/env bash
# Formats trainerd's C, header and CUDA sources with clang-format and the
# repository's .clang-format (docs/design.md, "Code style").
#
#   scripts/format.sh           rewrites every unformatted file in place
#   scripts/format.sh --check   changes nothing: names each unformatted file
#                               and exits 1 if there is one
#
# The files are the tracked *.c, *.h, *.cu and *.cuh under the source
# folders (every file in them when the tree is not a git checkout).  The
# style is written for clang-format 14, which Debian bookworm ships and
# scripts/install-deps.sh installs; other versions break some lines
# differently, so a different one is refused (set CLANG_FORMAT to the path
# of a clang-format 14 to choose it).  Exit 77 (meson's "skipped") when
# there is no usable clang-format.
set -euo pipefail

cd "$(dirname "$0")/.."
dirs=(api core daemon engine storage cli tests bench examples)
want_major=14
check=0
case "${1:-}" in
--check) check=1 ;;
"") ;;
*)
	echo "usage: scripts/format.sh [--check]" >&2
	exit 2
	;;
esac

cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
	echo "format: SKIP: $cf not found (scripts/install-deps.sh installs clang-format)"
	exit 77
fi
version=$("$cf" --version)
major=$(sed -n 's/.*clang-format version \([0-9]*\)\..*/\1/p' <<<"$version")
if [ "$major" != "$want_major" ]; then
	echo "format: SKIP: $cf is version ${major:-unknown}, .clang-format is written for clang-format $want_major" \
		"(set CLANG_FORMAT to one)"
	exit 77
fi

files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	while IFS= read -r -d '' f; do
		files+=("$f")
	done < <(git ls-files -z -- "${dirs[@]/%//*.c}" "${dirs[@]/%//*.h}" "${dirs[@]/%//*.cu}" "${dirs[@]/%//*.cuh}")
else
	while IFS= read -r -d '' f; do
		files+=("$f")
	done < <(find "${dirs[@]}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
		sort -z)
fi
if [ ${#files[@]} -eq 0 ]; then
	echo "format: no sources found" >&2
	exit 1
fi

# One clang-format process for all files: --dry-run --Werror reports the
# first difference of each file as "FILE:LINE:COL: error: ...".
report=$("$cf" --dry-run --Werror --ferror-limit=1 "${files[@]}" 2>&1) && rc=0 || rc=$?
bad=$(sed -n 's/^\(.*\):[0-9][0-9]*:[0-9][0-9]*: error: code should be clang-formatted.*/\1/p' <<<"$report" | sort -u)
if [ $rc -ne 0 ] && [ -z "$bad" ]; then
	# clang-format failed for another reason (a bad .clang-format, say).
	echo "$report" >&2
	exit 1
fi

if [ $check -eq 1 ]; then
	if [ -n "$bad" ]; then
		n=$(wc -l <<<"$bad")
		echo "format: $n of ${#files[@]} files are not formatted (scripts/format.sh or make format fixes them):"
		sed 's/^/  /' <<<"$bad"
		echo "RESULT: 0 passed, 1 failed"
		exit 1
	fi
	echo "format: all ${#files[@]} files formatted"
	echo "RESULT: 1 passed, 0 failed"
	exit 0
fi

if [ -n "$bad" ]; then
	mapfile -t todo <<<"$bad"
	"$cf" -i "${todo[@]}"
	echo "format: formatted ${#todo[@]} files:"
	sed 's/^/  /' <<<"$bad"
else
	echo "format: all ${#files[@]} files formatted already"
fi
