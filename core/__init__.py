"""What the data, the fault layer and the runtime share, below all three:
`errors` (the user-fixable errors and their exit statuses), `callbacks` (the
step-callback interface the loop calls and the fault layer implements),
`atomic_files` (files replaced whole) and `hosts` (this machine's addresses
and identity). Nothing here imports TensorFlow, Horovod or the packages above.
"""
