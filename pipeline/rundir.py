"""The run directory: resolved config, manifest, atomic writes. A new run never overwrites an old one."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from .config import Config, from_dict, validate
from .errors import RunDirError

VERSIONED = ["torch", "numpy", "scipy", "sympy", "onnx", "onnxruntime", "onnxsim", "maraboupy"]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def atomic_write_csv(path: Path, rows: list[dict[str, Any]], fieldnames: list[str] | None = None) -> None:
    buf = io.StringIO()
    fieldnames = fieldnames or list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(buf, fieldnames=fieldnames, extrasaction="raise")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """For writers that want a filename (torch.save, onnx.save): write a temp file, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in VERSIONED:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


class RunDir:
    """`runs/<name>/`: config.json, manifest.json and one sub-directory per stage."""

    def __init__(self, path: Path, cfg: Config):
        self.path = Path(path)
        self.cfg = cfg

    # -- creation and reopening ---------------------------------------------------------------
    @classmethod
    def create(cls, cfg: Config, argv: list[str] | None = None) -> "RunDir":
        out = Path(cfg.out_dir)
        name = cfg.name or f"{cfg.data.name}-{cfg.model.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        path = out / name
        if path.exists():
            if not cfg.name:  # auto names collide only within one second: add a suffix
                i = 1
                while (out / f"{name}-{i}").exists():
                    i += 1
                path = out / f"{name}-{i}"
            else:
                return cls._reopen_same(path, cfg)
        cfg.name = path.name
        path.mkdir(parents=True)
        run = cls(path, cfg)
        atomic_write_json(path / "config.json", cfg.to_dict())
        run._write_manifest({"name": path.name, "argv": argv or [], "created": now(), "seed": cfg.seed,
                             "versions": versions(), "stages": {}})
        return run

    @classmethod
    def _reopen_same(cls, path: Path, cfg: Config) -> "RunDir":
        existing = cls.open(path)
        if existing.cfg.to_dict() != cfg.to_dict():
            raise RunDirError(
                f"{path} already exists with a different config; pick a new name=..., or resume it as is with `pipeline run --resume {path}`"
            )
        return existing

    @classmethod
    def open(cls, path: str | Path) -> "RunDir":
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise RunDirError(f"{path} is not a run directory (no config.json); start one with `pipeline run`")
        try:
            cfg = validate(from_dict(json.loads(cfg_file.read_text())))
        except json.JSONDecodeError as exc:
            raise RunDirError(f"{cfg_file} is corrupt ({exc.msg}); start a new run") from None
        return cls(path, cfg)

    # -- manifest -----------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    def manifest(self) -> dict[str, Any]:
        try:
            return json.loads(self.manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RunDirError(f"{self.manifest_path} is unreadable ({exc}); start a new run") from None

    def _write_manifest(self, m: dict[str, Any]) -> None:
        atomic_write_json(self.manifest_path, m)

    def update_manifest(self, **fields: Any) -> None:
        """Set top-level manifest fields (read, update, atomic write)."""
        m = self.manifest()
        m.update(fields)
        self._write_manifest(m)

    def record_resume(self, overrides: list[str]) -> None:
        """Apply accepted `--resume` overrides: the new config.json, and the overrides listed in the manifest."""
        atomic_write_json(self.path / "config.json", self.cfg.to_dict())
        m = self.manifest()
        m.setdefault("resumed_with", []).append(overrides)
        self._write_manifest(m)

    def stage_status(self, stage: str) -> str | None:
        return self.manifest()["stages"].get(stage, {}).get("status")

    def mark_stage(self, stage: str, **fields: Any) -> None:
        m = self.manifest()
        entry = m["stages"].setdefault(stage, {})
        entry.update(fields)
        self._write_manifest(m)

    def record_variants(self, facts: dict[str, dict[str, Any]]) -> None:
        """The per-variant facts of `pipeline.activations.variant_facts`, recorded by the train stage."""
        self.update_manifest(variants=facts)

    def variant(self, name: str) -> dict[str, Any]:
        """What the train stage decided about one variant (hardenable, gate, λ_target, swapped_to, smooth)."""
        facts = self.manifest().get("variants", {}).get(name)
        if facts is None:
            raise RunDirError(f"{self.path}: the train stage recorded no facts for variant {name!r}; "
                              f"rerun it with `pipeline run --resume {self.path} --redo train`")
        return facts

    def record_outputs(self, stage: str, directory: str) -> dict[str, str]:
        d = self.path / directory
        files = sorted(p for p in d.rglob("*") if p.is_file() and not p.name.startswith(".")) if d.is_dir() else []
        return {str(p.relative_to(self.path)): sha256(p) for p in files}

    # -- paths --------------------------------------------------------------------------------
    def dir(self, *parts: str) -> Path:
        d = self.path.joinpath(*parts)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def file(self, *parts: str) -> Path:
        return self.path.joinpath(*parts)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
