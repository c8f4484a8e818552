#!/bin/sh
# Installs the receiver's release package below $DESTDIR$PREFIX: the binary, the systemd units,
# the schema, the alert rules, the dashboard and the docs. PREFIX defaults to /usr/local; the
# units are written with it, so that they name the binary and the docs where they are.
# DESTDIR, when set, is a staging directory the files go below (for a package of your own).
# Run it from the unpacked package (`make install` runs it from a staged one).
set -eu
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
case "$PREFIX" in
/*) ;;
*) echo "install.sh: PREFIX must be an absolute path, not \"$PREFIX\"" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
dest=$DESTDIR$PREFIX
[ -x "$here/bin/receiver" ] || { echo "install.sh: $here/bin/receiver is missing: run it from the unpacked package" >&2; exit 1; }

install -d "$dest/bin" "$dest/lib/systemd/system"
install -m 0755 "$here/bin/receiver" "$dest/bin/receiver"
for unit in "$here"/lib/systemd/system/*; do
    sed "s|@PREFIX@|$PREFIX|g" "$unit" >"$dest/lib/systemd/system/$(basename "$unit").part"
    chmod 0644 "$dest/lib/systemd/system/$(basename "$unit").part"
    mv "$dest/lib/systemd/system/$(basename "$unit").part" "$dest/lib/systemd/system/$(basename "$unit")"
done
(cd "$here/share" && find . -type f | sort) | while read -r f; do
    install -D -m 0644 "$here/share/$f" "$dest/share/$f"
done
echo "install.sh: receiver $(cat "$here/VERSION" 2>/dev/null | cut -d' ' -f2 | tr -d ,) installed below $dest (the binary in $dest/bin, the units in $dest/lib/systemd/system)"
