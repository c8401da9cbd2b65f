#!/usr/bin/env bash
# libfabric's own test suite (fabtests) over the rackwire provider.
#
#   scripts/fabtests.sh PATH-TO-LIBFABRIC-SOURCE [TEST-SETS]
#
# PATH-TO-LIBFABRIC-SOURCE is a checkout of libfabric (github.com/ofiwg/libfabric) at the tag
# of the installed library (v1.17.0 for Debian's libfabric1); its fabtests are built against
# the installed library into target/fabtests (autoconf, automake, libtool and libfabric-dev
# needed). The provider is built (release), a management host started on a free loopback
# port, and fabtests' own runner runs the sets (default: unit,functional,short) with
# addresses exchanged out of band (-b), over shared memory and then over the edge transport
# (two loopback links). Tests that do not apply to an RDM provider are skipped by the suite
# itself ("Notrun"). The summary of each run is printed; the exit status is non-zero when a
# test failed. Full logs: target/fabtests/{shm,edge}.log.
set -euo pipefail

src=${1:?usage: scripts/fabtests.sh PATH-TO-LIBFABRIC-SOURCE [TEST-SETS]}
sets=${2:-unit,functional,short}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/fabtests
[ -f "$src/fabtests/configure.ac" ] || { echo "no fabtests in $src" >&2; exit 2; }
mkdir -p "$out"

if [ ! -x "$out/install/bin/runfabtests.sh" ]; then
  echo "building fabtests from $src/fabtests"
  rm -rf "$out/build" && cp -r "$src/fabtests" "$out/build"
  (cd "$out/build" && ./autogen.sh && ./configure --prefix="$out/install" && make -j"$(nproc)" && make install) \
    >"$out/build.log" 2>&1 || { echo "building fabtests failed: $out/build.log" >&2; exit 1; }
fi

(cd "$root" && cargo build --release -q -p rackwire-ofi -p rackwire-cli)
export FI_PROVIDER_PATH=$root/target/release/ofi

state=$(mktemp -d)
chmod 700 "$state"
secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RACKWIRE_SECRET=$secret "$root/target/release/rackwire" mh --listen "127.0.0.1:$port" --state "$state" \
  >"$out/mh.log" 2>&1 &
mh=$!
trap 'kill $mh 2>/dev/null; rm -rf "$state"' EXIT
sleep 1
export RACKWIRE_MH=127.0.0.1:$port RACKWIRE_SECRET=$secret
unset RACKWIRE_NAME
# No host configuration file either (RACKWIRE_CONFIG set empty): the run is configured here alone.
export RACKWIRE_CONFIG=

status=0
for transport in shm edge; do
  if [ "$transport" = edge ]; then
    export RACKWIRE_TRANSPORT=edge RACKWIRE_LINKS=127.0.0.1:0,127.0.0.1:0
  else
    unset RACKWIRE_TRANSPORT RACKWIRE_LINKS
  fi
  log=$out/$transport.log
  (cd "$out" && "$out/install/bin/runfabtests.sh" -p "$out/install/bin" -t "$sets" -T 60 -b rackwire) >"$log" 2>&1 || true
  echo "== over $transport"
  grep -E '^# (Total|Percentage)' "$log" || true
  if grep -qE ':[[:space:]]+Fail$' "$log"; then
    grep -E ':[[:space:]]+Fail$' "$log"
    status=1
  fi
done
exit $status
