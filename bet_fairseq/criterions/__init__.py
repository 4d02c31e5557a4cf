from .._autoimport import import_all

import_all(__name__, __file__)
