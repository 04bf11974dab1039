"""The KV cache's share of a GPU: a worst-case step (and a vision tower's worst-case pass) profiled under
gpu_memory_utilization."""
import torch

from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.runner.kv_cache import allocate_kv_cache


@torch.inference_mode()
def profile_kv_cache_bytes(model, model_config, cos_sin_cache, block_size: int, dtype: torch.dtype,
                           max_num_batched_tokens: int, max_num_seqs: int, gpu_memory_utilization: float,
                           max_num_encoder_input_tokens: int = 0) -> int:
    """Runs a worst-case step (a full token budget of prefill, logits for max_num_seqs rows; with
    max_num_encoder_input_tokens, first the vision tower over one image of that many placeholders) and returns the
    bytes left for the KV cache under gpu_memory_utilization of the whole device."""
    device = cos_sin_cache.device
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    if max_num_encoder_input_tokens:
        vision = model.config.vision
        merge = vision.spatial_merge_size
        grid_thw = torch.tensor([[1, merge, merge * max_num_encoder_input_tokens]])
        model.image_embeddings(torch.zeros(int(grid_thw.prod()), vision.patch_dim, device=device), grid_thw)
    num_tokens = max_num_batched_tokens
    num_blocks = -(-num_tokens // block_size)
    kv_caches = allocate_kv_cache(model_config, num_blocks, block_size, dtype, device)
    positions = torch.arange(num_tokens, device=device) % cos_sin_cache.shape[0]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(num_tokens, device=device),
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
        block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
        token_seq_index=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        token_query_pos=torch.arange(num_tokens, device=device),
        max_query_len=num_tokens, max_seq_len=num_tokens)
    input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    logits_indices = torch.arange(min(max_num_seqs, num_tokens), device=device)
    logits = model(input_ids, positions, cos_sin_cache, kv_caches, meta, logits_indices)
    logits.softmax(dim=-1)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(device) - sum(k.numel() * k.element_size() * 2 for k, _ in kv_caches)
    del kv_caches, logits
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    outside_torch = total - free - torch.cuda.memory_reserved(device)
    return max(int(total * gpu_memory_utilization) - peak - outside_torch, 0)
