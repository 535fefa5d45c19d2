"""The example's runtime: command line, config loading, the local and Horovod
contexts, the training loop, checkpoints, logs, the watchdog and inference.

The model itself is built from the Texar-style blocks in texar_lite/.
"""
