"""keras_yoso.models: small ready-made models built from keras_yoso.layers, and the check of their
token ids."""

from keras_yoso.models.causal_lm import CausalLM
from keras_yoso.models.token_ids import check_token_ids

__all__ = ["CausalLM", "check_token_ids"]
