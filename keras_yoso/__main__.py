"""`python -m keras_yoso`: prints the environment report (`keras_yoso.show_config()`) for a bug report."""

from keras_yoso._environment import show_config

show_config()
