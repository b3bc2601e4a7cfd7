#!/bin/sh
# tests/gpu/fetch_debs.sh DIR
# tests/gpu/fetch_debs.sh --list     the package names, one a line
#
# Downloads (does not install) the Debian packages that trainerd needs to
# build and test, into DIR, for a GPU machine that cannot reach a package
# registry and may lack them.  tests/gpu/check.sh unpacks them there with
# `dpkg -x` into a private prefix, never into /, and uses only the
# libraries that machine does not already have.  Run it on a developer
# machine (Debian 12, like CI), then copy DIR along; see check.sh.
#
# The list is the build dependencies of scripts/install-deps.sh plus the
# runtime libraries they pull in that a CUDA image is unlikely to have.
# libsystemd-dev is left out: the build treats it as optional.
set -eu

packages="
pkgconf pkgconf-bin libpkgconf3
libjansson-dev libjansson4
nettle-dev
libsqlite3-dev libsqlite3-0
libmicrohttpd-dev libmicrohttpd12
libcurl4-openssl-dev libcurl4 libnghttp2-14 libpsl5 librtmp1 libssh2-1 libldap-2.5-0 libbrotli1
libopenblas-dev libopenblas0 libopenblas-pthread-dev libopenblas0-pthread libgfortran5
libcriterion-dev libcriterion3 libnanomsg5 libgit2-1.5 libhttp-parser2.9
libmbedcrypto7 libmbedtls14 libmbedx509-1
libgnutls30 libnettle8 libhogweed6 libtasn1-6 libp11-kit0 libidn2-0 libunistring2 libgmp10
libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libsasl2-2 libsasl2-modules-db
zlib1g-dev zlib1g
libpng-dev libpng16-16
libjpeg-dev libjpeg62-turbo-dev libjpeg62-turbo
"

if [ "${1:-}" = --list ]; then
	# shellcheck disable=SC2086  # one name a line
	printf '%s\n' $packages
	exit 0
fi
DIR=${1:?usage: tests/gpu/fetch_debs.sh DIR}
mkdir -p "$DIR"
cd "$DIR"

# shellcheck disable=SC2086  # a list of names, split on purpose
if ! apt-get download $packages >/dev/null 2>apt.err; then
	echo "fetch_debs: apt-get download failed (run 'apt-get update' first?):" >&2
	cat apt.err >&2
	exit 1
fi
rm -f apt.err
echo "fetch_debs: $(find . -name '*.deb' | wc -l) packages, $(du -sh . | cut -f1) in $DIR" >&2
