"""Run a bench script with module-level switches set first, in the same process, so that one call can time
the served code against a prepared variant without editing it.

    PYTHONPATH=. python bench/with_flags.py triton_kernels.gdn_recurrent.NORM_BY_LAST_PROGRAM_MAX_ROWS=0 -- \
        bench/offline.py --config ...

Each switch is MODULE.NAME=VALUE; VALUE is read as a Python literal (1 / True / 0.5 / 'text').
"""

import ast
import importlib
import runpy
import sys


def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv:
        raise SystemExit(__doc__)
    cut = argv.index("--")
    switches, (script, *script_args) = argv[:cut], argv[cut + 1:]
    for switch in switches:
        target, value = switch.split("=", 1)
        module_name, name = target.rsplit(".", 1)
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            raise SystemExit(f"{module_name} has no {name}")
        setattr(module, name, ast.literal_eval(value))
        print(f"# {module_name}.{name} = {getattr(module, name)!r}", flush=True)
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
