#!/bin/sh
# Add Hearth to the desktop's application menu (freedesktop: GNOME, KDE, XFCE, ...) for this user.
# The entry runs packaging/hearth-launch.sh from this checkout; run this again if you move the repo.
# With a bundle folder (`packaging/install-desktop-entry.sh dist/hearth`, after `make bundle`) it runs
# the bundle's own executable instead: no Python needed.
set -eu
REPO="$(cd "$(dirname "$0")/.." && pwd)"
EXEC="$REPO/packaging/hearth-launch.sh"
if [ $# -ge 1 ]; then
    EXEC="$(cd "$1" && pwd)/hearth"
    [ -x "$EXEC" ] || { echo "no bundle executable at $EXEC (run make bundle)" >&2; exit 1; }
fi
APPS="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
ICONS="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/scalable/apps"
mkdir -p "$APPS" "$ICONS"
cp "$REPO/resources/hearth.svg" "$ICONS/hearth.svg"
sed -e "s|^Exec=.*|Exec=\"$EXEC\"|" \
    -e "s|^Icon=.*|Icon=hearth|" "$REPO/resources/hearth.desktop" >"$APPS/hearth.desktop"
chmod +x "$REPO/packaging/hearth-launch.sh" "$APPS/hearth.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database "$APPS" || true
echo "Installed $APPS/hearth.desktop (icon: $ICONS/hearth.svg). Find Hearth in your application menu."
