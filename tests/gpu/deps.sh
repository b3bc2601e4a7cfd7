# shellcheck shell=bash disable=SC2034  # sourced by check.sh, whose variables it sets
# tests/gpu/deps.sh: sourced by tests/gpu/check.sh.  What the build needs
# from the machine, what is missing, and the carried .deb files that stand
# in for it (unpacked into a private prefix, never into /).
#
# Needs: ROOT (the source tree), WORK (scratch folder), DEPS (the prefix).

# Every pkg-config module a -Dcuda=enabled build requires, with the
# Debian package that provides it (tests/gpu/fetch_debs.sh carries each
# one; `check.sh --rehearse` checks both lists against the meson files).
# openblas: `blas` stands in for it, as in meson.build.
MODULES="
jansson:libjansson-dev
sqlite3:libsqlite3-dev
libmicrohttpd:libmicrohttpd-dev
libcurl:libcurl4-openssl-dev
nettle:nettle-dev
criterion:libcriterion-dev
zlib:zlib1g-dev
libpng:libpng-dev
libjpeg:libjpeg62-turbo-dev
openblas:libopenblas-dev
"
# Modules a meson file asks for that need no carried package: threads is
# the compiler's, dl is the C library's, blas is openblas's alternative.
MODULES_BUILTIN="threads dl blas"

module_names() { echo "$MODULES" | cut -d: -f1 | grep .; }

# The modules pkg-config cannot find here (or "pkg-config" itself).
missing_modules() {
	local m out=""
	if ! command -v pkg-config >/dev/null; then
		echo "pkg-config"
		return
	fi
	for m in $(module_names); do
		case $m in
		openblas) pkg-config --exists openblas || pkg-config --exists blas || out="$out openblas" ;;
		*) pkg-config --exists "$m" || out="$out $m" ;;
		esac
	done
	echo "$out"
}

# The modules the meson files require without a `required :` of their
# own (those are optional features or have a fallback): one a line.
meson_required_modules() {
	find "$ROOT" -name meson.build -not -path "$ROOT/build*" -not -path "$ROOT/node_modules/*" -print0 |
		xargs -0 grep -h "dependency('" | grep -v 'required *:' |
		sed -n "s/.*dependency('\([^']*\)'.*/\1/p" | sort -u
}

# Unpacks one .deb into $DEPS, with dpkg or without it.
unpack_deb() {
	if command -v dpkg >/dev/null; then
		dpkg -x "$1" "$DEPS"
	else
		local t
		t=$(mktemp -d)
		(cd "$t" && ar x "$1" && tar -xf data.tar.* -C "$DEPS")
		rm -rf "$t"
	fi
}

# The soname's path on this machine, if ldconfig knows it.
system_lib() {
	ldconfig -p 2>/dev/null | awk -v s="$1" '$1 == s && /x86-64/ { print $NF; exit }'
}

