"""Plain Triton versions of the few helpers Inductor's kernels call from its private
`triton_helpers` module, written for the generated files (only the ones a file uses are
copied into it). Each is a small @triton.jit function over `tl` only."""

from __future__ import annotations

# name -> (source, names of other helpers it calls)
HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "maximum": ('''
@triton.jit
def maximum(a, b):
    # NaN wins, as in torch.maximum
    mask = a > b
    if a.dtype.is_floating():
        mask = mask | (a != a)
    return tl.where(mask, a, b)
''', ()),
    "minimum": ('''
@triton.jit
def minimum(a, b):
    # NaN wins, as in torch.minimum
    mask = a < b
    if a.dtype.is_floating():
        mask = mask | (a != a)
    return tl.where(mask, a, b)
''', ()),
    "max2": ('''
@triton.jit
def max2(a, dim):
    return tl.reduce(a, dim, maximum)
''', ("maximum",)),
    "min2": ('''
@triton.jit
def min2(a, dim):
    return tl.reduce(a, dim, minimum)
''', ("minimum",)),
    "minimum_with_index": ('''
@triton.jit
def minimum_with_index(a_value, a_index, b_value, b_index):
    # the smaller value (NaN first); on a tie, the smaller index (torch.argmin's rule)
    mask = a_value < b_value
    equal = a_value == b_value
    if a_value.dtype.is_floating():
        a_nan = a_value != a_value
        b_nan = b_value != b_value
        mask = mask | (a_nan & (b_nan == 0))
        equal = equal | (a_nan & b_nan)
    mask = mask | (equal & (a_index < b_index))
    return tl.where(mask, a_value, b_value), tl.where(mask, a_index, b_index)
''', ()),
    "maximum_with_index": ('''
@triton.jit
def maximum_with_index(a_value, a_index, b_value, b_index):
    # the larger value (NaN first); on a tie, the smaller index (torch.argmax's rule)
    mask = a_value > b_value
    equal = a_value == b_value
    if a_value.dtype.is_floating():
        a_nan = a_value != a_value
        b_nan = b_value != b_value
        mask = mask | (a_nan & (b_nan == 0))
        equal = equal | (a_nan & b_nan)
    mask = mask | (equal & (a_index < b_index))
    return tl.where(mask, a_value, b_value), tl.where(mask, a_index, b_index)
''', ()),
    "min_with_index": ('''
@triton.jit
def min_with_index(value, index, dim):
    return tl.reduce((value, index), dim, minimum_with_index)
''', ("minimum_with_index",)),
    "max_with_index": ('''
@triton.jit
def max_with_index(value, index, dim):
    return tl.reduce((value, index), dim, maximum_with_index)
''', ("maximum_with_index",)),
    "welford_reduce": ('''
@triton.jit
def welford_reduce(value, mean, m2, weight, first_iteration):
    # one more value into each lane's running mean and sum of squared deviations
    if first_iteration:
        new_weight = tl.full(weight.shape, 1, weight.dtype)
        new_mean = value
        new_m2 = tl.zeros_like(m2)
    else:
        delta = value - mean
        new_weight = weight + 1
        new_mean = mean + delta / new_weight
        new_m2 = m2 + delta * (value - new_mean)
    return new_mean, new_m2, new_weight
''', ()),
    "welford_combine": ('''
@triton.jit
def welford_combine(mean_1, m2_1, weight_1, mean_2, m2_2, weight_2):
    # two partial (mean, m2, count) into one (Chan et al.'s pairwise update)
    delta = mean_2 - mean_1
    new_weight = weight_1 + weight_2
    w2_over_w = tl.where(new_weight == 0.0, 0.0, weight_2 / new_weight)
    return (mean_1 + delta * w2_over_w,
            m2_1 + m2_2 + delta * delta * weight_1 * w2_over_w,
            new_weight)
''', ()),
    "welford": ('''
@triton.jit
def welford(mean, m2, weight, dim):
    return tl.reduce((mean, m2, weight), dim, welford_combine)
''', ("welford_combine",)),
    "online_softmax_combine": ('''
@triton.jit
def online_softmax_combine(lhs_max, lhs_sum, rhs_max, use_fast_math: tl.constexpr):
    # running (max, sum of exp(x - max)) with one more value; -inf maxima give 0 deltas, not NaN
    out_max = maximum(lhs_max, rhs_max)
    lhs_delta = tl.where(out_max == float("-inf"), 0.0, lhs_max - out_max)
    rhs_delta = tl.where(out_max == float("-inf"), 0.0, rhs_max - out_max)
    out_sum = lhs_sum * libdevice.exp(lhs_delta) + libdevice.exp(rhs_delta)
    return out_max, out_sum
''', ("maximum",)),
    "online_softmax_reduce": ('''
@triton.jit
def online_softmax_reduce(lhs_max, lhs_sum, dim, use_fast_math: tl.constexpr):
    # the lanes' running (max, sum) into one per row
    out_max = max2(lhs_max, dim)
    out_max_keepdim = tl.expand_dims(out_max, dim)
    delta = tl.where(out_max_keepdim == float("-inf"), 0.0, lhs_max - out_max_keepdim)
    out_sum = tl.sum(lhs_sum * libdevice.exp(delta), dim)
    return out_max, out_sum
''', ("max2",)),
    "promote_to_tensor": ('''
@triton.jit
def promote_to_tensor(x):
    return x + tl.zeros((1,), tl.int1)
''', ()),
}


def closure(names: set[str]) -> list[str]:
    """The helpers `names` need, each after the ones it calls."""
    out: list[str] = []

    def visit(name: str) -> None:
        if name in out:
            return
        for dep in HELPERS[name][1]:
            visit(dep)
        out.append(name)

    for n in sorted(names):
        visit(n)
    return out


def uses_libdevice(names: list[str]) -> bool:
    return any("libdevice." in HELPERS[n][0] for n in names)
