"""Mixture-of-experts routing: softmax over the router logits, the top-k experts, optionally renormalized, in one
kernel (Hugging Face's Qwen3-MoE / Mixtral / OLMoE router)."""
import torch
import triton
import triton.language as tl

from sluice.kernels.dependent_launch import dependent_launch, wait_for_inputs


@triton.jit(do_not_specialize=["num_tokens"])  # changes every step: compile once
def _topk_softmax_kernel(
    logits_ptr, weights_ptr, ids_ptr, num_tokens, num_experts, stride_l,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """Program `pid` routes BLOCK_T tokens, each row of logits held whole (BLOCK_E >= num_experts).

    The row's softmax is exp(x - max) / sum in float32. The top k are taken by k rounds of argmax over the logits
    (the softmax is monotonic, so this is the top k of the probabilities; equal logits go to the lowest expert id),
    each round masking the expert it took; the chosen probabilities come out in descending order, as torch.topk
    returns them. With RENORMALIZE they are divided by their sum. Weights float32, ids int32, both [tokens, k].
    """
    wait_for_inputs(PDL)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_mask = rows < num_tokens
    col_mask = cols < num_experts
    x = tl.load(logits_ptr + rows.to(tl.int64)[:, None] * stride_l + cols[None, :],
                mask=row_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
    x = tl.where(col_mask[None, :], x, float("-inf"))  # [BLOCK_T, BLOCK_E]

    # -- softmax denominators
    row_max = tl.max(x, 1)
    denom = tl.sum(tl.exp(x - row_max[:, None]), 1)

    # -- k rounds of argmax, gathered into [BLOCK_T, BLOCK_K]
    slots = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_T, BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_T, BLOCK_K], tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(x, 1)
        best_id = tl.min(tl.where(x == best[:, None], cols[None, :], BLOCK_E), 1)
        weights = tl.where(slots[None, :] == j, (tl.exp(best - row_max) / denom)[:, None], weights)
        ids = tl.where(slots[None, :] == j, best_id[:, None], ids)
        x = tl.where(cols[None, :] == best_id[:, None], float("-inf"), x)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, 1)[:, None]

    out = rows.to(tl.int64)[:, None] * TOP_K + slots[None, :]
    mask = row_mask[:, None] & (slots < TOP_K)[None, :]
    tl.store(weights_ptr + out, weights, mask=mask)
    tl.store(ids_ptr + out, ids, mask=mask)


def topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                 pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights float32 [T, k], topk_ids int32 [T, k]) for router_logits [T, num_experts] in any float dtype:
    the k largest softmax probabilities of each row, in descending order, divided by their sum with renormalize."""
    if router_logits.dim() != 2 or router_logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"router_logits must be float [num_tokens, num_experts], got {router_logits.dtype} "
                         f"{tuple(router_logits.shape)}")
    num_tokens, num_experts = router_logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be in [1, {num_experts}]")
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=logits.device)
    if num_tokens:
        block_e = triton.next_power_of_2(num_experts)
        # NOTE: about 4K logits a program (32 tokens of 128 experts), so a decode step is one program and a
        # 4096-token prefill 128; not measured on a GPU yet (benchmarks/fused_moe.py times it).
        block_t = min(triton.next_power_of_2(num_tokens), max(1, 4096 // block_e))
        _topk_softmax_kernel[(triton.cdiv(num_tokens, block_t),)](
            logits, weights, ids, num_tokens, num_experts, logits.stride(0),
            TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_T=block_t, BLOCK_E=block_e,
            BLOCK_K=triton.next_power_of_2(top_k), num_warps=4, **dependent_launch(logits.device, pdl),
        )
    return weights, ids


def topk_softmax_ref(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch, as Hugging Face's Qwen3-MoE router computes it."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids.to(torch.int32)
