"""Import every module of a sub-package, the way fairseq discovers models/tasks/criterions.

Used so that ``import bet_fairseq`` registers everything, under the same module names that
fairseq's ``--user-dir`` import uses (a second import is then a no-op, never a duplicate).
"""

import importlib
import os


def import_all(package_name: str, package_file: str):
    folder = os.path.dirname(package_file)
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith(("_", ".")):
            continue
        if name.endswith(".py") or (os.path.isdir(path) and os.path.exists(os.path.join(path, "__init__.py"))):
            importlib.import_module(f"{package_name}.{name[:-3] if name.endswith('.py') else name}")
