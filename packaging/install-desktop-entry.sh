#!/bin/sh
# Add Hearth to the desktop's application menu (freedesktop: GNOME, KDE, XFCE, ...) for this user.
# The entry runs packaging/hearth-launch.sh from this checkout; run this again if you move the repo.
set -eu
REPO="$(cd "$(dirname "$0")/.." && pwd)"
APPS="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
ICONS="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/scalable/apps"
mkdir -p "$APPS" "$ICONS"
cp "$REPO/resources/hearth.svg" "$ICONS/hearth.svg"
sed -e "s|^Exec=.*|Exec=\"$REPO/packaging/hearth-launch.sh\"|" \
    -e "s|^Icon=.*|Icon=hearth|" "$REPO/resources/hearth.desktop" >"$APPS/hearth.desktop"
chmod +x "$REPO/packaging/hearth-launch.sh" "$APPS/hearth.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database "$APPS" || true
echo "Installed $APPS/hearth.desktop (icon: $ICONS/hearth.svg). Find Hearth in your application menu."
