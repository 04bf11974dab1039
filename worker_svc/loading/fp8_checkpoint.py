"""Pre-quantized FP8 checkpoints, loaded as they are published: the `quantization_config` of a Hugging Face
config.json, and their tensors in the layout of fp8.Fp8Linear.

Four layouts load: quant_method "fp8", compressed-tensors' 8-bit float weights ("float-quantized" or "naive-quantized"),
"fbgemm_fp8" and NVIDIA ModelOpt's "modelopt" (quant_algo FP8 or FP8_PER_CHANNEL_PER_TOKEN, in config.json or in the
hf_quant_config.json of its first releases). They store each projection's weight in e4m3 with a weight_scale per tensor
([] or [1]) or per output channel ([out] or [out, 1]); a per-tensor scale becomes that value on every row, which is
exact. A block-wise weight (fp8's weight_block_size with weight_scale_inv, compressed-tensors' strategy "block" with
weight_scale; one scale per block of, say, 128 x 128) is dequantized at load and quantized again per output channel, as
`--quantization fp8` quantizes a float weight (fp8_scales.py), so the same FP8 GEMMs run it. A projection
stored unquantized (on the checkpoint's ignore list) runs unquantized (fp8.keep_stored_precision). Activations are
quantized per token on every step, as with `--quantization fp8`, whatever the checkpoint's activation scheme (a static
input_scale is not read), each token's absolute maximum clipped to fbgemm_fp8's activation_scale_ub. A calibrated KV
cache, AutoFP8's kv_cache_scheme "static", compressed-tensors' 8-bit floats with one scale per tensor (llm-compressor's,
with or without quantized weights) or ModelOpt's kv_cache_quant_algo FP8, gives the layers' k_scale / v_scale, which an
FP8 KV cache (`--kv-cache-dtype fp8`) stores with (kv_scales.py). Any other method or scheme (integer weights, FP8
weights in groups, a KV cache per head) fails at start, named in the error.
"""
import json
from pathlib import Path
from typing import NoReturn

_SUPPORTED = ("quant_method 'fp8', 'fbgemm_fp8', 'modelopt' (FP8) or 'compressed-tensors' with 8-bit float weights, "
              "one scale per tensor, per output channel or per block; a calibrated KV cache of 8-bit floats, one "
              "scale per tensor; 4-bit integer weights of 'gptq', 'awq' or 'compressed-tensors' (w4a16_checkpoint.py)")
_MODELOPT_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")
_COMPRESSED_FORMATS = ("float-quantized", "naive-quantized")


def quantization_config(folder: Path, hf_config: dict) -> dict | None:
    """The checkpoint's quantization_config: config.json's, or else the one of ModelOpt's hf_quant_config.json."""
    legacy = folder / "hf_quant_config.json"
    if "quantization_config" in hf_config or not legacy.exists():
        return hf_config.get("quantization_config")
    return {"quant_method": "modelopt", **json.loads(legacy.read_text()).get("quantization", {})}


def checkpoint_quantization(hf_config: dict) -> str | None:
    """"fp8" for a supported checkpoint of FP8 weights, None for unquantized weights (KV-cache scales alone included);
    a ValueError for anything else."""
    quantization = hf_config.get("quantization_config")
    if quantization is None:
        return None
    method = quantization.get("quant_method")
    if method not in ("fp8", "compressed-tensors", "fbgemm_fp8", "modelopt"):
        _refuse(f"quant_method {method!r}")
    if method == "modelopt":
        _check_modelopt(quantization)
        return "fp8"
    if quantization.get("kv_cache_scheme"):
        _check_kv_cache_scheme(method, quantization["kv_cache_scheme"])
        if method == "compressed-tensors" and not quantization.get("config_groups"):
            return None  # KV-cache scales alone
    if method == "fp8":
        _check_fp8(quantization)
    elif method == "compressed-tensors":
        _check_compressed_tensors(quantization)
    return "fp8"


def activation_absmax_bound(hf_config: dict) -> float | None:
    """fbgemm_fp8's activation_scale_ub, the largest absolute value a token's activation scale maps to e4m3's range;
    None for other checkpoints, or one without the bound."""
    quantization = hf_config.get("quantization_config") or {}
    bound = quantization.get("activation_scale_ub") if quantization.get("quant_method") == "fbgemm_fp8" else None
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 < bound < float("inf"):
        _refuse(f"fbgemm_fp8 activation_scale_ub {bound!r}")
    return float(bound)


