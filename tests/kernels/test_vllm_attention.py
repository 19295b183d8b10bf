"""The vllm attention backend (vLLM's Triton unified_attention on our pool) vs our kernels.

Skipped unless vLLM is importable: a real install, or `bash bench/vendor_vllm_attention.sh`
(the extract in .vllm_min/ is put on sys.path here when present).
"""

import os
import sys
from pathlib import Path

import pytest
import torch

from tests.kernels.test_paged_attention import DEVICE, check, decode_kwargs, make_case
from triton_kernels import paged_attention as pa
from triton_kernels import paged_decode as pd

VLLM_MIN = Path(__file__).resolve().parents[2] / ".vllm_min"
if VLLM_MIN.is_dir() and str(VLLM_MIN) not in sys.path:
    sys.path.append(str(VLLM_MIN))


def _import_backend():
    if torch.cuda.is_available():
        return pytest.importorskip("triton_kernels.vllm_attention", exc_type=ImportError)
    # Without a GPU, vLLM disables Triton unless CUDA_VISIBLE_DEVICES is empty (its
    # distributed-init case); the interpreter needs no driver.
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        return pytest.importorskip("triton_kernels.vllm_attention", exc_type=ImportError)
    finally:
        if saved is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


va = _import_backend()
# vLLM's kernel runs float32 dots in TF32 on the GPU (ours use exact dots there): compare at fp16 tolerance.
FP32_TOL = torch.float16 if torch.cuda.is_available() else torch.float32


@pytest.mark.parametrize("page_size,hkv,group,d", [(4, 2, 2, 32), (16, 1, 4, 16)])
def test_extend_matches_ours(page_size, hkv, group, d):
    kw, _ = make_case(prefix_lens=[5, 0, 9], new_lens=[3, 20, 1], page_size=page_size, hkv=hkv, group=group,
                      d=d, seed=d)
    check(va.vllm_attention_extend(**kw), pa.paged_attention_extend(**kw), FP32_TOL)


@pytest.mark.parametrize("split_k", [None, True, False])
def test_decode_matches_ours(split_k):
    kw, _ = make_case(prefix_lens=[40, 0, 17], new_lens=[1, 1, 1], page_size=4, hkv=2, group=2, d=24, seed=2)
    kw = decode_kwargs(kw)
    cu = torch.arange(4, dtype=torch.int32, device=DEVICE)
    out = va._unified(**kw, cu_seqlens_q=cu, max_seqlen_q=1, split_k=split_k)
    check(out, pd.paged_attention_decode(**kw), FP32_TOL)
    if split_k is None:
        check(va.vllm_attention_decode(**kw), out, FP32_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,length", [(1, 32768), (64, 1000)])
def test_gpu_decode_real_shapes(batch, length):
    kw, _ = make_case(prefix_lens=[length - 1 - 5 * i for i in range(batch)], new_lens=[1] * batch,
                      page_size=16, hkv=4, group=4, d=256, dtype=torch.bfloat16, seed=batch)
    kw = decode_kwargs(kw)
    check(va.vllm_attention_decode(**kw), pd.paged_attention_decode(**kw), torch.bfloat16)


@pytest.mark.gpu
def test_gpu_extend_real_shapes():
    kw, _ = make_case(prefix_lens=[0, 1000], new_lens=[500, 129], page_size=16, hkv=4, group=4, d=256,
                      dtype=torch.bfloat16, seed=4)
    check(va.vllm_attention_extend(**kw), pa.paged_attention_extend(**kw), torch.bfloat16)
