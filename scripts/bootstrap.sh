# Sourced by scripts/dev and scripts/test: finds Python >= 3.12, makes .venv, installs egressd into it,
# and (as root) installs the Debian tools the tests drive. Idempotent; reruns are cheap.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo_root/.venv"

find_python() {
    local candidate
    for candidate in python3.13 python3.12 python3; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            command -v "$candidate"; return 0
        fi
    done
    if command -v pyenv >/dev/null 2>&1; then
        for candidate in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])(\.[0-9]+)?$' | sort -V -r); do
            local exe; exe="$(pyenv root)/versions/$candidate/bin/python3"
            if [ -x "$exe" ]; then echo "$exe"; return 0; fi
        done
    fi
    return 1
}

apt_install() {
    # Installs the named Debian packages when a command is missing; only root can, others are told what to do.
    local missing=()
    while [ $# -gt 0 ]; do
        command -v "$1" >/dev/null 2>&1 || missing+=("$2")
        shift 2
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing Debian packages: ${missing[*]}" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "bootstrap: missing Debian packages: ${missing[*]} (install them: apt-get install ${missing[*]})" >&2
        return 1
    fi
}

python_exe=$(find_python) || {
    echo "bootstrap: egressd needs Python >= 3.12 (python3.12/python3.13 on PATH, or a 3.12+ under pyenv)." >&2
    echo "           On Debian 13: apt-get install python3 python3-venv" >&2
    exit 1
}

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    rm -rf "$venv"
    "$python_exe" -m venv "$venv" || {
        echo "bootstrap: '$python_exe -m venv' failed; on Debian: apt-get install python3-venv" >&2
        exit 1
    }
fi

stamp="$venv/.installed-$(sha256sum "$repo_root/pyproject.toml" | cut -c1-16)"
if [ ! -e "$stamp" ]; then
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -e "$repo_root[test]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
