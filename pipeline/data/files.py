"""Finding a data set's files: the folders searched (`data.root`, its sub-folders, system folders), and the
download of missing files or archives when `data.download=true` (never otherwise).
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from ..config import DataConfig
from ..errors import DataError


def search_dirs(root: str, name: str, extra: tuple[str, ...] = ()) -> list[Path]:
    base = Path(root).expanduser()
    dirs = [base, base / name, base / name.replace("_", "-")]
    return dirs + [Path(e) for e in extra]


def find(files: list[str], dirs: list[Path]) -> Path | None:
    for d in dirs:
        if all((d / f).is_file() for f in files):
            return d
    return None


def download(urls: dict[str, str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for fname, url in urls.items():
        target = dest / fname
        if target.is_file():
            continue
        tmp = target.with_suffix(target.suffix + ".part")
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
                f.write(r.read())
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DataError(f"download of {url} failed ({exc}); copy {fname} into {dest} by hand") from None
        os.replace(tmp, target)


def locate(cfg: DataConfig, name: str, files: list[str], urls: dict[str, str], hint: str,
           extra_dirs: tuple[str, ...] = ()) -> Path:
    dirs = search_dirs(cfg.root, name, extra_dirs)
    found = find(files, dirs)
    if found is not None:
        return found
    if cfg.download:
        dest = Path(cfg.root).expanduser() / name
        download(urls, dest)
        return dest
    looked = ", ".join(str(d) for d in dirs)
    raise DataError(f"{name}: {', '.join(files)} not found (looked in {looked}); {hint}, or rerun with data.download=true")


def fetch_archive(url: str, dest: Path) -> None:
    """Download a .tar.gz or .zip into dest and unpack it there (data.download=true only)."""
    import tarfile
    import zipfile

    dest.mkdir(parents=True, exist_ok=True)
    fname = url.rsplit("/", 1)[-1]
    download({fname: url}, dest)
    archive = dest / fname
    try:
        if fname.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(dest)
        else:
            with tarfile.open(archive) as t:
                t.extractall(dest, filter="data")
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise DataError(f"cannot unpack {archive} ({exc}); delete it and retry, or unpack it by hand into {dest}") from None


def locate_folder(cfg: DataConfig, name: str, files: list[str], url: str, hint: str) -> Path:
    """Like `locate`, for data sets shipped as one archive holding a folder of files."""
    dirs = list(dict.fromkeys(search_dirs(cfg.root, name)))
    found = find(files, dirs)
    if found is None and cfg.download:
        dest = Path(cfg.root).expanduser()
        fetch_archive(url, dest)
        found = find(files, dirs)
    if found is None:
        looked = ", ".join(str(d) for d in dirs)
        raise DataError(f"{name}: {files[0].split('/')[0]}/ with {', '.join(f.split('/')[-1] for f in files)} not found "
                        f"(looked in {looked}); {hint}, or rerun with data.download=true")
    return found