def weight_block_size(hf_config: dict) -> tuple[int, int] | None:
    """(rows, columns) of a block-wise checkpoint's weight blocks, which checkpoint_quantization has checked; None for
    any other checkpoint."""
    quantization = hf_config.get("quantization_config") or {}
    if quantization.get("quant_method") == "fp8":
        block = quantization.get("weight_block_size")
    else:
        groups = (quantization.get("config_groups") or {}).values()
        block = next((group["weights"]["block_structure"] for group in groups
                      if (group.get("weights") or {}).get("strategy") == "block"), None)
    return tuple(block) if block else None


def _check_fp8(quantization: dict) -> None:
    if quantization.get("weight_block_size") is not None:
        _check_block(quantization["weight_block_size"], "fp8 weight_block_size")
    if quantization.get("fmt", "e4m3") != "e4m3":
        _refuse(f"fp8 in {quantization['fmt']}")


def _check_compressed_tensors(quantization: dict) -> None:
    groups = quantization.get("config_groups") or {}
    if not groups:
        _refuse("compressed-tensors without config_groups")
    if len({(group.get("weights") or {}).get("strategy") == "block" for group in groups.values()}) > 1:
        _refuse("compressed-tensors groups of block-wise and other weights together")
    for name, group in groups.items():
        format_ = group.get("format") or quantization.get("format")
        if format_ not in _COMPRESSED_FORMATS:
            _refuse(f"compressed-tensors format {format_!r} (group {name})")
        weights = group.get("weights") or {}
        if (weights.get("num_bits"), weights.get("type")) != (8, "float") or \
                weights.get("strategy") not in ("tensor", "channel", "block"):
            _refuse(f"compressed-tensors weights {_scheme(weights)} (group {name})")
        if weights["strategy"] == "block":
            _check_block(weights.get("block_structure"), f"compressed-tensors block_structure (group {name})")
        activations = group.get("input_activations")
        if activations and (activations.get("num_bits"), activations.get("type")) != (8, "float"):
            _refuse(f"compressed-tensors input_activations {_scheme(activations)} (group {name})")


def _check_modelopt(quantization: dict) -> None:
    algo = str(quantization.get("quant_algo")).upper()
    if algo not in _MODELOPT_ALGOS:
        _refuse(f"modelopt quant_algo {quantization.get('quant_algo')!r}")
    scheme = quantization.get("kv_cache_scheme")
    kv_algo = quantization.get("kv_cache_quant_algo") or ("FP8" if scheme else None)
    if kv_algo is not None and (str(kv_algo).upper() != "FP8" or scheme and not _floats_per_tensor(scheme)):
        _refuse(f"modelopt kv_cache_quant_algo {kv_algo!r}, kv_cache_scheme {scheme!r}")


def _check_block(block, what: str) -> None:
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(size, int) and size > 0 for size in block)):
        _refuse(f"{what} {block!r}")


def _check_kv_cache_scheme(method: str, scheme: dict | str) -> None:
    """AutoFP8's "static" (k_proj / v_proj output_scale) or compressed-tensors' static 8-bit floats per tensor."""
    if (method, scheme) != ("fp8", "static") and not (method == "compressed-tensors" and _floats_per_tensor(scheme)):
        _refuse(f"{method} with kv_cache_scheme {scheme!r}")


def _floats_per_tensor(scheme) -> bool:
    """A KV-cache scheme of static, symmetric 8-bit floats with one scale per tensor."""
    return isinstance(scheme, dict) and scheme.get("symmetric", True) and not scheme.get("dynamic") and \
        (scheme.get("num_bits"), scheme.get("type"), scheme.get("strategy", "tensor")) == (8, "float", "tensor")


def _scheme(args: dict) -> str:
    return ", ".join(f"{key} {args.get(key)!r}" for key in ("num_bits", "type", "strategy"))


def _refuse(what: str) -> NoReturn:
    raise ValueError(f"checkpoint quantization {what} is not supported; checkpoints that load: {_SUPPORTED}")
