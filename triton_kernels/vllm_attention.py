"""vLLM's Triton `unified_attention` run directly on our paged pool (same layout, no copies).

Same keyword signatures as `paged_attention_extend` / `paged_attention_decode`. Works with a real
vLLM install, or with the few pure-Python modules the kernel needs extracted by
`bench/vendor_vllm_attention.sh` into `.vllm_min/` and put on `sys.path` (PYTHONPATH). vLLM's
CUDA platform module loads a compiled library, so when that module is absent a small stand-in
platform is installed before the import. Importing this module raises ImportError when vLLM (or
a Triton driver it accepts) is not available; the backend registry reads that as "unavailable".
"""

import importlib.util

import torch

from triton_kernels.host_math import next_power_of_2


def _stand_in_platform():
    """A CUDA platform object answering what the kernel's module asks (fp8 dtype, capability)."""
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class CudaStandIn(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability | None:
            if not torch.cuda.is_available():
                return None
            return DeviceCapability(*torch.cuda.get_device_capability(device_id))

        @classmethod
        def is_pin_memory_available(cls) -> bool:
            return torch.cuda.is_available()

    return CudaStandIn()


def _import_unified_attention():
    try:
        import vllm.platforms as platforms
    except ImportError as e:
        raise ImportError("vLLM is not importable: install vllm, or run bench/vendor_vllm_attention.sh "
                          "and put .vllm_min on PYTHONPATH") from e
    if platforms._current_platform is None and importlib.util.find_spec("vllm.platforms.cuda") is None:
        platforms._current_platform = _stand_in_platform()
    from vllm.triton_utils.importing import HAS_TRITON

    if not HAS_TRITON:
        raise ImportError("vLLM found no Triton driver it accepts here (no GPU?), so its kernels are stubs")
    from vllm.v1.attention.ops import triton_unified_attention as ua

    return ua


_ua = _import_unified_attention()

NUM_SEGMENTS = 16  # vLLM's NUM_PAR_SOFTMAX_SEGMENTS for its split-K (3D) path
MIN_GRID_2D = 128  # vLLM's MIN_LAUNCH_GRID_SIZE_2D: below B * Hkv programs it prefers split-K


def _unified(*, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, max_seqlen_q: int,
             split_k: bool | None = None) -> torch.Tensor:
    """One unified_attention call. split_k: None = vLLM's own choice (split-K when fewer than
    128 / Hkv requests), True = always the 3D split-K path (query length <= 8), False = 2D."""
    t, hq, d = q.shape
    _, page_size, hkv, _ = k_cache.shape
    b = seq_lens.shape[0]
    o = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t == 0 or b == 0:
        return o
    threshold = MIN_GRID_2D // hkv if split_k is None else (1 << 30 if split_k else 0)
    d_pad = next_power_of_2(d)
    may_split = split_k is True or (split_k is None and b <= threshold)
    rows = t if may_split and max_seqlen_q <= _ua.MAX_3D_QUERY_LEN else 0  # split-K scratch, per token
    segm_o = torch.empty((rows, hq, NUM_SEGMENTS, d_pad), dtype=torch.float32, device=q.device)
    segm_max = torch.empty((rows, hq, NUM_SEGMENTS), dtype=torch.float32, device=q.device)
    segm_sum = torch.empty((rows, hq, NUM_SEGMENTS), dtype=torch.float32, device=q.device)
    _ua.unified_attention(
        q=q, k=k_cache, v=v_cache, out=o, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
        seqused_k=seq_lens, max_seqlen_k=block_table.shape[1] * page_size, softmax_scale=scale,
        causal=True, window_size=(-1, -1), block_table=block_table, softcap=0, q_descale=None,
        k_descale=None, v_descale=None, seq_threshold_3D=threshold, num_par_softmax_segments=NUM_SEGMENTS,
        softmax_segm_output=segm_o, softmax_segm_max=segm_max, softmax_segm_expsum=segm_sum,
    )
    return o


def vllm_attention_extend(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """As paged_attention_extend. q: [T, Hq, D] (last dim contiguous); returns [T, Hq, D].
    The longest query run is bounded by T (no device sync); vLLM uses it only to pick 2D vs 3D."""
    return _unified(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, cu_seqlens_q=cu_seqlens_q,
                    seq_lens=seq_lens, scale=scale, max_seqlen_q=q.shape[0])


def vllm_attention_decode(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """As paged_attention_decode. q: [B, Hq, D]; returns [B, Hq, D]."""
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return _unified(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, cu_seqlens_q=cu,
                    seq_lens=seq_lens, scale=scale, max_seqlen_q=1)
