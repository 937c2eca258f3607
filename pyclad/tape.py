"""The ``tape`` backend: the design of a generic interpreter kernel (Shen & Dai).

The graph becomes two instruction tables: a forward sequence (one instruction per node, operands
first) and, per output, a reverse sequence (one instruction per node that output's adjoint flows
through, in the order codegen's unrolled sweep visits them, so both backends do the same
arithmetic). One kernel per (parameter layout, dtype, variant) runs any graph: "compiling" a new
function costs no OpenCL build.

What makes the interpreter fast (each is a :class:`TapeConfig` switch, so the benchmark can
show what each bought):

- **Tuples per work-item.** The op sequence is the same for every tuple, so one dispatch (the
  table read and the switch) serves ``lanes x blocks`` tuples: each value is an OpenCL vector of
  ``lanes`` tuples (the CPU's SIMD width), ``blocks`` of them per work-item.
- **Slots by liveness.** Values and adjoints live in slots, not one cell per node: a value dies
  after its last use (forward, or in the reverse sweeps), an adjoint after its node is swept, so
  the working set is a fraction of the graph and stays in L1 (CPU) or on chip (GPU).
- **Scratch per work-item.** A persistent grid: a fixed set of work-items strides over the
  tuples, each with its own scratch, so the scratch is small, cached and reused by every call
  (``layout="item"``: a work-item's slots contiguous, for CPUs; ``"node"``: slot-major across
  work-items, coalesced, for GPUs; ``"local"``: in local memory, for GPUs; it runs anywhere,
  but on a CPU local memory is ordinary memory).
- **TapeTables in constant memory** (``tables="constant"``), where the device caches them for
  uniform reads.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional

import numpy as np

from clkernels import arrays, templates

from . import codegen, regions
from .graph import postorder
from .ops import FUSED, LEAVES, OPS, to_c
from .trace import Traced

_LEAF_CODES = {leaf: 100 + i for i, leaf in enumerate(LEAVES)}  # past every op code
GUARDED = 128  # added to the op code of a guarded node (see pyclad.ops on guards)
INSTRUCTIONS = (*OPS.values(), *FUSED.values())   # what the interpreter's switches dispatch on
SINK = 0       # the adjoint slot that contributions to non-differentiated operands go to (never read)
ZERO = 1       # with library superinstructions: an adjoint slot that holds zero (never written)
FIRST_BIT = 256       # op code + FIRST_BIT << i: operand i's contribution is the first to its slot
LAYOUTS = ("item", "node", "local")


@dataclasses.dataclass(frozen=True)
class TapeConfig:
    """A variant of the tape backend's interpreter kernel, for
    ``BatchFunction(..., backend="tape", config=...)`` (or ``backend="auto"`` where it picks the
    tape).

    Every field defaults to None: the device's choice (``default_config``), made once per
    device. On a CPU: ``lanes`` the native SIMD width, ``blocks`` up to 8 (as many as keep a
    work-item's slots within 24 KiB), ``layout="item"``, ``tables="global"``, ``wg=1`` and 64
    work-items per compute unit. On a GPU: ``lanes=1``, ``blocks=1``, ``layout="local"`` with
    work-groups of 128 (fewer, down to 32, where 128 work-items' slots would take more than half
    of the local memory; ``layout="node"`` with ``wg=128`` where not even 32 fit),
    ``tables="constant"`` where the tables take at most half of the constant memory (else
    ``"global"``) and 1,024 work-items per compute unit. Both: ``slots``, ``fuse`` and
    ``preload`` True, ``library`` True unless ``cases="all"``, ``sweep="each"``,
    ``cases="used"``. Given fields replace the device's choice.

    Attributes:
        lanes: tuples per OpenCL vector: 1, 2, 4, 8 or 16. On a CPU at most the widest vector
            its compiler targets.
        blocks: vectors per work-item (a positive int); a work-item runs ``lanes * blocks``
            tuples per dispatch of an instruction.
        slots: True: value and adjoint slots allocated by liveness (a value's slot is reused
            after its last use, an adjoint's after its node is swept); False: one slot per node.
        fuse: True: superinstructions, a product fused into the sum that uses it
            (pyclad.ops.FUSED); False: one instruction per op.
        library: True: library superinstructions, a helper such as ``rotate_angle_axis`` run
            as one instruction (pyclad.regions); needs ``cases="used"``. False: the helper's
            ops one by one.
        preload: True: every input and data component loaded into its slot before the forward
            sweep, unrolled (no instruction per input); False: an instruction per input.
        layout: where a work-item's slots live: ``"item"`` (a work-item's slots contiguous, for
            CPUs), ``"node"`` (slot-major across work-items, coalesced, for GPUs) or
            ``"local"`` (in local memory, for GPUs; it runs anywhere).
        tables: the memory of the instruction tables: ``"global"`` or ``"constant"``.
        sweep: ``"each"`` (one reverse sweep per output) or ``"joint"`` (one reverse sweep
            carries every output's adjoint: one dispatch and one read of the values per node;
            at most 31 outputs).
        cases: ``"used"`` (the interpreter's switch has the cases of the graph's own
            instructions only: a kernel per parameter layout and instruction set, built several
            times faster) or ``"all"`` (a case for every op: one kernel per parameter layout for
            any graph).
        work_items: the size of the persistent grid of work-items that stride over the tuples
            (a positive int, rounded up to a multiple of ``wg``).
        wg: the work-group size (a positive int).

    Raises:
        ValueError: a value outside those above, or ``library=True`` with ``cases="all"``. When
            the kernel is made: ``lanes`` wider than a CPU's compiler targets, ``sweep="joint"``
            for a function of more than 31 outputs, or ``layout="local"`` with a ``wg`` whose
            slots need more local memory than the device has.
    """
    lanes: Optional[int] = None
    blocks: Optional[int] = None
    slots: Optional[bool] = None
    fuse: Optional[bool] = None
    library: Optional[bool] = None
    preload: Optional[bool] = None
    layout: Optional[str] = None
    tables: Optional[str] = None
    sweep: Optional[str] = None
    cases: Optional[str] = None
    work_items: Optional[int] = None
    wg: Optional[int] = None

    def __post_init__(self):
        if self.lanes is not None and self.lanes not in (1, 2, 4, 8, 16):
            raise ValueError(f"TapeConfig.lanes must be 1, 2, 4, 8 or 16, not {self.lanes!r}")
        for name in ("blocks", "work_items", "wg"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, np.integer)) or v < 1):
                raise ValueError(f"TapeConfig.{name} must be a positive integer, not {v!r}")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ValueError(f"TapeConfig.layout must be one of {LAYOUTS}, not {self.layout!r}")
        if self.sweep is not None and self.sweep not in ("joint", "each"):
            raise ValueError(f"TapeConfig.sweep must be 'joint' or 'each', not {self.sweep!r}")
        if self.cases is not None and self.cases not in ("used", "all"):
            raise ValueError(f"TapeConfig.cases must be 'used' or 'all', not {self.cases!r}")
        if self.library and self.cases == "all":
            raise ValueError("TapeConfig.library=True needs cases='used' (the kernel of every op has no "
                             "library superinstructions); give one of them")
        if self.tables is not None and self.tables not in ("global", "constant"):
            raise ValueError(f"TapeConfig.tables must be 'global' or 'constant', not {self.tables!r}")

    @property
    def joint(self) -> bool:
        """Whether ``sweep`` is ``"joint"``."""
        return self.sweep == "joint"

    def cache_token(self) -> str:
        """The exact text of this configuration for the binary cache (clkernels.cache)."""
        return repr(dataclasses.astuple(self))

    def tables_key(self):
        """The TapeTables switches (liveness, fused, library, preload) of this config, defaults
        resolved."""
        return (self.slots is not False, self.fuse is not False,
                self.library is not False and self.cases != "all", self.preload is not False)


CPU_SCRATCH_BYTES = 24 << 10   # a CPU work-item's slots: within a core's L1 data cache
MAX_JOINT_OUTPUTS = 31   # a joint sweep's instructions carry a bit per output in an int


def default_config(info, real: str, tables: "TapeTables", n_outputs: int,
                   config: Optional[TapeConfig] = None) -> TapeConfig:
    """The device's variant, with ``config``'s fields where given.

    CPUs: vectors of the native width, as many per work-item as fit L1, slots contiguous per
    work-item, a sweep per output, 64 work-items per core. GPUs: one tuple per work-item
    (work-items are the SIMD lanes), slots in local memory (work-groups of 128, or fewer where
    128 work-items' slots would take more than half of it; slot-major global scratch where
    not even 32 fit), tables in constant memory when they fit, a sweep per output, 1,024
    work-items per compute unit. The GPU choices are the H200's fastest in
    ``benchmarks/bench_tape.py --sweep`` (with library superinstructions the slots are few
    enough for local memory to pay: 0.38-0.45x codegen against 0.30-0.33x in global memory);
    there a joint sweep and two tuples per work-item were slower, a work-item per tuple no
    faster, and capping the registers (``-cl-nv-maxrregcount``) slower at every cap."""
    c = config or TapeConfig()
    if info.is_cpu:
        lanes = c.lanes or codegen.lanes(info, real)   # the native SIMD width, as codegen's
        # As many vectors per work-item as keep its slots within L1 (the dispatch is paid once
        # per instruction for all of them); wg 1: PoCL then adds no work-item loop.
        per_block = (tables.value_slots + tables.adjoint_slots[False]) * lanes * (8 if real == "double" else 4)
        blocks = 8   # more measure no faster (benchmarks/bench_tape.py) and build longer
        while blocks > 1 and blocks * per_block > CPU_SCRATCH_BYTES:
            blocks //= 2
        d = dict(lanes=lanes, blocks=blocks, slots=True, fuse=True, library=c.cases != "all", preload=True, cases="used", layout="item", tables="global", sweep="each",
                 wg=1, work_items=64 * max(1, info.compute_units))
    else:
        joint = c.sweep == "joint"

        def local_bytes(wg):
            return tables.local_bytes(joint, n_outputs if joint else 1, 1, wg, 8 if real == "double" else 4)
        wg = 128
        while wg > 32 and local_bytes(wg) > info.local_mem_bytes // 2:
            wg //= 2
        local = local_bytes(wg) <= info.local_mem_bytes // 2
        d = dict(lanes=1, blocks=1, slots=True, fuse=True, library=c.cases != "all", preload=True, cases="used",
                 layout="local" if local else "node", sweep="each",
                 tables="constant" if tables.nbytes() <= info.max_constant_bytes // 2 else "global",
                 wg=wg if local else 128, work_items=1024 * max(1, info.compute_units))
    d.update({k: v for k, v in dataclasses.asdict(c).items() if v is not None})
    widest = info.widest_vector(real)
    if widest is not None and d["lanes"] > widest:
        # Vectors wider than the CPU compiler's target can abort the build (PoCL 3.0 on an
        # AVX-2 target aborts on a double8 sqrt), so they are refused up front.
        raise ValueError(f"TapeConfig.lanes={d['lanes']}: this CPU device compiles vectors of at most "
                         f"{widest} {real} values; give lanes <= {widest} or leave lanes=None for the native width")
    if d["sweep"] == "joint" and n_outputs > MAX_JOINT_OUTPUTS:
        raise ValueError(f"TapeConfig.sweep='joint' serves at most {MAX_JOINT_OUTPUTS} outputs (a bit each), the function has "
                         f"{n_outputs}; use sweep='each'")
    d["work_items"] = arrays.round_up(d["work_items"], d["wg"])
    return TapeConfig(**d)


_OPERAND = re.compile(r"\b([abcr])\b")


def _uses(expr: Optional[str]) -> set:
    return set(_OPERAND.findall(expr)) if expr else set()


def _operand_loads(op, fields) -> str:
    return "".join(f"const real_t x{s} = V({f}, k); " for s, f in list(zip("abc", fields))[:op.arity])


# The op table's operand names (a, b, c; r the result, g its adjoint) as the kernel's locals.
_NAMES = {s: f"x{s}" for s in "abcrg"}


def forward_cases(real: str, codes=None, table: str = "__global const") -> List[str]:
    """One switch case per op (those of ``codes`` only, if given): the forward instruction
    (op, dst, a, b, c) over the blocks; with ``codes``, also the library superinstructions
    among them (``table``: the tables' address space, which their cases read rows through)."""
    return [f"case OP_{op.name.upper()}: FOR_K {{ {_operand_loads(op, ('f.s2', 'f.s3', 'f.s4'))}"
            f"V(f.s1, k) = {to_c(op.forward, _NAMES, real)}; }} break;"
            for op in INSTRUCTIONS if codes is None or op.code in codes] + \
        [r.forward_case(real, table) for r in regions.regions() if codes is not None and r.code in codes]


def reverse_cases(real: str, joint_outputs: int = 0, labels=None, table: str = "__global const") -> List[str]:
    """The reverse instructions' switch cases, per differentiable op (and its guarded variant).

    A sweep per output (``joint_outputs`` = 0): the instruction reads its node's adjoint and adds
    each operand's contribution, except that the first contribution to a slot in the sweep
    assigns; which ones are first is known when the tables are made, so each subset is a case
    of its own (bit 8 + i of the op code: operand i's contribution assigns), and no slot is ever
    cleared. Joint (m = ``joint_outputs`` > 0): one instruction serves every output whose sweep
    reaches the node (bit o of its mask); the values are read once per output plane, and each
    plane's adjoint is cleared when read, since "first" differs between planes. Either way the
    contributions come in the order of m separate sweeps, so the bits are the same. ``labels``:
    only the cases of these labels (op code with its guard and first bits), library
    superinstructions among them."""
    cases = []
    for label in sorted(labels or ()):
        code = label % FIRST_BIT
        if code in regions.CODES:
            r = next(r for r in regions.regions() if r.code == code)
            first = [bool(label >> (8 + k) & 1) for k in range(r.n_in)]
            cases.append(r.reverse_case(real, table, label, first, joint_outputs))
    for op in INSTRUCTIONS:
        if not op.differentiable:
            continue
        for guarded in ((False, True) if op.singular else (False,)):
            vjps = op.vjp_exprs(guarded)
            uses = set().union(*(_uses(v) for v in vjps))
            loads = "".join(f"const real_t x{s} = V({f}, k); "
                            for s, f in zip("abc", ("r1.s0", "r1.s1", "r1.s2")[:op.arity]) if s in uses)
            if "r" in uses:
                loads += "const real_t xr = V(r0.s1, k); "
            code = op.code + (GUARDED if guarded else 0)
            contributing = [i for i, v in enumerate(vjps) if v is not None]
            if joint_outputs:
                def plane(o):
                    adds = " ".join(f"A(r2.s{i}, {o}, k) += {to_c(vjps[i], _NAMES, real)};" for i in contributing)
                    return (f"if (r0.s3 & {1 << o}) FOR_K {{ {loads}const real_t xg = A(r0.s2, {o}, k); "
                            f"A(r0.s2, {o}, k) = 0; {adds} }}")
                if labels is None or code in labels:
                    cases.append(f"case {code}: {' '.join(plane(o) for o in range(joint_outputs))} break;")
                continue
            for subset in range(1 << len(contributing)):
                first = [i for j, i in enumerate(contributing) if subset >> j & 1]
                adds = " ".join(f"A(r2.s{i}, 0, k) {'=' if i in first else '+='} {to_c(vjps[i], _NAMES, real)};"
                                for i in contributing)
                label = code + sum(FIRST_BIT << i for i in first)
                if labels is not None and label not in labels:
                    continue
                cases.append(f"case {label}: FOR_K {{ {loads}const real_t xg = A(r0.s2, 0, k); {adds} }} break;")
    return cases


def render(group_sizes, data_size: int, n_outputs: int, real: str, jacobians: bool,
           config: TapeConfig, local_slots=(0, 0), instructions=None) -> str:
    """The interpreter kernel for a parameter layout and variant. It depends on a graph only
    through ``instructions`` (``TapeTables.instructions``: the forward op codes and reverse labels
    to compile cases for; None: every case of the op table, for any graph, at several times the
    build time) and ``local_slots`` (the value and adjoint slot counts the "local" layout sizes
    its arrays by)."""
    opcodes = [(op.name, op.code) for op in INSTRUCTIONS] + list(_LEAF_CODES.items())
    codes, labels = instructions if instructions is not None else (None, None)
    table = "__constant" if config.tables == "constant" else "__global const"
    return templates.render(
        "pyclad/tape.cl.mako", real=real, opcodes=opcodes, n_groups=len(group_sizes),
        group_sizes=tuple(group_sizes), data_size=data_size, n_outputs=n_outputs,
        jacobians=jacobians, forward_cases=forward_cases(real, codes, table),
        reverse_cases=reverse_cases(real, n_outputs if config.joint else 0, labels, table),
        zero_slot=ZERO if codes is not None and codes & regions.CODES else -1, preload=config.preload is not False,
        joint=config.joint,
        guard_bit=GUARDED, lanes=config.lanes, blocks=config.blocks, layout=config.layout,
        tables=config.tables, wg=config.wg, local_slots=local_slots)


def _pack(record, width: int) -> List[list]:
    """A flat int record (a library superinstruction's) as table rows of ``width``, zero-padded."""
    record = list(record) + [0] * (-len(record) % width)
    return [record[k:k + width] for k in range(0, len(record), width)]


class _Slots:
    """Greedy slot allocation over intervals [first, last] of a time line."""

    def __init__(self, first_free: int = 0):
        self.free: List[int] = []
        self.count = first_free

    def take(self) -> int:
        if self.free:
            return self.free.pop()
        self.count += 1
        return self.count - 1

    def give(self, slot: int):
        self.free.append(slot)


def instructions(traced: Traced):
    """A graph's instructions, one per node: ``(order, ops, args)``, ``ops[node]`` an op-table
    row or a leaf name, ``args[node]`` its operands (non-leaves only)."""
    graph = traced.graph
    ops = {n: (graph.ops[n] if graph.ops[n] in LEAVES else OPS[graph.ops[n]]) for n in traced.order}
    args = {n: tuple(graph.args[n]) for n in traced.order if graph.ops[n] not in LEAVES}
    return list(traced.order), ops, args, {}


def fuse(traced: Traced, products: bool = True, library: bool = True):
    """:func:`instructions` with superinstructions, plus ``produces`` (region instruction ->
    its output nodes).

    ``library``: each marked region that is exactly its helper's trace becomes one instruction
    (pyclad.regions), keyed by a new id past the graph's nodes, with its inputs as operands; the
    order is then the DFS postorder of the fused graph. ``products``: each product whose only
    use is a sum or a difference is fused into it (pyclad.ops.FUSED) and never stored."""
    graph = traced.graph
    order, ops, args, produces = instructions(traced)
    if library:
        found = regions.find(traced)
        producer = {}
        for i, f in enumerate(found):
            rid = len(graph) + i
            ops[rid], args[rid], produces[rid] = f.region, f.inputs, f.outputs
            producer.update((o, rid) for o in f.outputs)
            for n in f.internal:
                ops.pop(n, None)
                args.pop(n, None)
        if found:
            # Users of a region's outputs depend on its instruction; DFS from the outputs again.
            order = postorder([producer.get(o, o) for o in traced.outputs],
                              lambda n: [producer.get(a, a) for a in args.get(n, ())])
    if not products:
        return order, ops, args, produces
    uses: Dict[int, int] = {}
    for node in order:
        for arg in args.get(node, ()):
            uses[arg] = uses.get(arg, 0) + 1
    outputs = set(traced.outputs)
    absorbed = set()
    for node in order:
        if node in produces or graph.ops[node] not in ("add", "sub") or ops[node] not in OPS.values():
            continue
        op = graph.ops[node]
        for position, m in enumerate(args[node]):
            if m in ops and ops[m] is OPS["mul"] and uses[m] == 1 and m not in outputs and m not in absorbed:
                other = args[node][1 - position]
                name = "muladd" if op == "add" else ("mulsub" if position == 0 else "mulrsub")
                ops[node], args[node] = FUSED[name], (*args[m], other)
                absorbed.add(m)
                break
    return [n for n in order if n not in absorbed], ops, args, produces


class TapeTables:
    """The instruction tables of a traced graph.

    forward (rows, 8) int32: (op, dst value slot, operand value slots a, b, c, constant index);
    leaves: (op, dst, group, component); a library superinstruction takes
    ``Region.forward_rows()`` rows (pyclad.regions). Per sweep scheme (``joint`` False or True,
    the dicts' keys): reverse (k, 3, 4) int32, every sweep's instructions concatenated
    [(op, value slot of r, adjoint slot of the node, mask of outputs reached (joint)),
    (value slots of a, b, c), (adjoint slots of a, b, c)], a superinstruction taking
    ``Region.reverse_units()`` of them; rev_offsets; seeds (each output's adjoint slot, or -1);
    leaf_slots (m, D): each output's adjoint slot of every input component, or -1.

    ``liveness``: slots by liveness (else one per node); ``fused``: product superinstructions;
    ``library``: library superinstructions (pyclad.regions). With a library superinstruction,
    adjoint slot 1 holds zero (the adjoint of a region output no sweep reached)."""

    def __init__(self, traced: Traced, dtype, liveness: bool = True, fused: bool = True, library: bool = True,
                 preload: bool = True):
        order, self.ops, self.args, self.produces = fuse(traced, fused, library)
        self.preload = preload
        # preload: the inputs' components take their slots before the first instruction
        leaves = [n for comps in (*traced.inputs, traced.data) for n in comps if n >= 0] if preload else []
        if preload:
            order = [n for n in order if self.ops.get(n) not in ("input", "data")]
        self.order = order
        self.n_nodes = len(order)
        self.n_library = len(self.produces)
        # Adjoint slots no node takes: the sink, and with a library superinstruction the zero.
        self.reserved = ZERO + 1 if self.produces else SINK + 1
        graph = traced.graph
        results = lambda node: self.produces.get(node, (node,))  # noqa: E731 - the nodes an instruction computes
        # -- the reverse sweeps, as codegen unrolls them: which nodes each visits, and what
        # each contribution reads.
        sweeps = [self._sweep(traced, o) for o in traced.outputs]
        needed_in_reverse = set()
        for sweep in sweeps:
            for node, contribs in sweep:
                if node in self.produces:   # its case recomputes from the inputs
                    needed_in_reverse.update(self.args[node])
                    continue
                vjps = self.ops[node].vjp_exprs(node in traced.guarded)
                uses = set().union(*(_uses(v) for v in vjps))
                if "r" in uses:
                    needed_in_reverse.add(node)
                for s, arg in zip("abc", self.args[node]):
                    if s in uses:
                        needed_in_reverse.add(arg)
        # -- value slots: a value lives from its node to its last forward use, or to the end
        # when a reverse sweep or an output reads it.
        last = {}
        for i, node in enumerate(order):
            for arg in self.args.get(node, ()):
                last[arg] = i
        keep = needed_in_reverse | set(traced.outputs)
        vslot, values = {}, _Slots()
        dying: Dict[int, List[int]] = {}
        ids = {}   # without liveness: a slot per computed node
        for node in leaves:
            vslot[node] = values.take() if liveness else ids.setdefault(node, len(ids))
            if liveness and node not in keep:
                dying.setdefault(last.get(node, 0), []).append(node)
        for i, node in enumerate(order):
            for r in results(node):
                vslot[r] = values.take() if liveness else ids.setdefault(r, len(ids))
                if liveness and r not in keep:
                    dying.setdefault(last.get(r, i), []).append(r)
            for gone in dying.pop(i, []):   # after instruction i has read them
                values.give(vslot[gone])
        self.value_slots = values.count if liveness else len(ids)
        self.reverse, self.rev_offsets, self.leaf_slots, self.adjoint_slots, self.labels = {}, {}, {}, {}, {}
        rows, consts = [], {}
        for node in order:
            op = self.ops[node]
            if node in self.produces:
                rows.extend(_pack([op.code, *(vslot[r] for r in self.produces[node]),
                                   *(vslot[a] for a in self.args[node])], 8))
                continue
            row = [0] * 8
            row[1] = vslot[node]
            if op in LEAVES:
                row[0] = _LEAF_CODES[op]
                if op == "const":
                    consts[len(rows)] = graph.consts[node]
                    row[5] = len(rows)
                else:
                    row[2:4] = graph.leaf[node]
            else:
                row[0] = op.code + (GUARDED if node in traced.guarded else 0)
                for k, arg in enumerate(self.args[node]):
                    row[2 + k] = vslot[arg]
            rows.append(row)
        self.n_rows = len(rows)
        self.forward = np.array(rows or [[0] * 8], np.int32).reshape(-1, 8)   # (a buffer is never empty)
        self.consts = np.zeros(max(1, len(rows)), dtype)
        for i, value in consts.items():
            self.consts[i] = value
        self.codes = self._codes()
        # -- adjoint slots: from a node's first contribution to its own instruction (inputs: to
        # the Jacobian store). Slot 0 is the sink. Each sweep ("each") or the one joint sweep
        # ("joint": a slot holds every output's adjoint of its node) allocates its own.
        D = sum(traced.group_sizes)
        leaf_columns = {node: sum(traced.group_sizes[:g]) + j
                        for g, comps in enumerate(traced.inputs) for j, node in enumerate(comps) if node >= 0}
        self.seeds = {}
        for joint in (False, True) if traced.n_outputs <= MAX_JOINT_OUTPUTS else (False,):
            self.seeds[joint] = np.full(traced.n_outputs, -1, np.int32)
            self.leaf_slots[joint] = np.full((traced.n_outputs, D), -1, np.int32)
            groups = [[o] for o in range(traced.n_outputs)] if not joint else [list(range(traced.n_outputs))]
            rows, offsets, count, labels = [], [0], self.reserved, set()
            for outs in groups:
                aslot, written = self._allocate(traced, sweeps, outs, vslot, rows, labels, liveness, joint)
                for o in outs:
                    if traced.outputs[o] in traced.active:
                        self.seeds[joint][o] = aslot[traced.outputs[o]]
                    for node, col in leaf_columns.items():
                        if (node, o - outs[0]) in written:   # else its column is zero
                            self.leaf_slots[joint][o, col] = aslot[node]
                count = max(count, 1 + max(aslot.values(), default=0))
                offsets.append(len(rows))
            self.adjoint_slots[joint] = count
            self.labels[joint] = frozenset(labels)
            self.reverse[joint] = np.array(rows, np.int32).reshape(-1, 3, 4) if rows else np.zeros((1, 3, 4), np.int32)
            self.rev_offsets[joint] = np.array(offsets, np.int32)
        self.outputs = np.array([vslot[o] for o in traced.outputs], np.int32)
        # each input component's value slot, then each data component's (-1: unused)
        self.input_slots = np.array([vslot.get(n, -1) if n >= 0 else -1
                                     for comps in (*traced.inputs, traced.data) for n in comps] or [-1], np.int32)

    def local_slots(self, joint: bool):
        """The value and adjoint slots of the "local" layout's arrays (rounded up to 8)."""
        return arrays.round_up(self.value_slots, 8), arrays.round_up(self.adjoint_slots[joint], 8)

    def local_bytes(self, joint: bool, planes: int, tuples: int, wg: int, itemsize: int) -> int:
        """Local memory of a work-group of ``wg`` work-items of ``tuples`` tuples each, in the
        "local" layout (``planes`` adjoints per slot: the outputs of a joint sweep, else 1)."""
        values, adjoints = self.local_slots(joint)
        return (values + adjoints * planes) * tuples * wg * itemsize

    def _codes(self) -> frozenset:
        """The forward op codes (leaves and guards aside) of the instructions."""
        return frozenset(self.ops[n].code for n in self.order if self.ops[n] not in LEAVES)

    def _allocate(self, traced, sweeps, outs, vslot, rows, labels, liveness, joint):
        """The reverse instructions of the sweeps of outputs ``outs`` (one sweep if joint),
        appended to ``rows`` (their case labels to ``labels``); returns each node's adjoint
        slot and the (node, plane) pairs that received an adjoint."""
        reached = {}   # node -> mask of the outputs whose sweep reaches it, with its contributions
        contribs = {}
        for o in outs:
            for node, c in sweeps[o]:
                reached[node] = reached.get(node, 0) | (1 << (o - outs[0]))
                contribs[node] = c
        slots, aslot, ids = _Slots(first_free=self.reserved), {}, {}

        def slot_of(node):
            if node not in aslot:
                aslot[node] = slots.take() if liveness else ids.setdefault(node, self.reserved + len(ids))
            return aslot[node]
        written = set()   # (node, plane): its adjoint in that plane has been assigned
        for o in outs:
            if traced.outputs[o] in traced.active:
                slot_of(traced.outputs[o])
                written.add((traced.outputs[o], o - outs[0]))   # the seed
        for node in reversed(self.order):
            if node not in reached:
                continue
            mask = reached[node]
            region = node in self.produces
            owns = [aslot.get(r, ZERO) for r in self.produces[node]] if region else [aslot[node]]
            if liveness:
                for own in owns:
                    if own != ZERO or not region:
                        slots.give(own)   # read before the instruction's first assignment
            op = self.ops[node]
            vjps = op.vjp_exprs(node in traced.guarded) if not region else [
                "g" if c else None for c in op.contributes]   # only None-ness matters here
            r2, first = [], 0
            for i, a in enumerate(self.args[node]):
                if a not in contribs[node]:
                    r2.append(SINK)
                    if vjps[i] is not None:       # a case writes it: let it assign, as the
                        first |= FIRST_BIT << i   # sink is never read (nor cleared)
                    continue
                r2.append(slot_of(a))
                for plane in range(len(outs)):
                    if mask >> plane & 1 and (a, plane) not in written:
                        written.add((a, plane))
                        first |= FIRST_BIT << i
            code = op.code + (GUARDED if node in traced.guarded else 0)
            if not joint:
                code += first             # the case that assigns these (joint: slots are cleared)
            labels.add(code)
            if region:   # rows of 12 ints: a reverse instruction's 3 x 4
                rows.extend(_pack([code, 0, 0, mask if joint else 0, *owns, *(vslot[a] for a in self.args[node]),
                                   *r2], 12))
                continue
            r0 = [code, vslot[node], owns[0], mask if joint else 0]
            r1 = [vslot[a] for a in self.args[node]] + [0] * (4 - len(self.args[node]))
            r2 += [SINK] * (4 - len(r2))
            rows.append(r0 + r1 + r2)
        return aslot, written

    def _sweep(self, traced: Traced, output: int):
        """The instructions output's adjoint flows through, in codegen's order, each with the
        set of its operands that receive a contribution (active, with a vjp)."""
        reached, sweep = {output}, []
        if output not in traced.active:
            return sweep
        for node in reversed(self.order):
            if node in self.produces:
                if reached.intersection(self.produces[node]):
                    contribs = {a for a, c in zip(self.args[node], self.ops[node].contributes)
                                if c and a in traced.active}
                    reached |= contribs
                    sweep.append((node, contribs))
                continue
            if node not in reached or node not in traced.active or self.ops[node] in LEAVES:
                continue
            vjps = self.ops[node].vjp_exprs(node in traced.guarded)
            contribs = {arg for arg, vjp in zip(self.args[node], vjps) if vjp is not None and arg in traced.active}
            reached |= contribs
            sweep.append((node, contribs))
        return sweep

    def instructions(self, joint: bool):
        """The forward op codes and reverse case labels these tables use (hashable): a kernel
        compiled with only their cases runs every graph whose instructions they cover."""
        return self.codes, self.labels[joint]

    def arrays(self, joint: bool) -> list:
        """The kernel's table arguments, in its order."""
        return [self.forward, self.consts, np.int32(self.n_rows), self.reverse[joint], self.rev_offsets[joint],
                self.seeds[joint], self.outputs, self.leaf_slots[joint], *([self.input_slots] if self.preload else [])]

    def nbytes(self, joint: bool = True) -> int:
        joint = joint and joint in self.reverse
        return sum(a.nbytes for a in self.arrays(joint) if isinstance(a, np.ndarray))
