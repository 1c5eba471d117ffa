"""Entry point of the frozen bundle (PyInstaller): the same as `hearth` with no command."""
import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
