"""Pre-quantized 4-bit checkpoints (W4A16): GPTQ, AWQ and compressed-tensors' pack-quantized int4, read from the
`quantization_config` of a Hugging Face config.json and converted, a projection at a time, into Sluice's one layout
(kernels.w4a16_layout.W4A16Weight), then cut to the rank's slice.

What loads: 4-bit integer weights in groups of a multiple of 16 inputs, or one group a row (GPTQ's group_size -1,
compressed-tensors' strategy "channel"), symmetric or with zero points; GPTQ's act-order (desc_act) and
compressed-tensors' actorder; GPTQ v1 ("gptq") and v2 ("gptq_v2") zero points; AWQ's GEMM packing. A projection
the checkpoint stores unquantized (modules_to_not_convert, an ignore list) loads as it is stored. What is refused at
start, named: other bit widths, AWQ's GEMV packings, other packings (Marlin, ...), quantized activations, group sizes
not a multiple of 16, GPTQModel's per-module `dynamic` overrides. Under tensor parallelism a row-parallel projection
(o_proj, down_proj) splits its inputs: in whole groups, a split that cuts a group refused; with act-order, whose groups
are scattered over all the inputs, as vLLM does: each rank's run of inputs in their own order, each row naming its
group, every group's scales and zero points on every rank (a run that is no multiple of 16 inputs is refused).
"""
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import torch

from sluice.worker.models.shard_layout import ShardLayout

if TYPE_CHECKING:  # sluice.kernels imports Triton, imported only where a 4-bit checkpoint is read
    from sluice.kernels.w4a16_layout import W4A16Weight

W4A16_METHODS = ("awq", "gptq", "compressed-tensors")  # --quantization's names of the 4-bit checkpoints
W4A16_TENSORS = ("qweight", "qzeros", "scales", "g_idx")  # a GPTQ / AWQ projection's; AWQ has no g_idx
CT_TENSORS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
LAYOUT_TENSORS = ("qweight", "scales", "zeros", "perm", "group_index")  # W4A16Weight's, by the worker's state names
_SUPPORTED = ("4-bit integer weights of quant_method 'gptq' (checkpoint_format 'gptq' or 'gptq_v2'), 'awq' (version "
              "'gemm') or 'compressed-tensors' (format 'pack-quantized', strategy 'group' or 'channel', activations "
              "unquantized), in groups of a multiple of 16 inputs or one group a row")


@dataclass(slots=True, frozen=True)
class W4A16Scheme:
    method: str  # one of W4A16_METHODS
    sym: bool  # GPTQ's: zero point 8, qzeros not read (AWQ and compressed-tensors: whether zero points are stored)
    gptq_v1: bool = True  # GPTQ's checkpoint_format "gptq": each zero point stored minus one

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return CT_TENSORS if self.method == "compressed-tensors" else W4A16_TENSORS

    def convert(self, tensors: dict[str, torch.Tensor]) -> "W4A16Weight":
        """One projection's stored tensors (by tensor_names' suffixes) in the canonical layout."""
        from sluice.kernels.w4a16_layout import from_awq, from_compressed_tensors, from_gptq

        if self.method == "gptq":
            return from_gptq(tensors["qweight"], tensors["scales"], tensors.get("qzeros"), tensors.get("g_idx"),
                             sym=self.sym, v1=self.gptq_v1)
        if self.method == "awq":
            return from_awq(tensors["qweight"], tensors["qzeros"], tensors["scales"])
        n, k = tensors["weight_shape"].tolist() if "weight_shape" in tensors else (None, None)
        packed = tensors["weight_packed"]
        if (n, k) != (None, None) and (n, k) != (packed.shape[0], 8 * packed.shape[1]):
            _refuse(f"compressed-tensors weight_shape {[n, k]} of a packed weight {list(packed.shape)}")
        return from_compressed_tensors(packed, tensors["weight_scale"], tensors.get("weight_zero_point"),
                                       tensors.get("weight_g_idx"))


