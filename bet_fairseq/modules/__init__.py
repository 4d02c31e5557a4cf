from .bird_eye_attention import ATTENTION_MODES, BirdEyeMultiheadAttention  # noqa: F401
from .bird_eye_config import BirdEyeAttentionConfig  # noqa: F401
from .bird_eye_decoder import (  # noqa: F401
    BirdEyeDecoderLayer,
    BirdEyeTransformerDecoder,
    bird_eye_self_attentions,
)
