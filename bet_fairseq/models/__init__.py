from .bet_transformer import BirdEyeTransformerModel  # noqa: F401
from .bet_transformer_lm import BirdEyeTransformerLanguageModel  # noqa: F401
