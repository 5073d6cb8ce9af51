"""Which ops the public VNN-COMP benchmarks' networks hold, and does our reader read each network?

    flock /tmp/heavy.lock python -m benchmarks.vnncomp_ops \\
        2022=/work/.mirror/ChristopherBrix+vnncomp2022_benchmarks/repo \\
        2023=/work/.mirror/ChristopherBrix+vnncomp2023_benchmarks/repo \\
        2021=/work/.mirror/stanleybak+vnncomp2021/repo --out benchmarks/vnncomp-ops

A source is `YEAR=PATH`: PATH a VNN-COMP benchmarks repository, either a checkout (`benchmarks/NAME/onnx/*.onnx[.gz]`)
or a bare git directory (read at HEAD with `git cat-file`, so a fetched mirror needs no work tree). mnist_fc and
oval21 are left out (kept for an independent check; 2021 names the first mnistfc), and so is `test` (the competition's smoke files).

Per network: where it could not be had (a blob the snapshot lacks, a Git LFS pointer), its op types with counts, and
what `readers.from_onnx` says: read (the graph's node count, the seconds), refused (the `UnsupportedModel` line, with
whether the node it names is in the graph and has the op it names), or crashed (any other exception: a reader bug).
Per benchmark and op type: the count over its networks, and whether the op is in the reader's table (`readable_ops`),
read only when its inputs are constants (`CONSTANT_OPS`), or not at all. Networks whose graphs are the same but for
their weights (same nodes, attributes and tensor shapes) are read once: a refusal depends on the form, and the
form's one reading stands for them all (its result rows say which file was read).

Writes `ops.json` (every row) and `OPS.md` (the tables) under --out.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

LEFT_OUT = ("mnist_fc", "mnistfc", "oval21", "test")  # mnist_fc (2021: mnistfc) and oval21 kept for an independent check
# what each benchmark's networks compute (from its README); the scope is classification and regression
TASKS = {
    "acasxu": "classification (advisory)", "cifar100_tinyimagenet_resnet": "classification", "cifar2020": "classification",
    "cifar_biasfield": "classification", "collins_rul_cnn": "regression", "nn4sys": "regression",
    "reach_prob_density": "regression (dynamics)", "rl_benchmarks": "control policy", "sri_resnet_a": "classification",
    "sri_resnet_b": "classification", "tllverifybench": "regression (two-level lattice)", "vggnet16_2022": "classification",
    "vggnet16": "classification", "carvana_unet_2022": "segmentation", "cctsdb_yolo": "detection", "cgan": "generation",
    "collins_yolo_robustness": "detection", "dist_shift": "classification (generator + classifier)",
    "metaroom": "classification", "ml4acopf": "regression (power flow)", "traffic_signs_recognition": "classification (binarized)",
    "vit": "classification", "yolo": "detection", "cifar10_resnet": "classification", "eran": "classification",
    "marabou-cifar10": "classification", "verivital": "classification",
}
LFS = b"version https://git-lfs"


class Source:
    """A benchmarks repository: a checkout or a bare git directory (read at HEAD)."""

    def __init__(self, path: Path):
        self.path = path
        self.bare = (path / "HEAD").is_file() and (path / "objects").is_dir()

    def files(self) -> list[tuple[str, int | None]]:
        """(path, size or None when the snapshot lacks the blob) of every file under benchmarks/."""
        if not self.bare:
            return [(str(p.relative_to(self.path)), p.stat().st_size) for p in sorted((self.path / "benchmarks").rglob("*"))
                    if p.is_file()]
        out = subprocess.run(["git", f"--git-dir={self.path}", "ls-tree", "-r", "-l", "HEAD", "benchmarks"],
                             capture_output=True, text=True, check=True).stdout
        rows = []
        for line in out.splitlines():
            meta, name = line.split("\t", 1)
            size = meta.split()[3]
            rows.append((name, int(size) if size.isdigit() else None))
        return rows

    def read(self, name: str) -> bytes:
        if not self.bare:
            return (self.path / name).read_bytes()
        return subprocess.run(["git", f"--git-dir={self.path}", "cat-file", "blob", f"HEAD:{name}"],
                              capture_output=True, check=True).stdout


def onnx_bytes(source: Source, name: str, size: int | None) -> tuple[bytes | None, str | None]:
    """The ONNX file's bytes, or why it could not be had."""
    if size is None:
        return None, "absent from the snapshot (its blob was not fetched)"
    data = source.read(name)
    if name.endswith(".gz") and not data.startswith(LFS):
        data = gzip.decompress(data)
    if data.startswith(LFS):  # a pointer stored as it is, or gzipped by the benchmark's own scripts
        return None, "a Git LFS pointer (the file itself is not in the repository)"
    return data, None


def form(model: Any) -> str:
    """A digest of the graph but for its weights: nodes, their attributes, and every initializer's shape."""
    import onnx

    g = onnx.GraphProto()
    g.CopyFrom(model.graph)
    for t in g.initializer:
        dims = list(t.dims)
        t.Clear()
        t.dims.extend(dims)
    for n in g.node:  # a Constant node's value is a weight too, unless it is small (shapes, axes)
        for a in n.attribute:
            if a.name == "value" and a.t.ByteSize() > 256:
                dims = list(a.t.dims)
                a.t.Clear()
                a.t.dims.extend(dims)
    return hashlib.sha256(g.SerializeToString()).hexdigest()[:16]


