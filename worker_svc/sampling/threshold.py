"""Where a row's sorted order crosses a weight limit, found without sorting: a radix search over the bits of the
values, one histogram per byte (four passes over the vocabulary), each a scatter-add over the whole batch.

Keys are the float32 values' bits, mapped so that integer order is the values' order (-0.0 with 0.0); weights are
integers, so every sum is exact whatever order a device adds in, and the search agrees with a sorted cumulative sum.
On a GPU, where the scatter-adds of a row's many keys into few bins queue up, kernels.threshold_search finds the same
key without atomics."""
import torch

from sluice.worker.sampling import kernel_path

_DIGITS = 256


def ordered_keys(values: torch.Tensor) -> torch.Tensor:
    """[batch, n] float32 -> int32 keys in the values' order."""
    bits = (values + 0.0).view(torch.int32)
    return bits ^ (bits >> 31 & 0x7FFFFFFF)


def threshold_key(keys: torch.Tensor, weights: torch.Tensor | None,
                  limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The smallest key, per row, among those of positive weight whose larger keys weigh less than `limit` in all;
    the weight of those larger keys; and the weight of the keys equal to it. keys: [batch, n] from ordered_keys;
    weights: [batch, n] int64 >= 0, or None where every key weighs 1; limit: [batch] int64, positive, at most the
    row's total weight."""
    if kernel_path.runs_kernels(keys):
        from sluice.kernels.threshold_search import threshold_search  # every CUDA build of torch brings Triton
        return threshold_search(keys, weights, limit)[:3]
    if weights is None:
        weights = keys.new_ones(()).expand_as(keys)
    batch = keys.shape[0]
    digit_ids = torch.arange(_DIGITS, device=keys.device)
    found = torch.full((batch, 1), -2**31, dtype=torch.int64, device=keys.device)  # the key's bytes found so far
    for shift in (24, 16, 8, 0):
        # bin 0: keys below the bytes found so far; 1 + d: next byte d; the last: keys above
        bins = (keys - (found - (1 << shift))).bitwise_right_shift_(shift).clamp_(0, _DIGITS + 1)
        mass = weights.new_zeros(batch, _DIGITS + 2).scatter_add_(1, bins, weights)
        digit_mass = mass[:, 1:-1]
        heavier = mass[:, -1:] + digit_mass.flip(1).cumsum(1).flip(1) - digit_mass  # keys above each byte's
        digit = torch.where((heavier < limit.unsqueeze(1)) & (digit_mass > 0), digit_ids, _DIGITS).amin(1, True)
        found += digit << shift
    return found.squeeze(1), heavier.gather(1, digit).squeeze(1), digit_mass.gather(1, digit).squeeze(1)
