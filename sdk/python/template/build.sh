#!/usr/bin/env bash
# Builds this plugin with componentize-py, or tests it in plain CPython.
#
#   ./build.sh         {{name}}.wasm from app.py + sluice_plugin.py + wit/plugin.wit
#   ./build.sh test    runs test_app.py (python3 -m unittest) against generated bindings
#
# The first run makes .venv here with componentize-py in it.
set -euo pipefail
cd "$(dirname "$0")"

NAME="{{name}}"
WORLD="{{world}}"
COMPONENTIZE_PY_VERSION="0.25.1"
# COMPONENTIZE_PY names a componentize-py to use instead (no .venv made).
CPY="${COMPONENTIZE_PY:-.venv/bin/componentize-py}"

if [ ! -x "$CPY" ]; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet "componentize-py==$COMPONENTIZE_PY_VERSION"
fi

case "${1:-build}" in
    build)
        # What app.py imports (from here or the standard library) goes in,
        # as a snapshot of the initialised interpreter.
        "$CPY" -d wit/plugin.wit -w "$WORLD" componentize -p . app -o "$NAME.wasm"
        echo "built $NAME.wasm; check it: sluice plugin check $NAME.wasm"
        ;;
    test)
        rm -rf .bindings
        "$CPY" -d wit/plugin.wit -w "$WORLD" bindings .bindings
        PYTHONPATH=".bindings:.${PYTHONPATH:+:$PYTHONPATH}" python3 -m unittest -v test_app
        ;;
    *)
        echo "usage: $0 [build|test]" >&2
        exit 2
        ;;
esac
