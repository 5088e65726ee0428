"""The real tokens of each row of a padding mask, in one launch.

A padded batch's mask (batch, length), nonzero on real tokens, comes with every forward of
a transformers model; a decoding step makes one per token. The attention needs each row's
first real token and one past its last (the sequence's bounds), and its check needs to
know whether a row's real tokens are one run (left or right padding) and whether any
token is padding. As PyTorch operations that is a dozen small kernels, each costing the
host several microseconds (docs/performance.md, decoding section); here it is one CTA
per row, walking its mask TILE columns at a time.
"""

import cuda.tile as ct

from .common import ConstInt

# Status of a row: every token real; one run of real tokens with padding beside it (or
# none at all); more than one run (padding between real tokens).
NO_PADDING, ONE_RUN, RUNS = 0, 1, 2


@ct.kernel
def padding_runs(Mask, Runs, TILE: ConstInt):
    """Row b of Mask: Runs[0, b] its first real token's column, Runs[1, b] one past its
    last (0 and 0 with none), Runs[2, b] NO_PADDING, ONE_RUN or RUNS."""
    row = ct.bid(0)
    length = Mask.shape[1]
    count = ct.int32(0)
    run_starts = ct.int32(0)  # real tokens after a padding token or at column 0
    first = length
    last = ct.int32(-1)
    for tile in range(ct.cdiv(length, TILE)):
        columns = tile * TILE + ct.arange(TILE, dtype=ct.int32)
        real = ct.gather(Mask, (row, columns)) != 0  # 0 past the last column
        before = ct.gather(Mask, (row, columns - 1)) != 0  # 0 before column 0
        count += ct.sum(ct.where(real, 1, 0))
        run_starts += ct.sum(ct.where(real & ~before, 1, 0))
        first = min(first, ct.min(ct.where(real, columns, length)))
        last = max(last, ct.max(ct.where(real, columns, -1)))
    start = ct.where(count > 0, first, 0)
    status = ct.where(run_starts > 1, RUNS, ct.where(count == length, NO_PADDING, ONE_RUN))
    ct.scatter(Runs, (0, row), start)
    ct.scatter(Runs, (1, row), last + 1)
    ct.scatter(Runs, (2, row), status)
