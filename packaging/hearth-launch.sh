#!/bin/sh
# Start Hearth from a file manager or a desktop launcher.
# First run: creates the repo's .venv with `make install` (the README's set-up; needs python3,
# make and, for the compiled backend, the CUDA toolkit). Every run: `python -m app`.
# Output goes to $HEARTH_HOME/launcher.log (default ~/.local/share/hearth) since no terminal is open.
set -eu
REPO="$(cd "$(dirname "$0")/.." && pwd)"
LOG_DIR="${HEARTH_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/hearth}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/launcher.log"
cd "$REPO"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import PySide6, engine" 2>/dev/null; then
    echo "$(date): setting up $REPO/.venv (first run)" >>"$LOG"
    if ! make install >>"$LOG" 2>&1; then
        command -v notify-send >/dev/null && notify-send "Hearth" "Set-up failed; see $LOG"
        exit 1
    fi
fi
exec .venv/bin/python -m app "$@" >>"$LOG" 2>&1
