#!/usr/bin/env bash
# Regenerate the golden fixtures under tests/fixtures/ (see tools/README.md).
# Creates tools/.venv from tools/requirements.txt on first use.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --upgrade pip
    "$venv/bin/pip" install -r "$here/requirements.txt"
fi
export PYTHONDONTWRITEBYTECODE=1
exec "$venv/bin/python" "$here/make_fixtures.py" "$@"
