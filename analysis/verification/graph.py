"""The network every verification tool here works on: a computational graph (a DAG) of `ops`.

Node 0 is the input; every other node applies one op to the outputs of earlier nodes (the list is in
topological order, so back-substitution visits it backwards and each node's coefficients are complete when
it is reached). Values are flat float64 vectors per example (`ops` says why). A chain of layers is the
special case where node k reads node k − 1 (`Graph.sequential`).

Readers (the `readers` package) build a Graph from ONNX, and from a torch module through its ONNX export, on the CPU; `to`
moves it to another device, and every tool that works on a graph computes on `Graph.device` (the weights' device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .ops.affine import compose
from .ops.base import DTYPE, Activation, Affine, Op, as_tensor, numel
from .ops.gates import Gate
from .ops.relu import ReLU


@dataclass(eq=False)
class Node:
    op: Op | None  # None: the graph input
    inputs: tuple[int, ...]
    name: str = ""  # where it came from (an ONNX node name, a module path): for messages

    def __post_init__(self) -> None:
        self.inputs = tuple(int(i) for i in self.inputs)


class Graph:
    """input_shape (no batch axis) and nodes[0] = the input, nodes[1:] ops on earlier nodes; `output` a node id."""

    def __init__(self, input_shape: Sequence[int], nodes: Sequence[Node], output: int | None = None):
        self.input_shape = tuple(int(d) for d in input_shape)
        self.nodes = list(nodes)
        if not self.nodes or self.nodes[0].op is not None:
            self.nodes.insert(0, Node(None, (), "input"))
        self.output = len(self.nodes) - 1 if output is None else int(output)
        self.sizes = [numel(self.input_shape)]
        for k, node in enumerate(self.nodes[1:], start=1):
            if node.op is None or any(not 0 <= i < k for i in node.inputs) or len(node.inputs) != node.op.arity:
                raise ValueError(f"node {k} ({node.name or type(node.op).__name__}) must apply an op to {getattr(node.op, 'arity', '?')} "
                                 f"earlier nodes, got inputs {node.inputs}")
            got = tuple(self.sizes[i] for i in node.inputs)
            if got != node.op.in_sizes():
                raise ValueError(f"node {k} ({type(node.op).__name__} {node.name}) takes sizes {node.op.in_sizes()}, gets {got}")
            self.sizes.append(node.op.out_size)
        if not 0 <= self.output < len(self.nodes):
            raise ValueError(f"output node {self.output} does not exist")
        devices = {t.device for n in self.nodes[1:] for t in n.op.tensors()}
        if len(devices) > 1:
            raise ValueError(f"the graph's ops live on several devices ({', '.join(sorted(map(str, devices)))}); use Graph.to")
        self.device = devices.pop() if devices else torch.device("cpu")
        self._moved: dict[torch.device, Graph] = {}

    @classmethod
    def sequential(cls, input_shape: Sequence[int], ops: Sequence[Op]) -> "Graph":
        """A chain: op k reads the output of op k − 1 (the first reads the input)."""
        return cls(input_shape, [Node(op, (k,)) for k, op in enumerate(ops)])

    def to(self, device: torch.device | str) -> "Graph":
        """The same graph with every op's tensors on `device` (itself when they are there already; one copy per device)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device == self.device:
            return self
        if device not in self._moved:
            self._moved[device] = Graph(self.input_shape, [Node(None if n.op is None else n.op.to(device), n.inputs, n.name)
                                                           for n in self.nodes], self.output)
        return self._moved[device]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_moved": {}}  # a worker process moves its own copy

    # -- facts --------------------------------------------------------------------------------
    @property
    def num_inputs(self) -> int:
        return self.sizes[0]

    @property
    def num_outputs(self) -> int:
        return self.sizes[self.output]

    @property
    def activations(self) -> list[int]:
        """Node ids of the activation nodes (ReLU, Gate), in topological order: the sites of the bounds."""
        return [k for k, n in enumerate(self.nodes) if isinstance(n.op, Activation)]

    @property
    def is_relu(self) -> bool:
        """Every activation a ReLU: what the MILP encodes exactly and branch and bound decides completely."""
        return all(isinstance(self.nodes[k].op, ReLU) for k in self.activations)

    @property
    def smooth(self) -> bool:
        """Has smooth gates (what the swap turns into ReLUs)."""
        return any(isinstance(n.op, Gate) for n in self.nodes)

    @property
    def num_relus(self) -> int:
        """Units of the ReLU and gate sites: what branch and bound splits or α-CROWN optimizes (an int8 graph's
        roundings and first quantization, fixed relaxations, are not counted)."""
        return sum(self.sizes[k] for k in self.activations if isinstance(self.nodes[k].op, (ReLU, Gate)))

    def consumers(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for k, n in enumerate(self.nodes):
            for i in n.inputs:
                out[i].append(k)
        return out

    def ancestors(self, node: int) -> set[int]:
        """Every node `node`'s value depends on, itself included."""
        seen, todo = {node}, [node]
        while todo:
            for i in self.nodes[todo.pop()].inputs:
                if i not in seen:
                    seen.add(i)
                    todo.append(i)
        return seen

    # -- evaluation ---------------------------------------------------------------------------
    def values(self, x: torch.Tensor | np.ndarray, upto: int | None = None) -> list[torch.Tensor | None]:
        """Every node's value [B, size] for flat inputs x [B, n] (float64, differentiable in a tensor x; on the graph's
        device), up to node `upto` (default: the output); nodes `upto` does not depend on are None."""
        h = x.to(self.device, DTYPE) if isinstance(x, torch.Tensor) else as_tensor(x, self.device)
        h = h.reshape(h.shape[0] if h.dim() > 1 else 1, -1)
        upto = self.output if upto is None else upto
        need = self.ancestors(upto)
        vals: list[torch.Tensor | None] = [None] * len(self.nodes)
        vals[0] = h
        for k in range(1, upto + 1):
            if k in need:
                node = self.nodes[k]
                vals[k] = node.op.forward(*(vals[i] for i in node.inputs))
        return vals

    def forward(self, x: torch.Tensor | np.ndarray, upto: int | None = None) -> torch.Tensor:
        """The output (or node `upto`) for flat inputs [B, n], or [n] for one input, in float64."""
        flat = (x.dim() if isinstance(x, torch.Tensor) else np.ndim(x)) == 1
        out = self.values(x, upto)[self.output if upto is None else upto]
        return out[0] if flat else out

    # -- rewrites -----------------------------------------------------------------------------
    def merged(self) -> "Graph":
        """Chains of one-input affine ops fused (Linear/Scale runs into one Linear, a per-channel Scale into the Conv
        before it): exact up to float64 rounding, and fewer back-substitution steps. A node is fused into its
        consumer only when that is its one consumer and no activation reads it (its bounds are then never asked for)."""
        cons = self.consumers()
        new: list[Node] = [self.nodes[0]]
        where = {0: 0}  # old id -> new id
        for k, node in enumerate(self.nodes[1:], start=1):
            inputs = tuple(where[i] for i in node.inputs)
            if isinstance(node.op, Affine) and node.op.arity == 1 and inputs[0] != 0:
                j_old = node.inputs[0]
                prev = new[inputs[0]]
                if (isinstance(prev.op, Affine) and prev.op.arity == 1 and len(cons[j_old]) == 1 and j_old != self.output):
                    fused = compose(prev.op, node.op)
                    if fused is not None:
                        new[inputs[0]] = Node(fused, prev.inputs, prev.name or node.name)
                        where[k] = inputs[0]
                        continue
            where[k] = len(new)
            new.append(Node(node.op, inputs, node.name))
        return Graph(self.input_shape, new, where[self.output])

    def relu_version(self) -> "Graph":
        """Every Gate replaced by ReLU (the swap stage's network, same weights)."""
        nodes = [Node(ReLU(n.op.size, n.op.source) if isinstance(n.op, Gate) else n.op, n.inputs, n.name) for n in self.nodes]
        return Graph(self.input_shape, nodes, self.output)

    def pruned(self) -> "Graph":
        """Only the nodes the output depends on."""
        keep = sorted(self.ancestors(self.output))
        where = {old: new for new, old in enumerate(keep)}
        return Graph(self.input_shape, [Node(self.nodes[k].op, tuple(where[i] for i in self.nodes[k].inputs), self.nodes[k].name)
                                        for k in keep], where[self.output])

    def describe(self) -> str:
        """One line: the op counts (for messages and reports)."""
        from collections import Counter

        c = Counter(type(n.op).__name__ for n in self.nodes[1:])
        return ", ".join(f"{v} {k}" for k, v in sorted(c.items())) + f"; {self.num_inputs} inputs, {sum(self.sizes[k] for k in self.activations)} activation units"
