"""Serving-shaped kernels. Each op file holds the Triton kernel(s), the launcher, and a
PyTorch reference with the same keyword signature (`<op>_ref`), which is also the `torch`
backend on CPU."""