# use_debs DIR: unpacks every .deb of DIR into $DEPS and puts the prefix
# on PATH, PKG_CONFIG_PATH, CPATH, LIBRARY_PATH and LD_LIBRARY_PATH.
use_debs() {
	local dir=$1 f pc n link soname sys lib real dev
	mkdir -p "$DEPS" "$DEPS/stubpc"
	for f in "$dir"/*.deb; do
		unpack_deb "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" || return 1
	done
	lib=$DEPS/usr/lib/x86_64-linux-gnu
	# Prefer the machine's own copy of every library it already has: drop
	# ours (the soname and the file it names) and point our development
	# link (libfoo.so, which names the versioned file) at the system's.
	while IFS= read -r link; do
		soname=$(basename "$link")
		sys=$(system_lib "$soname")
		[ -n "$sys" ] || continue
		real=$(readlink -f "$link")
		for dev in "$(dirname "$link")"/lib*.so; do
			[ -L "$dev" ] || continue
			case $(basename "$(readlink "$dev")") in
			"$soname" | "$(basename "$real")") ln -sfn "$sys" "$dev" ;;
			esac
		done
		rm -f "$real" "$link"
		echo "using the system's $soname ($sys)"
	done < <(find "$DEPS" -name 'lib*.so.[0-9]*' \( -type l -o -type f \))
	# .pc files name /usr: point them at the prefix
	find "$DEPS" -name '*.pc' -exec sed -i -e "s|=/usr|=$DEPS/usr|g" -e "s| /usr/| $DEPS/usr/|g" {} +
	export PATH="$DEPS/usr/bin:$PATH"
	export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export LIBRARY_PATH="$lib:$lib/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}"
	export CPATH="$DEPS/usr/include:$DEPS/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
	# openblas-pthread's .pc files sit in its own folder (Debian links them
	# into pkgconfig/ through update-alternatives, which dpkg -x skips)
	export PKG_CONFIG_PATH="$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$DEPS/usr/share/pkgconfig:$DEPS/stubpc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
	hash -r
	# pkg-config wants Requires.private modules to exist even for --cflags
	while IFS= read -r pc; do
		for n in $(sed -n 's/^Requires\(\.private\)\{0,1\}:\(.*\)/\2/p' "$pc" | tr ',' ' '); do
			case $n in [a-zA-Z]*) ;; *) continue ;; esac
			pkg-config --exists "$n" 2>/dev/null && continue
			printf 'Name: %s\nDescription: stub for the trainerd GPU check\nVersion: 999\n' "$n" \
				>"$DEPS/stubpc/$n.pc"
			echo "stub .pc for $n (needed by $(basename "$pc"))"
		done
	done < <(find "$DEPS" -name '*.pc' -not -path "$DEPS/stubpc/*")
}

# deps: every module found, with the carried .debs when the machine lacks
# some; names what is missing otherwise.
deps() {
	local missing debs
	missing=$(missing_modules)
	if [ -n "$missing" ]; then
		debs=${TR_DEBS:-$ROOT/.debs}
		echo "missing:$missing"
		if ! ls "$debs"/*.deb >/dev/null 2>&1; then
			echo "missing$missing and no .deb files in $debs (tests/gpu/README.md, 'Carrying packages')"
			return 1
		fi
		use_debs "$debs" || return 1
		missing=$(missing_modules)
		if [ -n "$missing" ]; then
			echo "still missing after unpacking $debs:$missing"
			return 1
		fi
	fi
	echo "pkg-config: all modules found"
}

# The meson files' required modules against MODULES, and MODULES' packages
# against fetch_debs.sh's list: a module added to the build without a
# carried package fails the rehearsal, not the GPU run.
check_module_lists() {
	local m pkgs bad=0
	pkgs=$(sh "$ROOT/tests/gpu/fetch_debs.sh" --list)
	for m in $(meson_required_modules); do
		case " $MODULES_BUILTIN " in *" $m "*) continue ;; esac
		if ! module_names | grep -qx "$m"; then
			echo "meson requires '$m', which tests/gpu/deps.sh's MODULES does not list"
			bad=1
		fi
	done
	for m in $(echo "$MODULES" | cut -d: -f2 | grep .); do
		if ! echo "$pkgs" | grep -qx "$m"; then
			echo "package $m (tests/gpu/deps.sh) is not in tests/gpu/fetch_debs.sh's list"
			bad=1
		fi
	done
	[ $bad = 0 ] && echo "module lists: every required module has a carried package"
	return $bad
}

# check_carried_debs DIR: every package of fetch_debs.sh's list has its
# .deb in DIR, and unpacked into a scratch prefix as the run does it they
# give pkg-config every module (the system's own .pc files out of sight).
check_carried_debs() {
	local dir=$1 p missing="" m bad=""
	for p in $(sh "$ROOT/tests/gpu/fetch_debs.sh" --list); do
		ls "$dir/${p}_"*.deb >/dev/null 2>&1 || missing="$missing $p"
	done
	if [ -n "$missing" ]; then
		echo "$dir lacks:$missing (run tests/gpu/fetch_debs.sh again)"
		return 1
	fi
	(
		# the run's own unpacking (use_debs), with the system's .pc files
		# out of sight, so that every module must come from the carried ones
		DEPS=$WORK/deps-trial
		rm -rf "$DEPS"
		mkdir -p "$DEPS/stubpc"
		export PKG_CONFIG_LIBDIR=$DEPS/stubpc
		use_debs "$dir" >/dev/null || exit 1
		for m in $(module_names); do
			pkg-config --exists "$m" || bad="$bad $m"
		done
		rm -rf "$DEPS"
		if [ -n "$bad" ]; then
			echo "the carried packages give no .pc file for:$bad"
			exit 1
		fi
		echo "carried packages: all $(find "$dir" -maxdepth 1 -name '*.deb' | wc -l) present; they provide every module"
	)
}
# cuBLAS and NCCL beside nvcc, else from pip's nvidia wheels.
cuda_libs() {
	local mod hdr so inc libd sp
	mkdir -p "$WORK/cudaextra/lib" "$WORK/cudaextra/include"
	sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
	for mod in cublas nccl; do
		case $mod in cublas) hdr=cublas_v2.h ;; nccl) hdr=nccl.h ;; esac
		if ls "$CUDA_HOME"/lib64/lib$mod.so* "$CUDA_HOME"/targets/*/lib/lib$mod.so* >/dev/null 2>&1 &&
			[ -n "$(find "$CUDA_HOME/include" "$CUDA_HOME"/targets/*/include -maxdepth 1 -name $hdr 2>/dev/null | head -1)" ]; then
			echo "$mod: in the toolkit"
			continue
		fi
		# shellcheck disable=SC2086  # site-packages directories, one or more
		so=$(find $sp -path '*nvidia*' -name "lib$mod.so*" 2>/dev/null | sort | head -1)
		# shellcheck disable=SC2086
		inc=$(find $sp -path '*nvidia*' -name $hdr 2>/dev/null | head -1)
		if [ -z "$so" ] || [ -z "$inc" ]; then
			echo "$mod: not in the toolkit and no pip wheel found"
			return 1
		fi
		libd=$(dirname "$so")
		ln -sfn "$so" "$WORK/cudaextra/lib/lib$mod.so"
		for f in "$(dirname "$inc")"/*.h; do ln -sfn "$f" "$WORK/cudaextra/include/"; done
		export LD_LIBRARY_PATH="$libd${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
		echo "$mod: from $libd"
	done
	export CPATH="${CPATH:+$CPATH:}$WORK/cudaextra/include"
	export LIBRARY_PATH="$WORK/cudaextra/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
}

