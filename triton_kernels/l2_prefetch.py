"""Asking L2 for bytes a later kernel (or a later step of this one) will read: a hint in inline PTX
(`prefetch.global.L2`), one 128-byte line per lane. It returns nothing and changes no value any load
reads. CUDA only: the interpreter cannot run inline PTX, so callers turn it off there."""

import triton
import triton.language as tl

LINE = 128


def lines_per_share(nbytes: int, parts: int) -> int:
    """The LINES constexpr of prefetch_l2 when nbytes are split between `parts` programs."""
    return triton.next_power_of_2(triton.cdiv(nbytes, parts * LINE))


@triton.jit
def prefetch_l2(base, nbytes, part, parts, LINES: tl.constexpr):
    """Share `part` of `parts` of the nbytes from base, one line per lane (LINES lanes cover a share;
    the spare ones repeat its last line)."""
    share = tl.cdiv(tl.cdiv(nbytes, parts), 128) * 128
    o = part.to(tl.int64) * share + tl.minimum(tl.arange(0, LINES) * 128, share - 1)
    p = base.to(tl.pointer_type(tl.int8)) + tl.minimum(o, nbytes - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [p], dtype=tl.int32,
                              is_pure=False, pack=1)
