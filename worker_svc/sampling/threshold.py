"""Where a row's sorted order crosses a weight limit, found without sorting: a radix search over the bits of the
values, one histogram per byte (four passes over the vocabulary), each a scatter-add over the whole batch. Each row
adds into 32 histograms, neighbouring elements into different ones, then sums them: most elements of a row land in
few bins (the byte they share, or below or above the bytes found so far), and on a GPU the atomic adds of one bin
queue up.

Keys are the float32 values' bits, mapped so that integer order is the values' order (-0.0 with 0.0); weights are
integers, so every sum is exact whatever order a device adds in, and the search agrees with a sorted cumulative sum."""
import torch

_DIGITS = 256
_BINS = _DIGITS + 2  # bin 0: keys below the bytes found so far; 1 + d: next byte d; the last: keys above
_SPREAD = 32


def ordered_keys(values: torch.Tensor) -> torch.Tensor:
    """[batch, n] float32 -> int32 keys in the values' order."""
    bits = (values + 0.0).view(torch.int32)
    return bits ^ (bits >> 31 & 0x7FFFFFFF)


def threshold_key(keys: torch.Tensor, weights: torch.Tensor,
                  limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The smallest key, per row, among those of positive weight whose larger keys weigh less than `limit` in all;
    the weight of those larger keys; and the weight of the keys equal to it. keys: [batch, n] from ordered_keys;
    weights: [batch, n] integers >= 0; limit: [batch] integers, positive."""
    batch, n = keys.shape
    digit_ids = torch.arange(_DIGITS, device=keys.device)
    histogram_offsets = torch.arange(n, device=keys.device) % _SPREAD * _BINS
    found = torch.full((batch, 1), -2**31, dtype=torch.int64, device=keys.device)  # the key's bytes found so far
    for shift in (24, 16, 8, 0):
        bins = (keys - (found - (1 << shift))).bitwise_right_shift_(shift).clamp_(0, _BINS - 1).add_(histogram_offsets)
        mass = weights.new_zeros(batch, _SPREAD * _BINS).scatter_add_(1, bins, weights)
        mass = mass.view(batch, _SPREAD, _BINS).sum(dim=1)
        digit_mass = mass[:, 1:-1]
        heavier = mass[:, -1:] + digit_mass.flip(1).cumsum(1).flip(1) - digit_mass  # keys above each byte's
        digit = torch.where((heavier < limit.unsqueeze(1)) & (digit_mass > 0), digit_ids, _DIGITS).amin(1, True)
        found += digit << shift
    return found.squeeze(1), heavier.gather(1, digit).squeeze(1), digit_mass.gather(1, digit).squeeze(1)
