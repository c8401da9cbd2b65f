#!/bin/sh
# Build rackwire's Debian package with Debian's own dpkg-deb:
#   scripts/package-deb.sh            -> target/debian/rackwire_VERSION_ARCH.deb (its path printed)
#   scripts/package-deb.sh --from target/debug --out DIR
#                                     packages what a build left in that folder instead of making
#                                     a release build (the package test packages the test build)
# It holds the `rackwire` command with its manual pages and shell completions, the C library
# (librackwire_ffi.so, rackwire.h, rackwire.pc), the libfabric provider where libfabric-dev was
# there to build it (into libfabric's own provider folder: no FI_PROVIDER_PATH needed), the
# systemd units rackwire-mh and rackwire-agent, and /etc/rackwire/rackwire.toml (kept on upgrade).
set -eu
cd "$(dirname "$0")/.."
from=""
out=target/debian
while [ $# -gt 0 ]; do
    case "$1" in
        --from) from=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: $0 [--from BUILD-FOLDER] [--out FOLDER]" >&2; exit 2 ;;
    esac
done
if [ -z "$from" ]; then
    cargo build --release --locked -p rackwire-cli -p rackwire-ffi -p rackwire-ofi
    from=target/release
fi
for f in "$from/rackwire" "$from/librackwire_ffi.so"; do
    [ -f "$f" ] || { echo "$0: $f is missing: build it first" >&2; exit 1; }
done
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
multiarch=$(gcc -print-multiarch)
mkdir -p "$out"
root=$out/root
rm -rf "$root"
mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/$multiarch/pkgconfig" "$root/usr/include" \
    "$root/usr/lib/systemd/system" "$root/etc/rackwire" "$root/usr/share/doc/rackwire" \
    "$root/usr/share/man/man1" "$root/usr/share/bash-completion/completions" \
    "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d"

# Binaries, without their debug information.
install -m 755 "$from/rackwire" "$root/usr/bin/rackwire"
install -m 644 "$from/librackwire_ffi.so" "$root/usr/lib/$multiarch/librackwire_ffi.so"
provider=$from/librackwire_fi.so
recommends=""
if [ -f "$provider" ] && ldd "$provider" | grep -q libfabric; then
    mkdir -p "$root/usr/lib/$multiarch/libfabric"
    install -m 644 "$provider" "$root/usr/lib/$multiarch/libfabric/librackwire-fi.so"
    recommends="Recommends: libfabric1"
fi
find "$root/usr" -type f \( -name rackwire -o -name '*.so' \) -exec strip --strip-unneeded {} +

# The C library's header and pkg-config file, for the installed paths.
install -m 644 crates/rackwire-ffi/include/rackwire.h "$root/usr/include/rackwire.h"
sed -e 's|^prefix=.*|prefix=/usr|' -e "s|^libdir=.*|libdir=\${prefix}/lib/$multiarch|" \
    -e "s|^Version:.*|Version: $version|" crates/rackwire-ffi/rackwire.pc \
    > "$root/usr/lib/$multiarch/pkgconfig/rackwire.pc"

# Manual pages and completions, made by the command from its own definitions.
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
"$from/rackwire" package-files "$gen" > /dev/null
mkdir -p "$root/usr/share/man/man5"
for page in "$gen"/man/man1/*.1 "$gen"/man/man5/*.5; do
    section=$(basename "$(dirname "$page")")
    gzip -9n < "$page" > "$root/usr/share/man/$section/$(basename "$page").gz"
done
install -m 644 "$gen/completions/rackwire.bash" "$root/usr/share/bash-completion/completions/rackwire"
install -m 644 "$gen/completions/_rackwire" "$root/usr/share/zsh/vendor-completions/_rackwire"
install -m 644 "$gen/completions/rackwire.fish" "$root/usr/share/fish/vendor_completions.d/rackwire.fish"

# Services, the host's configuration file, documentation.
install -m 644 packaging/systemd/rackwire-mh.service packaging/systemd/rackwire-agent.service \
    "$root/usr/lib/systemd/system/"
install -m 644 packaging/rackwire.toml "$root/etc/rackwire/rackwire.toml"
install -m 644 docs/deploy.md docs/config.md "$root/usr/share/doc/rackwire/"
printf 'rackwire\nLicense: Apache-2.0 (see /usr/share/common-licenses/Apache-2.0)\n' \
    > "$root/usr/share/doc/rackwire/copyright"

cat > "$root/DEBIAN/control" <<CONTROL
Package: rackwire
Version: $version
Architecture: $arch
Maintainer: rackwire developers <rackwire@example.invalid>
Section: net
Priority: optional
Depends: libc6 (>= 2.34), libgcc-s1
$recommends
Installed-Size: $(du -sk "$root/usr" | cut -f1)
Description: rack-area network stack in software
 One-sided remote writes and reads into memory the owner granted, over shared
 memory between processes of a host and a reliable transport striped over
 plain Ethernet links between hosts; a virtual NIC (rw0) for socket programs;
 a management host that names nodes and regions and keeps grants; a libfabric
 provider for MPI and libfabric programs.
CONTROL
sed -i '/^$/d' "$root/DEBIAN/control"
echo /etc/rackwire/rackwire.toml > "$root/DEBIAN/conffiles"
cat > "$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
# The units are new or changed: tell systemd, where it runs. Nothing starts until enabled.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
POSTINST
chmod 755 "$root/DEBIAN/postinst"

deb="$out/rackwire_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" > /dev/null
echo "$deb"