def w4a16_scheme(hf_config: dict) -> W4A16Scheme | None:
    """The scheme of a 4-bit checkpoint; None for any other (unquantized, FP8, MXFP4); a ValueError naming what a
    4-bit checkpoint's quantization_config asks that the worker cannot run."""
    quantization = hf_config.get("quantization_config") or {}
    method = quantization.get("quant_method")
    if method == "gptq":
        return _gptq(quantization)
    if method == "awq":
        return _awq(quantization)
    if method == "compressed-tensors" and _integer_weights(quantization):
        return _compressed_tensors(quantization)
    return None


def _gptq(config: dict) -> W4A16Scheme:
    _check_bits("gptq", config.get("bits"))
    _check_group("gptq", config.get("group_size", 128))
    checkpoint_format = config.get("checkpoint_format", "gptq")
    if checkpoint_format not in ("gptq", "gptq_v2"):
        _refuse(f"gptq checkpoint_format {checkpoint_format!r}")
    if config.get("dynamic"):
        _refuse("gptq with per-module dynamic overrides")
    return W4A16Scheme("gptq", sym=bool(config.get("sym", True)), gptq_v1=checkpoint_format == "gptq")


def _awq(config: dict) -> W4A16Scheme:
    _check_bits("awq", config.get("bits", config.get("w_bit")))
    _check_group("awq", config.get("group_size", config.get("q_group_size", 128)))
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        _refuse(f"awq version {config.get('version')!r} (only the GEMM packing loads)")
    if not config.get("zero_point", True):
        _refuse("awq without zero points")
    return W4A16Scheme("awq", sym=False)


def _integer_weights(config: dict) -> bool:
    groups = (config.get("config_groups") or {}).values()
    return any((group.get("weights") or {}).get("type") == "int" for group in groups)


def _compressed_tensors(config: dict) -> W4A16Scheme:
    schemes = set()
    for name, group in config["config_groups"].items():
        format_ = group.get("format") or config.get("format")
        if format_ != "pack-quantized":
            _refuse(f"compressed-tensors format {format_!r} (group {name})")
        weights = group.get("weights") or {}
        if weights.get("type") != "int":
            _refuse(f"compressed-tensors integer and {weights.get('type')!r} weights together (group {name})")
        _check_bits(f"compressed-tensors (group {name})", weights.get("num_bits"))
        strategy = weights.get("strategy")
        if strategy == "group":
            _check_group(f"compressed-tensors (group {name})", weights.get("group_size"))
        elif strategy != "channel":
            _refuse(f"compressed-tensors weights of strategy {strategy!r} (group {name})")
        if weights.get("dynamic"):
            _refuse(f"compressed-tensors dynamic weights (group {name})")
        if group.get("input_activations"):
            _refuse(f"compressed-tensors quantized input_activations (group {name}): W4A8 and the like")
        schemes.add(bool(weights.get("symmetric", True)))
    if config.get("kv_cache_scheme"):
        _refuse("compressed-tensors 4-bit weights with a kv_cache_scheme")
    return W4A16Scheme("compressed-tensors", sym=all(schemes))


def _check_bits(method: str, bits) -> None:
    if bits != 4:
        _refuse(f"{method} with {bits!r}-bit weights")


def _check_group(method: str, group) -> None:
    if group in (-1, None):
        return
    if not isinstance(group, int) or group <= 0 or group % 16:
        _refuse(f"{method} with group_size {group!r} (a multiple of 16 loads, or -1: one group a row)")


