"""The property loop's data (`analysis.verification.harness` runs it): a `Task` per property (`FileTask`: an ONNX file
and a VNN-LIB file; `SpecTask`: a graph in memory and its specs), the rechecks that replay a counterexample on the model
itself (`ModuleRecheck`, `OnnxRecheck`), the two ways to spend time (`PerTask`, `StageBudget`), each task's `Outcome`
and each worker's first-pass `Plan`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import first_pass
from .graph import Graph
from .problem import Problem, Result, best_margin, open_reason
from .readers import read
from .vnnlib import VnnlibSpec, read_vnnlib_all

# ---------------------------------------------------------------------------------------------
# tasks


@dataclass
class Task:
    """One property. Subclasses say how its Problem is built; `key` identifies it to the caller."""

    key: Any
    verifier: Any = "auto"  # a registry name or chain, or a Verifier
    timeout: float | None = None  # PerTask: this task's limit (None: the default of PerTask)
    known: Result | None = None  # an answer known without solving (a misclassified sample); nothing is built
    network: str = ""  # its network's name in messages (default: the ONNX file's name, or "network")

    def build(self, cache: dict[Any, Any]) -> Problem:
        raise NotImplementedError

    def network_key(self) -> Any:
        """What identifies its network in a worker: the first pass batches the properties of one network."""
        raise NotImplementedError

    def network_label(self) -> str:
        """Its network in one word, for the first pass's costs."""
        raise NotImplementedError


@dataclass
class FileTask(Task):
    """A VNN-COMP instance: an ONNX file and a VNN-LIB file (plain; `vnncomp` gunzips first)."""

    onnx: Path | None = None
    vnnlib: Path | None = None

    def build(self, cache: dict[Any, Any]) -> Problem:
        for p in (self.onnx, self.vnnlib):
            if p is None or not Path(p).is_file():
                raise FileNotFoundError(f"{p} is missing")
        key = ("graph", str(self.onnx))
        if key not in cache:
            cache[key] = read(self.onnx)
        try:
            specs = read_vnnlib_all(self.vnnlib)
        except ValueError as e:
            first = (str(e).strip().splitlines() or [""])[0]
            raise ValueError(f"malformed VNN-LIB: {first} ({Path(self.vnnlib).name})") from None
        problem = Problem(specs, network=cache[key], onnx=Path(self.onnx), vnnlib_path=Path(self.vnnlib))
        skey = ("session", str(self.onnx))
        if skey not in cache:
            from pipeline import onnx_io  # onnxruntime, imported on first use

            cache[skey] = onnx_io.session(self.onnx)
        problem.cache["session"] = cache[skey]
        for k in range(len(specs)):
            problem.check_shapes(k)
        problem.recheck(specs[0].lb)  # onnxruntime's first run belongs to the preparation
        return problem

    def network_key(self) -> Any:
        return ("file", str(self.onnx))

    def network_label(self) -> str:
        return self.network or (Path(self.onnx).name if self.onnx is not None else "network")


@dataclass
class SpecTask(Task):
    """A property in memory: a graph, its specs, and what a counterexample is re-checked on (default: the graph)."""

    net: Graph | None = None
    specs: list[VnnlibSpec] = field(default_factory=list)
    recheck: Callable[[np.ndarray], np.ndarray] | None = None

    def build(self, cache: dict[Any, Any]) -> Problem:
        return Problem(self.specs, network=self.net, recheck=self.recheck)

    def network_key(self) -> Any:
        return ("graph", id(self.net))  # tasks sent to a worker together share their graph there too

    def network_label(self) -> str:
        return self.network or "network"


class ModuleRecheck:
    """Re-checks a candidate on a torch module in float32. Given `load`, a picklable function that builds the module
    again (`functools.partial(pipeline.checkpoint.load_module, path)`), it travels to worker processes as that
    function and loads the model there on first use (a module with closures does not pickle)."""

    def __init__(self, model: torch.nn.Module | None, input_shape: Sequence[int],
                 load: Callable[[], torch.nn.Module] | None = None):
        self.model, self.input_shape, self.load = model, tuple(input_shape), load

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "model": None} if self.load is not None else self.__dict__

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.many(np.asarray(x).reshape(1, -1))[0]

    def many(self, xs: np.ndarray) -> np.ndarray:
        if self.model is None:
            self.model = self.load()
        with torch.no_grad():
            x = torch.as_tensor(np.asarray(xs), dtype=torch.float32).reshape(-1, *self.input_shape)
            return self.model.eval()(x).double().numpy().reshape(len(x), -1)


class OnnxRecheck:
    """Re-checks a candidate in onnxruntime on an ONNX file (picklable; the session starts on first use)."""

    def __init__(self, path: str | Path):
        self.path, self._session = Path(path), None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_session": None}

    def session(self):
        from pipeline import onnx_io  # onnxruntime, imported on first use

        if self._session is None:
            self._session = onnx_io.session(self.path)
        return self._session

    def __call__(self, x: np.ndarray) -> np.ndarray:
        from pipeline import onnx_io

        return onnx_io.forward_flat(self.session(), x)

    def many(self, xs: np.ndarray) -> np.ndarray:
        from pipeline import onnx_io

        return onnx_io.forward_many(self.session(), xs)


# ---------------------------------------------------------------------------------------------
# how time is spent


@dataclass(frozen=True)
class PerTask:
    timeout: float  # for tasks without their own
    # seconds for all tasks together, on the run's clock (None: no such limit): no task runs past it, one not begun by
    # then is a timeout that says it was not run (a measurement that must end inside another limit,
    # benchmarks/gpu_verify.py)
    wall_s: float | None = None


@dataclass(frozen=True)
class StageBudget:
    seconds: float  # for every task together, on the run's clock (harness.run's `clock`)
    first: float = 1.0  # the first round's limit per task


@dataclass
class Outcome:
    index: int  # position of the task in the list given
    key: Any
    result: Result
    prepare_seconds: float
    final: bool = True  # False: a StageBudget round that did not decide it; a later outcome replaces it

    def row(self) -> dict[str, Any]:
        """The fields every caller's result row shares (the verify stage's details.csv, `api.verify`'s rows, `pipeline
        vnncomp`'s results.csv): the answer, why it is open, the link that answered, its seconds, the best margin bound
        and what found it, and the verifier's message."""
        res = self.result
        margin, bound = best_margin(res.info)
        return {"result": res.status, "reason": open_reason(res), "stage": res.stage, "seconds": res.seconds,
                "margin_lb": margin, "bound": bound, "message": res.message}


@dataclass(frozen=True)
class Plan:
    """What one worker (`worker`, of `workers`) found about its first pass, twice: before it goes on (`reached` None),
    one CROWN pass of each of its networks on the network's first property, alone (`costs`), and `needed`, the seconds
    since the run began by which its pass for every property is estimated to end (a pass per property at the measured
    cost); and after it (`reached` of its `properties` got a finished pass, in `pass_seconds`), `needed`
    extrapolated from the pass's own rate when it did not reach them all (a batched call can cost more per property
    than one alone). `elapsed`: seconds since the run began when it was sent. `shortfall` reads them."""

    costs: list[first_pass.Cost]
    elapsed: float
    needed: float
    workers: int
    limit: float | None = None  # per-task limits: the smallest limit of the tasks measured
    worker: int = 0
    reached: int | None = None
    properties: int = 0
    pass_seconds: float = 0.0