def read_one(model: Any) -> dict[str, Any]:
    """What our reader says of one network."""
    from analysis.verification.ops.base import UnsupportedModel
    from analysis.verification.readers import from_onnx

    t0 = time.perf_counter()
    try:
        graph = from_onnx(model)
    except UnsupportedModel as e:
        message = str(e)
        nodes = {n.name: n.op_type for n in model.graph.node}
        row = {"result": "refused", "message": message, "node": e.node, "op": e.op, "one_line": "\n" not in message}
        if e.node is not None:
            row["node_in_graph"] = e.node in nodes
            row["node_op_matches"] = e.op is None or nodes.get(e.node) == e.op
            row["message_names_node"] = e.node in message
        return {**row, "seconds": round(time.perf_counter() - t0, 2)}
    except Exception as e:  # noqa: BLE001 (anything but the one-line refusal is a reader bug, and the measurement)
        first = (str(e).strip().splitlines() or [""])[0]
        return {"result": "crashed", "message": f"{type(e).__name__}: {first[:300]}", "seconds": round(time.perf_counter() - t0, 2)}
    return {"result": "read", "nodes": len(graph.nodes), "seconds": round(time.perf_counter() - t0, 2)}


def op_status(op: str, readable: set[str], constant_only: set[str]) -> str:
    if op in readable:
        return "read"
    if op in constant_only:
        return "constants only"
    return "not read"


def inventory(year: str, source: Source, log: Any = print) -> list[dict[str, Any]]:
    import onnx

    rows = []
    seen: dict[str, dict[str, Any]] = {}
    every = source.files()
    files = [(n, s) for n, s in every if n.endswith((".onnx", ".onnx.gz"))]
    with_onnx = {n.split("/")[1] for n, _ in files}
    for bench in sorted({n.split("/")[1] for n, _ in every if n.count("/") > 1} - with_onnx - set(LEFT_OUT)):
        rows.append({"year": year, "benchmark": bench, "task": TASKS.get(bench, "?"), "file": "-", "result": "not had",
                     "message": "no ONNX file in the repository (its instances.csv names files it does not hold)"})
    for name, size in files:
        bench = name.split("/")[1]
        if bench in LEFT_OUT:
            continue
        row: dict[str, Any] = {"year": year, "benchmark": bench, "task": TASKS.get(bench, "?"), "file": name.split("/")[-1]}
        data, why = onnx_bytes(source, name, size)
        if data is None:
            rows.append({**row, "result": "not had", "message": why})
            log(f"{year} {bench} {row['file']}: not had ({why})")
            continue
        try:
            model = onnx.load_from_string(data)
        except Exception as e:  # noqa: BLE001 (a file onnx cannot parse is not had)
            rows.append({**row, "result": "not had", "message": f"not an ONNX model ({type(e).__name__})"})
            continue
        row["ops"] = dict(Counter(n.op_type for n in model.graph.node))
        row["opset"] = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        key = form(model)
        if key in seen:
            row.update({k: v for k, v in seen[key].items() if k != "seconds"}, same_form_as=seen[key]["file"])
        else:
            result = read_one(model)
            seen[key] = {**result, "file": row["file"]}
            row.update(result)
        rows.append(row)
        log(f"{year} {bench} {row['file']}: {row['result']}" + (f" ({short(row['message'])})" if "message" in row else "")
            + (f" [as {row['same_form_as']}]" if "same_form_as" in row else f" {row.get('seconds', '')} s"))
    return rows


def short(message: str) -> str:
    """A refusal without the reader's list of every op it reads (the same in each)."""
    return message.split("; the verifier reads ")[0]


def tables(rows: list[dict[str, Any]]) -> str:
    from analysis.verification.readers import CONSTANT_OPS, readable_ops

    readable, constant_only = set(readable_ops()), {*CONSTANT_OPS, "Constant"}  # the reader folds Constant nodes itself
    benches: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        benches.setdefault((r["year"], r["benchmark"]), []).append(r)
    out = ["| year | benchmark | task | networks: read / refused / crashed / not had | op types (count over its networks; "
           "*italic*: read only on constants, **bold**: not read) | refusals |", "|---|---|---|---|---|---|"]
    for (year, bench), rs in sorted(benches.items()):
        n = Counter(r["result"] for r in rs)
        ops: Counter = Counter()
        for r in rs:
            ops.update(r.get("ops", {}))
        cells = []
        for op, c in sorted(ops.items()):
            s = op_status(op, readable, constant_only)
            cells.append(f"**{op}** {c}" if s == "not read" else f"*{op}* {c}" if s == "constants only" else f"{op} {c}")
        why = sorted({f"`{short(r['message'])}`" + f" ({sum(1 for x in rs if x.get('message') == r['message'])}×)"
                      for r in rs if r["result"] in ("refused", "crashed", "not had")})
        out.append(f"| {year} | {bench} | {rs[0]['task']} | {n['read']} / {n['refused']} / {n['crashed']} / {n['not had']} "
                   f"| {', '.join(cells) or '-'} | {'<br>'.join(why) or '-'} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sources", nargs="+", help="YEAR=PATH of a VNN-COMP benchmarks repository (checkout or bare git dir)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/vnncomp-ops"))
    a = p.parse_args(argv)
    rows = []
    for s in a.sources:
        year, sep, path = s.partition("=")
        if not sep or not Path(path).is_dir():
            raise SystemExit(f"error: {s!r} is not YEAR=PATH of a benchmarks repository (a checkout or a bare git dir)")
        rows += inventory(year, Source(Path(path)))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "ops.json").write_text("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")  # a row a line
    (a.out / "OPS.md").write_text("# VNN-COMP benchmarks: op types and whether our reader reads each network\n\n"
                                  "Written by `python -m benchmarks.vnncomp_ops` (its docstring says how).\n\n" + tables(rows))
    print(f"wrote {a.out / 'ops.json'} and {a.out / 'OPS.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
