"""keras_yoso.models: small ready-made models built from keras_yoso.layers."""

from keras_yoso.models.causal_lm import CausalLM

__all__ = ["CausalLM"]
