"""hybrid_sgl: an SGLang-style serving runtime for hybrid LLMs."""

from hybrid_sgl.version import __version__

__all__ = ["Engine", "ServerArgs", "__version__"]


def __getattr__(name):  # keep `import hybrid_sgl` light; torch loads on first use
    if name == "Engine":
        from hybrid_sgl.engine import Engine

        return Engine
    if name == "ServerArgs":
        from hybrid_sgl.server_args import ServerArgs

        return ServerArgs
    raise AttributeError(name)
