"""A composed hybrid built from HF transformers' own modules: the correctness oracle of
HybridSGLForCausalLM and a trainable nn.Module whose saved checkpoints the runtime serves."""

from hybrid_sgl.reference.model import HybridSGLReference, load_reference

__all__ = ["HybridSGLReference", "load_reference"]
