#!/usr/bin/env bash
# Builds dist/egressd_<version>_amd64.deb for Debian 13 (trixie, python3 3.13) without debhelper: egressd and all
# its Python dependencies as cp313 manylinux x86_64 wheels in /usr/lib/egressd (run with `python3 -I`), plus the
# files in packaging/deb/. Version: egressd/__init__.py's __version__ with Debian revision -1, or the full Debian
# version in EGRESSD_DEB_VERSION (e.g. 0.1.0-2). The Python that runs pip: EGRESSD_BUILD_PYTHON, else python3.13
# on PATH, else pyenv's 3.13. Needs dpkg-deb, gzip, readelf and objdump (binutils); pip caches its downloads.
set -euo pipefail
export LC_ALL=C.UTF-8 TZ=UTC

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
pkg=egressd
arch=amd64
libdir=/usr/lib/egressd

die() { echo "build.sh: $*" >&2; exit 1; }

for tool in dpkg-deb gzip readelf objdump strip md5sum find sed; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install dpkg binutils gzip)"
done

# --- version ---------------------------------------------------------------------------------------------------
upstream=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' "$repo/egressd/__init__.py")
[ -n "$upstream" ] || die "no __version__ = \"...\" line in egressd/__init__.py"
version=${EGRESSD_DEB_VERSION:-$upstream-1}
# Debian policy 5.6.12: [epoch:]upstream[-revision]; upstream starts with a digit.
[[ $version =~ ^([0-9]+:)?[0-9][A-Za-z0-9.+~-]*$ ]] || die "EGRESSD_DEB_VERSION=$version is not a Debian version"
file_version=${version#*:}  # the file name carries no epoch

# Timestamps: the last commit's, when there is one (reproducible builds), else now.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH

# --- the Python that runs pip: 3.13, so environment markers are evaluated as on trixie --------------------------
find_python() {
    local candidate
    local candidates=("${EGRESSD_BUILD_PYTHON:-}" "$(command -v python3.13 || true)")
    if command -v pyenv >/dev/null; then
        for candidate in "$(pyenv root)"/versions/3.13*/bin/python3; do candidates+=("$candidate"); done
    fi
    for candidate in "${candidates[@]}"; do
        [ -n "$candidate" ] && [ -x "$candidate" ] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null \
            && "$candidate" -m pip --version >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}
python=$(find_python) || die "no Python 3.13 with pip found (set EGRESSD_BUILD_PYTHON, or install python3.13)"

work=$(mktemp -d "${TMPDIR:-/tmp}/egressd-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root/DEBIAN"

# --- egressd as a wheel, from a copy of exactly its sources (no build/ or egg-info left in the repo) -------------
src=$work/src
mkdir -p "$src"
cp "$repo/pyproject.toml" "$repo/README.md" "$src/"
tar -C "$repo" --exclude=__pycache__ --exclude='*.pyc' -cf - egressd | tar -C "$src" -xf -
pip=("$python" -m pip --disable-pip-version-check --no-input --quiet)
PIP_ROOT_USER_ACTION=ignore "${pip[@]}" wheel --no-deps --wheel-dir "$work/wheels" "$src"
wheel=$(find "$work/wheels" -name "egressd-$upstream-*.whl" -print -quit)
[ -n "$wheel" ] || die "pip wheel made no egressd-$upstream wheel"

# --- egressd and every dependency, as cp313 wheels for trixie's x86_64 (glibc 2.41) -------------------------------
platforms=(--platform manylinux2014_x86_64)
for minor in $(seq 17 41); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
PIP_ROOT_USER_ACTION=ignore "${pip[@]}" install --target "$root$libdir" --no-compile --no-warn-script-location \
    --python-version 3.13 --implementation cp --abi cp313 "${platforms[@]}" --only-binary=:all: "$wheel"

lib=$root$libdir
rm -rf "$lib/bin"
# pip's record of the temporary wheel path it installed egressd from: build-specific, and of no use here.
for url in "$lib"/*.dist-info/direct_url.json; do
    [ -e "$url" ] || continue
    sed -i '/\.dist-info\/direct_url\.json,/d' "$(dirname "$url")/RECORD"
    rm -f "$url"
done
[ -f "$lib/egressd/cli.py" ] || die "egressd is not in $libdir"
# Every module must compile with 3.13 (postinst byte-compiles them on the host); then drop the bytecode.
"$python" -I -m compileall -q "$lib" >"$work/compile.log" 2>&1 || { cat "$work/compile.log" >&2; die "compileall failed"; }
find "$lib" -name __pycache__ -type d -prune -exec rm -rf {} +
find "$lib" -name '*.py[co]' -delete

# Shared libraries: stripped as dh_strip does; not the ones auditwheel grafted in (*.libs/: patchelf'd files).
find "$lib" -name '*.so*' -type f ! -path '*.libs/*' \
    -exec strip --remove-section=.comment --remove-section=.note --strip-unneeded {} +
# What they need from the system becomes Depends (libc6 >= the newest GLIBC_ symbol version).
bundled=$(find "$lib" -name '*.so*' -type f -printf '%f\n' | sort -u)
glibc=2.17
extra_depends=()
while IFS= read -r needed; do
    case "$needed" in
        libc.so.6 | libm.so.6 | libdl.so.2 | libpthread.so.0 | librt.so.1 | libutil.so.1 | libresolv.so.2 \
            | ld-linux-x86-64.so.2) ;;
        libgcc_s.so.1) extra_depends+=("libgcc-s1") ;;
        libstdc++.so.6) extra_depends+=("libstdc++6") ;;
        libz.so.1) extra_depends+=("zlib1g") ;;
        *) grep -qxF "$needed" <<<"$bundled" || die "a bundled library needs $needed: map it to a Debian package" ;;
    esac
done < <(find "$lib" -name '*.so*' -type f -exec readelf -d {} + 2>/dev/null \
    | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)
newest=$(find "$lib" -name '*.so*' -type f -exec objdump -T {} + 2>/dev/null \
    | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
[ -z "$newest" ] || glibc=$(printf '%s\n%s\n' "$glibc" "$newest" | sort -V | tail -n 1)
# procps: /bin/kill, which the unit's ExecReload= uses.
depends="python3 (>= 3.13~), python3 (<< 3.14), ca-certificates, adduser, procps, libc6 (>= $glibc)"
for dep in $(printf '%s\n' "${extra_depends[@]}" | sort -u); do depends+=", $dep"; done

# --- the package's own files ---------------------------------------------------------------------------------------
install -D -m 0755 "$here/egressd.py" "$root/usr/bin/egressd"
install -D -m 0644 "$here/egressd.service" "$root/usr/lib/systemd/system/egressd.service"
install -D -m 0644 "$here/egressd.toml" "$root/etc/egressd/egressd.toml"
install -D -m 0644 "$here/example.toml.example" "$root/etc/egressd/policies/example.toml.example"
install -D -m 0644 "$here/conf.d-README" "$root/etc/egressd/conf.d/README"
install -D -m 0644 "$here/logrotate" "$root/etc/logrotate.d/egressd"
install -D -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/$pkg"
# copyright: the bundled distributions and their licenses as their metadata states them, into the template.
"$python" -I - "$lib" >"$work/bundled" <<'PY'
import importlib.metadata
import sys

for dist in sorted(importlib.metadata.distributions(path=[sys.argv[1]]), key=lambda d: d.metadata["Name"].lower()):
    meta = dist.metadata
    text = meta.get("License-Expression") or (meta.get("License") or "").strip()
    if not text or "\n" in text or len(text) > 60:
        classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
        text = " or ".join(classifiers) or "see its license files"
    print(f" {meta['Name']} {meta['Version']}: {text}")
PY
sed -e "/^@BUNDLED@\$/{r $work/bundled" -e 'd}' "$here/copyright.in" >"$work/copyright"
install -D -m 0644 "$work/copyright" "$root/usr/share/doc/$pkg/copyright"
install -d -m 0755 "$root/usr/share/man/man8"
gzip -9n <"$here/egressd.8" >"$root/usr/share/man/man8/egressd.8.gz"
gzip -9n <"$repo/README.md" >"$root/usr/share/doc/$pkg/README.md.gz"
{
    echo "$pkg ($version) trixie; urgency=medium"
    echo
    echo "  * egressd $upstream for Debian 13 (trixie), with its Python dependencies"
    echo "    in $libdir: a hardened systemd unit, the system user egressd,"
    echo "    conffiles in /etc/egressd, logrotate rule and man page."
    echo
    echo " -- $(sed -n 's/^Maintainer: //p' "$here/control.in")  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$root/usr/share/doc/$pkg/changelog.Debian.gz"

for script in postinst prerm postrm; do
    install -m 0755 "$here/$script" "$root/DEBIAN/$script"
done
(cd "$root" && find etc -type f | sort | sed 's|^|/|') >"$root/DEBIAN/conffiles"

# Normal modes everywhere (wheels carry some executable bits); only /usr/bin/egressd is a program.
find "$root" -path "$root/DEBIAN" -prune -o -type d -exec chmod 0755 {} +
find "$root" -path "$root/DEBIAN" -prune -o -type f ! -path "$root/usr/bin/egressd" -exec chmod 0644 {} +

installed_size=$(du -s -k --apparent-size --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@DEPENDS@/$depends/" -e "s/@INSTALLED_SIZE@/$installed_size/" \
    "$here/control.in" >"$root/DEBIAN/control"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
    >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"
find "$root" -newermt "@$SOURCE_DATE_EPOCH" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$repo/dist"
out=$repo/dist/${pkg}_${file_version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$work/$pkg.deb" >/dev/null
mv -f "$work/$pkg.deb" "$out"
echo "$out"
