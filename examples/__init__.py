"""Runnable training scripts (run them as files, not imports).

Installed as ``xl.examples`` too, so ``xl demo`` finds ``train.py`` from a wheel as well as from
a checkout.
"""
