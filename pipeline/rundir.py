"""The run directory: resolved config, manifest, the stages' files. A new run never overwrites an old one. Its files
are written whole or not at all, and a process holds it by a lock: `pipeline/atomic_io.py`."""

from __future__ import annotations

import hashlib
import json
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from .atomic_io import atomic_write_json
from .config import Config, from_dict, validate
from .errors import RunDirError
from .variant_record import VariantRecord
from .variant_record import from_dict as record_from_dict

VERSIONED = ["torch", "numpy", "scipy", "sympy", "onnx", "onnxruntime", "onnxsim", "maraboupy"]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Output:
    """A file a stage writes under the run directory, as the stage declares it (each stage module's `OUTPUTS`, carried by
    its entry in `pipeline/stages/__init__.py`): what the runner checks the stage's writes against and the README's
    table "The run directory" describes. `path` is relative to the run directory, in the README's notation: `<variant>`
    stands for each variant of the run, `<form>` for each form the variant is exported in (`RunDir.forms`), `*` for any
    name within one folder."""

    path: str
    # Where the file is written when not always ("" = always: a stage that finishes without it is a bug the runner names).
    when: str = ""
    only: str = ""  # a form ("relu", "smooth"): only the variants exported in that form have the file

    def matches(self, rel: str) -> bool:
        """Whether `rel` (a path relative to the run directory) is one of the files this declares."""
        pattern = "".join("[^/]+" if part in ("<variant>", "<form>") else "[^/]*" if part == "*" else re.escape(part)
                          for part in re.split(r"(<variant>|<form>|\*)", self.path))
        return re.fullmatch(pattern, rel) is not None

    def expected(self, run: "RunDir", variants: list[str]) -> list[str]:
        """The paths (each may still hold `*`) this declares for the run's variants."""
        paths = []
        for v in variants if "<variant>" in self.path else [None]:
            forms = run.forms(v) if v is not None else ()
            if self.only and self.only not in forms:
                continue
            p = self.path if v is None else self.path.replace("<variant>", v)
            paths += [p.replace("<form>", f) for f in forms] if "<form>" in p else [p]
        return paths

    def missing(self, run: "RunDir", variants: list[str]) -> list[str]:
        """The always-written files of this declaration the run directory does not hold (a `*` wants one match)."""
        if self.when:
            return []
        return [p for p in self.expected(run, variants)
                if not (any(run.path.glob(p)) if "*" in p else run.file(p).is_file())]


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
        self.device: "torch.device | None" = None  # the run's device, resolved once by the runner (`compute_device`)

    def compute_device(self) -> "torch.device":
        """The device the runner resolved for this run (`device=`), or resolved now for a stage called directly."""
        if self.device is None:
            from .distributed import resolve_device

            self.device = resolve_device(self.cfg.device)
        return self.device

    # -- creation and reopening ---------------------------------------------------------------
    @classmethod
    def create(cls, cfg: Config, argv: list[str] | None = None) -> "RunDir":
        out = Path(cfg.out_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = tempfile.TemporaryFile(dir=out)  # mkdir of an existing folder says nothing about writing into it
        except OSError as exc:
            raise RunDirError(f"cannot create a run directory in {out} ({exc.strerror}); make it writable, "
                              f"or pick another folder with out_dir=...") from None
        probe.close()
        if cfg.name:
            path = out / cfg.name
            try:
                path.mkdir()
            except FileExistsError:
                return cls._reopen_same(path, cfg)
        else:  # auto names collide within one second: the first free suffix, claimed by mkdir itself (atomic)
            base = f"{cfg.data.name}-{cfg.model.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            for i in range(10_000):
                path = out / (base if i == 0 else f"{base}-{i}")
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    continue
            else:
                raise RunDirError(f"no free run name like {base} in {out}; pass name=...")
        cfg.name = path.name
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

    def record_resume(self, overrides: list[str], accepted: list[dict[str, str]]) -> None:
        """Accepted `--resume` overrides: the new config.json, and in the manifest each override with the stage
        it takes effect from."""
        atomic_write_json(self.path / "config.json", self.cfg.to_dict())
        m = self.manifest()
        m.setdefault("resumed_with", []).append({"overrides": overrides, "at": now(), "keys": accepted})
        self._write_manifest(m)

    def stage_status(self, stage: str) -> str | None:
        return self.manifest()["stages"].get(stage, {}).get("status")

    def mark_stage(self, stage: str, **fields: Any) -> None:
        m = self.manifest()
        entry = m["stages"].setdefault(stage, {})
        entry.update(fields)
        self._write_manifest(m)

    def record_variants(self, records: dict[str, VariantRecord]) -> None:
        """Each variant's record (`pipeline.variant_record`), written once by the train stage."""
        self.update_manifest(variants={v: r.as_dict() for v, r in records.items()})

    def variant(self, name: str) -> VariantRecord:
        """The train stage's record of one variant: the one way every later stage reads a variant's facts. A run
        directory without it (the train stage has not started, or an older version wrote it) is an error naming
        the fix."""
        record = record_from_dict(self.manifest().get("variants", {}).get(name))
        if record is None:
            raise RunDirError(f"{self.path}: no record of variant {name!r} from this version's train stage; "
                              f"rerun it with `pipeline run --resume {self.path} --redo train`")
        return record

    def forms(self, name: str) -> tuple[str, ...]:
        """The forms a variant is exported in, from its record: "smooth" (its own network, when it has one other than
        ReLU) and "relu" (its swapped network; a non-gate, which the swap leaves, has none)."""
        record = self.variant(name)
        return (("smooth",) if record.smooth else ()) + (("relu",) if record.swapped_to is not None else ())

    def variants(self) -> dict[str, VariantRecord]:
        """Every variant's record the train stage wrote ({} before it has run); `variant` for one that must exist."""
        return {v: self.variant(v) for v in self.manifest().get("variants", {})}

    def read_json(self, *parts: str) -> Any | None:
        """A JSON file a stage wrote, `parts` as for `file` (e.g. "quantize", "quantize.json"), or None when it has not
        been written (a report section of a stage that has not run is left out): the one way a stage's JSON is read. A
        corrupt file is an error naming the `--redo` of the stage that wrote it (the manifest's record of its outputs)."""
        path = self.file(*parts)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            writer = self.writer_of(path)
            fix = (f"rewrite it with `pipeline run --resume {self.path} --redo {writer}`" if writer else
                   f"rerun the stage that writes {parts[0]}/ (`pipeline stages` lists them) with "
                   f"`pipeline run --resume {self.path} --redo <stage>`")
            raise RunDirError(f"{path} is corrupt ({exc.msg}); {fix}") from None

    def writer_of(self, path: str | Path) -> str | None:
        """The stage whose manifest record lists this file (as written or rewritten by it), or None."""
        try:
            rel = str(Path(path).resolve().relative_to(self.path.resolve()))
        except ValueError:
            return None
        for name, entry in self.manifest()["stages"].items():
            if rel in entry.get("outputs", {}):
                return name
        return next((e["rewritten_by"][rel] for e in self.manifest()["stages"].values() if rel in e.get("rewritten_by", {})), None)

    def snapshot(self, directory: str) -> dict[str, list[int]]:
        """[size, mtime] of every file under a stage directory: what `record_outputs` compares against."""
        d = self.path / directory
        # hidden names are temp files and the private folders of `atomic_path` (a killed write leaves one)
        files = (p for p in d.rglob("*") if p.is_file() and not any(q.startswith(".") for q in p.relative_to(d).parts)) \
            if d.is_dir() else ()
        return {str(p.relative_to(self.path)): [p.stat().st_size, p.stat().st_mtime_ns] for p in files}

    def record_outputs(self, stage: str, directory: str, before: dict[str, list[int]]) -> dict[str, str]:
        """sha256 of the files `stage` wrote (new or changed since `before`). An earlier stage's record of a
        file this stage rewrote moves to its `rewritten_by`, so every hash listed under `outputs` stays true."""
        after = self.snapshot(directory)
        written = {rel: sha256(self.path / rel) for rel in sorted(after) if before.get(rel) != after[rel]}
        m = self.manifest()
        m["stages"].get(stage, {}).pop("before", None)  # the snapshot taken when the stage first started
        for name, entry in m["stages"].items():
            if name == stage:
                continue
            for rel in set(entry.get("outputs", {})) & set(written):
                del entry["outputs"][rel]
                entry.setdefault("rewritten_by", {})[rel] = stage
        self._write_manifest(m)
        return written

    # -- paths --------------------------------------------------------------------------------
    def dir(self, *parts: str) -> Path:
        d = self.path.joinpath(*parts)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def file(self, *parts: str) -> Path:
        return self.path.joinpath(*parts)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