def shard_w4a16(layout: ShardLayout, name: str, weight: "W4A16Weight") -> "W4A16Weight":
    """The rank's part of a projection's 4-bit weight (name: its Hugging Face module name): column-parallel ones
    (q/k/v, gate/up; nn.Linear's rows) cut along N, row-parallel ones (o, down) along K in whole groups, or with
    act-order in a run of inputs naming their groups (kernels.w4a16_layout.input_run)."""
    from sluice.kernels.w4a16_layout import W4A16Weight, input_run

    pieces = layout.pieces_of(f"{name}.weight")
    if pieces is None:
        return weight
    if pieces[0].dim == 0:
        if any(piece.padded_size != piece.stop - piece.start for piece in pieces):
            raise ValueError(f"{name}'s 4-bit weight cannot be split evenly over {layout.world_size} ranks")
        cut = [slice(piece.start, piece.stop) for piece in pieces]
        return W4A16Weight(*(None if t is None else torch.cat([t[:, c] for c in cut], dim=1).contiguous()
                             for t in (weight.qweight, weight.scales, weight.zeros)), weight.perm)
    piece, k = pieces[0], weight.in_features
    if weight.perm is not None:
        if piece.start % 16 or piece.stop % 16:
            raise ValueError(f"rank {layout.rank} of {layout.world_size} would hold inputs {piece.start}-{piece.stop} "
                             f"of {name}'s {k}, quantized with act-order: a rank's run of them must start and end at "
                             "multiples of 16")
        return input_run(weight, piece.start, piece.stop)
    group = weight.group_size
    per_channel = weight.scales.shape[0] == 1
    step = 8 if per_channel else group
    if piece.start % step or piece.stop % step:
        raise ValueError(f"rank {layout.rank} of {layout.world_size} would hold inputs {piece.start}-{piece.stop} of "
                         f"{name}'s {k}, which cuts its 4-bit weight's groups of {group} inputs")
    rows = slice(piece.start // 8, piece.stop // 8)
    groups = slice(0, 1) if per_channel else slice(piece.start // group, piece.stop // group)
    return W4A16Weight(weight.qweight[rows].contiguous(), weight.scales[groups].contiguous(),
                       None if weight.zeros is None else weight.zeros[groups].contiguous(), None)


def layout_tensors(name: str, weight: "W4A16Weight") -> dict[str, torch.Tensor]:
    """The weight's tensors as the worker's state names them: name.qweight, .scales and, where present, .zeros, .perm
    and .group_index."""
    return {f"{name}.{kind}": getattr(weight, kind) for kind in LAYOUT_TENSORS if getattr(weight, kind) is not None}


def _refuse(what: str) -> NoReturn:
    raise ValueError(f"checkpoint quantization {what} is not supported; 4-bit checkpoints that load: {_SUPPORTED}")


def fuse_w4a16(state: dict[str, torch.Tensor], parts: list[str], fused: str) -> None:
    """In place: the parts' 4-bit weights (q, k, v or gate, up, named in full) concatenated along N into fused's. They
    share their inputs, so act-order checkpoints quantize them in one order (GPTQ orders by the inputs' Hessian); one
    whose parts' act-order permutations differ is refused, as are parts of different group sizes or zero points."""
    perms = [state.pop(f"{part}.perm", None) for part in parts]
    if any((perm is None) != (perms[0] is None) or perm is not None and not torch.equal(perm, perms[0])
           for perm in perms):
        raise ValueError(f"{', '.join(parts)} are quantized with different act-order permutations, but the worker "
                         f"runs them as one projection, {fused}, of one permutation")
    shapes = {(state[f"{part}.scales"].shape[0], f"{part}.zeros" in state) for part in parts}
    if len(shapes) > 1:
        raise ValueError(f"{', '.join(parts)} are quantized in different group sizes or with and without zero points, "
                         f"but the worker runs them as one projection, {fused}")
    for kind in ("qweight", "scales", "zeros"):
        if f"{parts[0]}.{kind}" in state:
            state[f"{fused}.{kind}"] = torch.cat([state.pop(f"{part}.{kind}") for part in parts], dim=1)
    if perms[0] is not None:
        state[f"{fused}.perm"] = perms[0]
