"""The model library: the models a user has imported, one folder each, described by a manifest.

    home/models/<id>/manifest.json        who the model is (ModelManifest)
    home/models/<id>/config.json, model.safetensors, tokenizer.json, ...   a Hugging Face layout

home is $HEARTH_HOME, else the platform's user data folder for "hearth". A GGUF is converted on
import (engine.gguf_import); a Hugging Face folder is hard-linked (or copied) in. A folder without a
readable manifest is an unfinished import: it is not listed, but its id stays taken.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import MISSING, asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from .errors import (CheckpointNotFound, CorruptCheckpoint, HearthError, ImportFailed, NotACheckpoint,
                     UnknownModel)
from .progress import IMPORTING, ByteCounter, ProgressCallback

MANIFEST = "manifest.json"
WEIGHT_SUFFIXES = (".safetensors",)
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass
class ModelManifest:
    id: str
    name: str
    path: str                  # the model's folder
    architecture: str          # e.g. LlamaForCausalLM
    quantization: str          # what the source was stored as: Q4_1 for an imported GGUF, bf16, ...
    context_length: int
    bytes: int                 # weights on disk
    sha256: dict               # weights file name -> hex digest
    source: str                # where it was imported from (a path, or a package)
    added_at: str              # ISO 8601, UTC
    format: str = "safetensors"
    source_sha256: str = ""    # digest of the source file, when it was a single file (a GGUF)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelManifest":
        known = {f.name for f in fields(cls)}
        missing = {f.name for f in fields(cls) if f.default is MISSING} - set(data)
        if missing:
            raise CorruptCheckpoint(f"model manifest lacks {', '.join(sorted(missing))}")
        return cls(**{k: v for k, v in data.items() if k in known})


_DISK_FULL = (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC))


def write_failure(exc: BaseException, where: Path) -> str:
    """What a failed write means to a user: a full disk (or quota, or file-size limit) says so.
    `tokenizers` (Rust) reports an I/O error as a bare Exception ending "(os error 28)"."""
    code = getattr(exc, "errno", None)
    if code is None:
        m = re.search(r"\(os error (\d+)\)", str(exc))
        code = int(m.group(1)) if m else None
    if code in _DISK_FULL:
        return (f"the disk holding {where} is full (or its quota or file-size limit was reached); "
                "free some space and try again")
    return getattr(exc, "strerror", None) or str(exc)


def default_home() -> Path:
    env = os.environ.get("HEARTH_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("hearth"))


def slugify(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug or "model"


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def weight_files(folder: Path) -> list:
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


class ModelLibrary:
    def __init__(self, home=None):
        self.home = Path(home).expanduser() if home is not None else default_home()
        self.models_dir = self.home / "models"

    # -- reading --------------------------------------------------------------------------------

    def list(self) -> list:
        """Every complete model, sorted by name."""
        if not self.models_dir.is_dir():
            return []
        out = []
        for folder in sorted(self.models_dir.iterdir()):
            if folder.name.startswith(".") or not (folder / MANIFEST).is_file():
                continue
            try:
                out.append(self._read_manifest(folder))
            except HearthError:
                continue          # a broken manifest is skipped, not fatal to the whole list
        return sorted(out, key=lambda m: (m.name.lower(), m.id))

    def ids(self) -> list:
        return [m.id for m in self.list()]

    def get(self, model_id: str) -> ModelManifest:
        folder = self.models_dir / model_id
        if _ID.match(model_id or "") and (folder / MANIFEST).is_file():
            return self._read_manifest(folder)
        known = self.ids()
        raise UnknownModel(f"No model {model_id!r} in the library. "
                           + (f"Known models: {', '.join(known)}" if known else "The library is empty."))

    def __contains__(self, model_id: str) -> bool:
        return bool(_ID.match(model_id or "")) and (self.models_dir / model_id / MANIFEST).is_file()

    def resolve(self, path_or_id) -> Path:
        """The folder of a library model, or an existing checkpoint path given directly."""
        text = str(path_or_id)
        if text in self:
            return self.models_dir / text
        path = Path(text).expanduser()
        if path.exists():
            return path
        if os.sep in text or "/" in text or path.suffix in (".gguf", ".safetensors"):
            raise CheckpointNotFound(f"No such file or folder: {path}")
        self.get(text)   # raises UnknownModel listing the known ids
        return self.models_dir / text

    def verify(self, model_id: str) -> bool:
        """True if the weights on disk still hash to what the manifest recorded."""
        manifest = self.get(model_id)
        folder = Path(manifest.path)
        try:
            actual = {p.name: sha256_file(p) for p in weight_files(folder)}
        except OSError:
            return False
        return bool(actual) and actual == manifest.sha256

    # -- writing --------------------------------------------------------------------------------

    def import_path(self, path, progress: Optional[ProgressCallback] = None, model_id: Optional[str] = None,
                    name: Optional[str] = None, source: Optional[str] = None) -> ModelManifest:
        """Add a .gguf file or a Hugging Face folder to the library and return its manifest."""
        path = Path(path).expanduser()
        if not path.exists():
            raise CheckpointNotFound(f"No such file or folder: {path}")
        if path.is_file() and path.suffix.lower() != ".gguf":
            raise NotACheckpoint(f"{path.name} is neither a .gguf file nor a model folder")
        name = name or (path.stem if path.is_file() else path.name)
        model_id = self._new_id(model_id, name)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        target = self.models_dir / model_id
        try:
            if path.is_file():
                manifest = self._import_gguf(path, target, model_id, name, progress)
            else:
                manifest = self._import_folder(path, target, model_id, name, progress)
            if source:
                manifest.source = source
            self._write_manifest(target, manifest)
        except BaseException as e:
            if target.exists():
                self._delete(target)
            if isinstance(e, OSError):
                raise ImportFailed(f"Importing {path.name} failed: {write_failure(e, self.models_dir)}.") from e
            raise
        return manifest

    def remove(self, model_id: str) -> None:
        self.get(model_id)
        self._delete(self.models_dir / model_id)

    # -- internals ------------------------------------------------------------------------------

    def _new_id(self, model_id: Optional[str], name: str) -> str:
        if model_id is not None:
            if not _ID.match(model_id):
                raise ImportFailed(f"{model_id!r} is not a valid model id (use lower-case letters, digits "
                                   f"and dashes)")
            if (self.models_dir / model_id).exists():
                raise ImportFailed(f"A model with id {model_id!r} is already in the library")
            return model_id
        base = slugify(name)
        candidate, n = base, 2
        while (self.models_dir / candidate).exists():
            candidate, n = f"{base}-{n}", n + 1
        return candidate

    def _import_gguf(self, path, target, model_id, name, progress) -> ModelManifest:
        from .gguf_import import convert_gguf

        info = convert_gguf(path, target, progress=progress)
        source_sha = sha256_file(path)
        return self._manifest(target, model_id, name, info.metadata.architecture, info.metadata.quantization,
                              info.metadata.context_length, str(path.resolve()), "gguf", source_sha)

    def _import_folder(self, path, target, model_id, name, progress) -> ModelManifest:
        architecture, quantization, context = _validate_folder(path)
        files = [p for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(".")
                 and p.name != MANIFEST]
        counter = ByteCounter(progress, IMPORTING, sum(p.stat().st_size for p in files))
        counter.start(path.name)
        tmp = self.models_dir / f".{model_id}.importing-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            for p in files:
                try:
                    os.link(p, tmp / p.name)
                except OSError:
                    shutil.copy2(p, tmp / p.name)
                counter.advance(p.stat().st_size, p.name)
            os.replace(tmp, target)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError):
                raise ImportFailed(f"Copying {path.name} into the library failed: "
                                   f"{write_failure(e, self.models_dir)}.") from e
            raise
        return self._manifest(target, model_id, name, architecture, quantization, context,
                              str(path.resolve()), "safetensors", "")

    def _manifest(self, folder, model_id, name, architecture, quantization, context, source, fmt,
                  source_sha) -> ModelManifest:
        weights = weight_files(folder)
        return ModelManifest(
            id=model_id, name=name, path=str(folder.resolve()), architecture=architecture,
            quantization=quantization, context_length=int(context or 0),
            bytes=sum(p.stat().st_size for p in weights), sha256={p.name: sha256_file(p) for p in weights},
            source=source, added_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            format=fmt, source_sha256=source_sha)

    def _read_manifest(self, folder: Path) -> ModelManifest:
        try:
            data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CorruptCheckpoint(f"The manifest of {folder.name} cannot be read: {e}") from e
        manifest = ModelManifest.from_dict(data)
        manifest.path = str(folder.resolve())     # the folder is the truth, even if home moved
        return manifest

    @staticmethod
    def _write_manifest(folder: Path, manifest: ModelManifest) -> None:
        tmp = folder / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(manifest.to_dict(), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, folder / MANIFEST)

    def _delete(self, folder: Path) -> None:
        """Rename out of the way first, so a half-deleted model never looks like a model."""
        grave = folder.parent / f".{folder.name}.deleting-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(folder, grave)
        except OSError:
            grave = folder
        shutil.rmtree(grave, ignore_errors=True)


def _validate_folder(path: Path) -> tuple:
    """(architecture, quantization, context_length) of a Hugging Face folder, or a clear error.

    The checkpoint inspector is the one judge of what a valid folder is; it is imported here, lazily,
    so the library does not pull in the planner just to list models.
    """
    from . import checkpoint

    inspect_folder = getattr(checkpoint, "inspect_safetensors_folder", None) or checkpoint.inspect
    info = inspect_folder(path)
    if info.format != "safetensors":
        raise NotACheckpoint(f"{path.name} is not a Hugging Face model folder")
    return info.metadata.architecture, info.metadata.quantization, info.metadata.context_length
