"""Registers the whole plugin with fairseq (fairseq's ``--user-dir`` import reaches it through this
folder): the fairseq patches of ``compat``, the attention variants, criterions, tasks, then every model
and architecture of this folder."""

from .. import compat

compat.install()

from .. import attention, criterions, tasks  # noqa: E402,F401
from .._autoimport import import_all  # noqa: E402

import_all(__name__, __file__)
